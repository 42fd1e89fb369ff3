"""The docs cannot drift from the code: every `tmem-bench` command they show parses with the
installed command line, and the cheap ones run (with a tiny budget)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tmem_bench.cli import build_parser, main

SUBCOMMANDS = ("run", "jobs", "report", "list", "check", "leaderboard", "probe", "validity")
ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def shown_commands() -> list[tuple[str, str]]:
    """(page, command) for each `tmem-bench` command in a fenced shell block, or in an inline code
    span that names a subcommand (others, such as an entry's name "tmem-bench study (LABEL)", are prose)."""
    found, inline = [], []
    for page in PAGES:
        text = page.read_text()
        for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                for part in line.split(" #")[0].split("&&"):
                    found.append((page.name, part.strip()))
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        inline += [(page.name, span.strip()) for span in re.findall(r"`([^`\n]+)`", prose)]
    subcommands = "|".join(SUBCOMMANDS)
    return ([(name, cmd) for name, cmd in found if re.match(r"(\w+=\S+ )*tmem-bench \w", cmd)]
            + [(name, cmd) for name, cmd in inline if re.match(rf"(\w+=\S+ )*tmem-bench ({subcommands})\b", cmd)])


def argv(command: str) -> list[str]:
    """The arguments after `tmem-bench`, optional parts (`[--flag VALUE]`) left out."""
    # A shell substitution, $(...), gives arguments only a shell can know: left out too.
    words = shlex.split(re.sub(r"\$\([^)]*\)|\[[^\]]*\]", "", command))
    while "=" in words[0]:  # an environment variable set for the command
        words.pop(0)
    return words[1:]


COMMANDS = shown_commands()


def test_the_pages_show_commands():
    assert len(COMMANDS) > 30 and {name for name, _ in COMMANDS} >= {"README.md", "running.md", "leaderboard.md"}


@pytest.mark.parametrize("page,command", COMMANDS, ids=[f"{n}:{c[:60]}" for n, c in COMMANDS])
def test_every_shown_command_parses(page, command):
    if len(argv(command)) == 1:  # prose naming a subcommand, e.g. "`tmem-bench run` ends by ..."
        assert argv(command)[0] in SUBCOMMANDS, f"{page}: `{command}` names no subcommand"
        return
    try:
        build_parser().parse_args(argv(command))
    except SystemExit as e:
        pytest.fail(f"{page}: `{command}` does not parse with the installed command line (exit {e.code})")


def test_the_subcommands_are_the_command_lines():
    (sub,) = [a for a in build_parser()._actions if a.dest == "command"]
    assert set(sub.choices) == set(SUBCOMMANDS)


def test_the_parse_check_can_fail():
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv("tmem-bench run coordinate_binding --stepz 3"))


CHEAP = "tmem-bench run coordinate_binding --models base --level n_writes=5,10 --seeds 3 --steps 500"


def test_the_cheap_shown_commands_run(tmp_path, capsys):
    shown = {command for _, command in COMMANDS}
    assert "tmem-bench list" in shown and CHEAP in shown
    assert main(argv("tmem-bench list")) == 0
    assert "coordinate_binding" in capsys.readouterr().out
    run = tmp_path / "run"
    # The shown run, with a tiny budget: two steps, one seed.
    assert main([*argv(CHEAP), "--seeds", "1", "--steps", "2", "--out", str(run)]) == 0
    assert (run / "report.md").is_file() and len(list((run / "cells").glob("*.json"))) == 4  # two levels, two variants
    assert main(["report", str(run)]) == 0


def test_every_relative_link_of_the_pages_exists():
    missing = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://")) and not (page.parent / target).exists():
                missing.append(f"{page.name} -> {target}")
    assert not missing, missing
