"""The progress of a re-evaluation, on stderr: a bar on a terminal, one line per entry off one.

A first validation on a fresh clone re-evaluates every published cell, which takes minutes, so it
says first what it is about to do and that it happens once per machine, and then keeps the count
and the time left in sight: on a terminal they come first, where an 80-column line cannot cut them
(the entry and cell being evaluated come last, and are what is cut); in a log, each entry that
finishes prints one line with the same count and time left.
"""
from __future__ import annotations

import sys
import time


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


class ReevalProgress:
    """Counts cells re-evaluated out of `cells`; with `show`, tells `note` once and then the progress."""

    def __init__(self, cells: int, show: bool = False, note: str | None = None, console=None):
        self.total, self.done = cells, 0
        self._show = show and cells > 0
        self._note = note
        self._bar = None
        self._start = time.perf_counter()
        if not self._show:
            return
        from rich.console import Console

        self._console = console or Console(stderr=True)
        if self._console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
            from rich.table import Column

            self._bar = Progress(MofNCompleteColumn(), TextColumn("cells,"), TimeRemainingColumn(), TextColumn("left"),
                                 BarColumn(bar_width=16),
                                 TextColumn("{task.description}", table_column=Column(ratio=1, no_wrap=True,
                                                                                       overflow="ellipsis")),
                                 console=self._console, transient=True, expand=True)
            self._task = self._bar.add_task("", total=cells)

    def __enter__(self) -> ReevalProgress:
        if self._show and self._note:
            self._console.print(self._note, highlight=False, markup=False, soft_wrap=not self._console.is_terminal)
        if self._bar is not None:
            self._bar.start()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def cell(self, entry: str, cell_id: str) -> None:
        """About to re-evaluate `cell_id` of `entry`."""
        if self._bar is not None:
            self._bar.update(self._task, description=f"{entry} {cell_id}")

    def advance(self) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.advance(self._task)

    def left(self) -> str:
        """The time left at the pace so far, or "?" before the first cell."""
        if not self.done:
            return "?"
        elapsed = time.perf_counter() - self._start
        return _duration(elapsed / self.done * (self.total - self.done))

    def entry_done(self, entry: str, cells: int, seconds: float) -> None:
        """Off a terminal, one line: the count, the time left, and the entry that finished."""
        if self._show and self._bar is None:
            print(f"{self.done}/{self.total} cells, {self.left()} left: {entry} re-evaluated ({cells} cells in "
                  f"{seconds:.0f} s)", file=sys.stderr, flush=True)
