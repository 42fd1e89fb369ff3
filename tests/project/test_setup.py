"""The README's test command is what CI runs (issue 57: it installed ".[test]" while .ci/run installed
".[test,ray,slurm,popgym]", so CI was green and a newcomer's first pytest red), and the docs name
every extra pyproject.toml declares."""
from __future__ import annotations

import re
import shlex
import tomllib

from tests.helpers import ROOT


def commands(text: str) -> list[list[str]]:
    """Each shell command of `text` as words, split at newlines, `&&` and `;` (comments dropped)."""
    out = []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        for part in re.split(r"&&|;", line.split(" #")[0]):
            words = shlex.split(part, comments=True)
            if words:
                out.append(words)
    return out


def installs_and_tests(text: str) -> list[list[str]]:
    """The pip installs and the pytest run, in order, without pip's output flags."""
    quiet = {"-q", "-qq", "--quiet"}
    return [[w for w in words if w not in quiet] for words in commands(text)
            if words[:2] == ["pip", "install"] or words[0] == "pytest"]


def readme_test_command() -> str:
    """The README's fenced command that runs the tests."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    (block,) = [b for b in blocks if any(words[0] == "pytest" for words in commands(b))]
    return block


def test_the_readme_installs_and_tests_exactly_what_ci_does():
    readme = installs_and_tests(readme_test_command())
    ci = installs_and_tests((ROOT / ".ci" / "run").read_text())
    assert readme == ci, f"README's test command {readme} differs from .ci/run's {ci}"
    assert ci[-1] == ["pytest"] and any(w.startswith(".[test") for words in ci for w in words)


def test_the_comparison_fails_when_the_extras_differ():
    ci = (ROOT / ".ci" / "run").read_text()
    assert installs_and_tests(ci) != installs_and_tests(ci.replace(",popgym]", "]"))
    assert installs_and_tests("pip install -q torch==1 && pytest") == [["pip", "install", "torch==1"], ["pytest"]]


def test_the_install_docs_name_every_extra():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    install = (ROOT / "docs" / "running.md").read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in extras if f"`.[{name}]`" not in install]
    assert not missing, f"docs/running.md's Install section does not name the extras {missing}"
