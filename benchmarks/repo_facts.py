"""Sizes and counts the docs state about the repository, computed from it, so that they are never
typed by hand (docs said 113 MB and 21 entries for a board of 138 MB and 28).

    python benchmarks/repo_facts.py          # print each fact, and each place the docs state one that differs
    python benchmarks/repo_facts.py --write  # set every stated fact in the docs to what is computed

A doc states a fact between markers, `<!-- fact:NAME -->VALUE<!-- /fact -->`, which Markdown does not
show; tests/project/test_repo_facts.py fails when a stated value is not the computed one."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FACT = re.compile(r"<!-- fact:(\w+) -->(.*?)<!-- /fact -->")


def _git(root: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(["git", "-C", str(root), *args], input=stdin, capture_output=True, text=True,
                          check=True).stdout


def board_files(root: Path) -> list[Path]:
    return [root / p for p in _git(root, "ls-files", "-z", "leaderboard").split("\0") if p]


def history_bytes(root: Path) -> int | None:
    """Compressed bytes of every object HEAD's history holds: about what a clone's .git weighs. None in
    a shallow clone, whose history is not all here."""
    if _git(root, "rev-parse", "--is-shallow-repository").strip() == "true":
        return None
    shas = "".join(line.split(" ", 1)[0] + "\n" for line in _git(root, "rev-list", "--objects", "HEAD").splitlines())
    return sum(int(n) for n in _git(root, "cat-file", "--batch-check=%(objectsize:disk)", stdin=shas).split())


def compute(root: Path = ROOT) -> dict[str, str]:
    """Fact name -> the text the docs state; a fact that cannot be computed here is left out."""
    files = board_files(root)
    facts = {
        "board_entries": str(sum(p.name == "entry.json" and p.parent.parent.name == "entries" for p in files)),
        # Whole MB: a cell file more or less moves it by well under one.
        "board_mb": f"{sum(p.stat().st_size for p in files if p.is_file()) / 1e6:.0f} MB",
    }
    history = history_bytes(root)
    if history is not None:
        # To 10 MB: packing differs a few MB between this repository and a fresh clone of it.
        facts["clone_git_mb"] = f"about {round(history / 1e7) * 10} MB"
    return facts


def doc_files(root: Path = ROOT) -> list[Path]:
    return sorted((root / "docs").glob("*.md"))


def stated(text: str) -> list[tuple[str, str]]:
    """(name, value) of every fact a doc's text states."""
    return FACT.findall(text)


def stale(root: Path = ROOT) -> list[str]:
    """One line per stated fact that is not what `compute` gives, or names no fact."""
    facts, out = compute(root), []
    for path in doc_files(root):
        for name, value in stated(path.read_text()):
            if name not in facts and name != "clone_git_mb":
                out.append(f"{path.relative_to(root)}: unknown fact {name!r}")
            elif name in facts and value != facts[name] and not _close_enough(name, value, facts[name]):
                out.append(f"{path.relative_to(root)}: {name} is {facts[name]!r}, the doc says {value!r}")
    return out


# A clone's history weighs what its packing makes of it: a fresh clone and the repository it came
# from differ by a few MB, which can straddle a rounding boundary. Within this of the stated size
# the statement holds.
CLONE_TOLERANCE_MB = 10


def _close_enough(name: str, stated_value: str, computed: str) -> bool:
    if name != "clone_git_mb":
        return False
    numbers = [re.search(r"\d+", v) for v in (stated_value, computed)]
    return all(numbers) and abs(int(numbers[0][0]) - int(numbers[1][0])) <= CLONE_TOLERANCE_MB


def write(root: Path = ROOT) -> None:
    facts = compute(root)
    for path in doc_files(root):
        text = path.read_text()
        new = FACT.sub(lambda m: f"<!-- fact:{m[1]} -->{facts.get(m[1], m[2])}<!-- /fact -->", text)
        if new != text:
            path.write_text(new)


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        write()
    elif argv:
        print("usage: python benchmarks/repo_facts.py [--write]", file=sys.stderr)
        return 2
    for name, value in compute().items():
        print(f"{name}: {value}")
    problems = stale()
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
