"""write_report: report.md and figures/ regenerated from the cells alone, reproducibly, honouring the umask, and never leaving a half-written report in place of a whole one."""
from __future__ import annotations

import os

import pytest

from tmem_bench.report import write_report


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_report_figures_honour_the_umask(run, umask, mode):
    previous = os.umask(umask)
    try:
        write_report(run)
    finally:
        os.umask(previous)
    figures = sorted((run / "figures").iterdir())
    assert figures and {oct(p.stat().st_mode & 0o777) for p in figures} == {oct(mode)}
    assert oct((run / "report.md").stat().st_mode & 0o777) == oct(mode)
