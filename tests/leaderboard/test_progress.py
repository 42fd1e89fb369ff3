"""The re-evaluation's progress (leaderboard/progress.py): silent unless asked; off a terminal the
note once and one line per finished entry with the count and the time left; on a terminal a bar."""
from __future__ import annotations

import io

from rich.console import Console

from tmem_bench.leaderboard import progress as progress_module
from tmem_bench.leaderboard.progress import ReevalProgress


def console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=80), out


def test_durations_read_as_minutes_then_hours():
    assert [progress_module._duration(s) for s in (0, 59.4, 61, 3599, 3600, 3725)] == [
        "0:00", "0:59", "1:01", "59:59", "1:00:00", "1:02:05"]


def test_off_a_terminal_the_note_once_then_a_line_per_entry(capsys, monkeypatch):
    clock = iter([100.0, 100.0, 130.0, 160.0])  # made, entered, then the time asked at each entry's line
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: next(clock))
    con, out = console(False)
    with ReevalProgress(4, show=True, note="re-evaluating 4 cells, once per machine", console=con) as p:
        assert p.left() == "?"  # no pace before the first cell
        p.cell("tiny-base", "abc")
        p.advance()
        p.entry_done("tiny-base", 1, 12.4)
        p.advance()
        p.entry_done("tiny-lstm", 1, 3.0)
    assert out.getvalue() == "re-evaluating 4 cells, once per machine\n"
    assert capsys.readouterr().err.splitlines() == [
        "1/4 cells, 1:30 left: tiny-base re-evaluated (1 cells in 12 s)",  # 30 s a cell so far, 3 cells left
        "2/4 cells, 1:00 left: tiny-lstm re-evaluated (1 cells in 3 s)",
    ]
    assert (p.done, p.total) == (2, 4)


def test_not_shown_it_only_counts(capsys):
    con, out = console(False)
    with ReevalProgress(2, show=False, note="a note", console=con) as p:
        p.advance()
        p.entry_done("tiny-base", 1, 1.0)
    assert p.done == 1 and out.getvalue() == "" and capsys.readouterr().err == ""


def test_nothing_to_re_evaluate_shows_nothing(capsys):
    con, out = console(True)
    with ReevalProgress(0, show=True, note="a note", console=con) as p:
        pass
    assert p._bar is None and out.getvalue() == "" and capsys.readouterr().err == ""


def test_on_a_terminal_a_bar_and_no_lines(capsys):
    con, out = console(True)
    with ReevalProgress(3, show=True, note="a note", console=con) as p:
        assert p._bar is not None
        p.cell("tiny-base", "abc123")
        p.advance()
        p.entry_done("tiny-base", 1, 1.0)
        assert p._bar.tasks[0].completed == 1 and p._bar.tasks[0].description == "tiny-base abc123"
    assert "a note" in out.getvalue() and capsys.readouterr().err == ""  # the count is the bar's, not a line's
