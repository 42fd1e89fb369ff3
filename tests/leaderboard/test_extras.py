"""Without the popgym extra, the committed POPGym entries are not bad entries: validate, build and show
say once per entry that they cannot be checked here and what to install, count entries rather than
lines, and exit with a code of their own (issue 57); validate tells each entry's verdict as it goes."""
from __future__ import annotations

import shutil
import sys

import pytest

from tests.helpers import ROOT
from tests.leaderboard.helpers import cells, entry_path
from tmem_bench.cli import main
from tmem_bench.errors import MissingExtra
from tmem_bench.registry import BUILTIN_TASKS, OPTIONAL_TASKS, TASKS, Registry

EXTERNAL = ("tmem-bench-external-base", "tmem-bench-external-lstm")
SAID = "cannot be checked without the popgym extra: pip install -e '.[popgym]'"


@pytest.fixture
def without_popgym(monkeypatch):
    """The task registry as a machine without the popgym extra builds it, whether or not it is installed here."""
    monkeypatch.setitem(sys.modules, "popgym", None)
    fresh = Registry("task", BUILTIN_TASKS, entry_point_group="tmem_bench.tasks", optional=OPTIONAL_TASKS)
    for name, value in vars(fresh).items():
        monkeypatch.setattr(TASKS, name, value)
    assert "popgym_repeat_first" not in TASKS and TASKS.extra_of("popgym_repeat_first") == "popgym"


@pytest.fixture
def mixed(board):
    """The test board (tiny-base, tiny-lstm) with two committed POPGym entries beside them."""
    for slug in EXTERNAL:
        shutil.copytree(ROOT / "leaderboard" / "entries" / slug, board / "entries" / slug)
    return board


@pytest.mark.parametrize("terminal", ["0", "1"])
def test_validate_without_the_extra_names_it_once_per_entry_and_tells_each_verdict_as_it_goes(
        mixed, without_popgym, monkeypatch, capsys, terminal):
    monkeypatch.setenv("TTY_COMPATIBLE", terminal)  # rich's progress: a live bar on a terminal, lines off one
    monkeypatch.setenv("COLUMNS", "400")  # rich would fold the lines looked for
    checks = sys.modules["tmem_bench.leaderboard.validate"]
    real, printed = checks.validate_entry, []

    def spy(entry_dir, *args, **kwargs):
        captured = capsys.readouterr()
        printed.append((entry_dir.name, captured.out + captured.err))
        return real(entry_dir, *args, **kwargs)

    monkeypatch.setattr(checks, "validate_entry", spy)
    assert main(["leaderboard", "validate", str(mixed)]) == MissingExtra.exit_code == 3
    captured = capsys.readouterr()
    printed.append(("end", captured.out + captured.err))
    slugs = [slug for slug, _ in printed]
    assert slugs == ["tiny-base", "tiny-lstm", *EXTERNAL, "end"]
    so_far = ""
    for i, (slug, text) in enumerate(printed[1:], 1):
        so_far += text
        before = slugs[i - 1]  # its verdict is out before the next entry is looked at
        assert before in so_far, (slug, so_far)
    for slug in EXTERNAL:
        assert so_far.count(f"not checked: {slug}: {SAID}") == 1, so_far
    assert "unknown task" not in so_far and "rejected" not in so_far.replace("0 rejected", "")
    assert captured.out.strip().splitlines()[-1] == "2 entries valid, 0 rejected, 2 not checked (an optional extra " \
                                                     "is not installed)"


def test_validate_counts_rejected_entries_not_their_lines_and_a_rejection_outranks_a_missing_extra(
        mixed, without_popgym, capsys):
    for path in cells(mixed)[:2]:  # two reasons, one entry
        path.unlink()
    assert main(["leaderboard", "validate", str(mixed)]) == 1
    captured = capsys.readouterr()
    assert captured.err.count("rejected: tiny-base: cells:") == 2, captured.err
    assert "1 entry valid, 1 rejected, 2 not checked" in captured.out


def test_build_without_the_extra_writes_no_board_and_says_what_to_install(mixed, without_popgym, capsys):
    assert main(["leaderboard", "build", "--leaderboard", str(mixed)]) == 3
    err = capsys.readouterr().err
    assert err.count(SAID) == 2 and "board not written: install the extras named above" in err, err
    assert not (mixed / "index.html").exists()


def test_show_without_the_extra_is_one_line_saying_what_to_install(mixed, without_popgym, capsys):
    assert main(["leaderboard", "show", str(entry_path(mixed, EXTERNAL[0]))]) == 3
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [f"tmem-bench: error: {EXTERNAL[0]}: {SAID}"]
    assert captured.out == ""
