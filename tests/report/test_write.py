"""write_report: report.md and figures/ regenerated from the cells alone, reproducibly, honouring the
umask, and never leaving a half-written report in place of a whole one."""
from __future__ import annotations

import os
import shutil

import pytest

from tests.report.helpers import RunBuilder
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


def test_report_is_reproducible(tmp_path):
    b = RunBuilder(tmp_path)
    for seed in range(3):
        b.cell("map_building", "tensor", seed, (16,), {(16,): 0.7 + 0.05 * seed, (32,): 0.6}, memory_off={(16,): 0.5},
               gates={"layer0": 0.6, "layer1": 0.4})
    first = write_report(tmp_path)
    md, svg = first.path.read_text(), (tmp_path / "figures" / "gates_map_building.svg").read_bytes()
    stale = tmp_path / "figures" / "accuracy_map_building_from_horizon99.png"
    stale.write_bytes(b"from an earlier report")
    write_report(tmp_path)
    assert not stale.exists()
    assert first.path.read_text() == md and (tmp_path / "figures" / "gates_map_building.svg").read_bytes() == svg
    assert not list((tmp_path / "figures").glob(".*"))  # no temporary files left behind


def test_a_failing_report_leaves_the_previous_one_whole(finished_run, tmp_path, monkeypatch):
    from tmem_bench.report import markdown, write_report

    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    run = tmp_path / "run"
    before = {p: p.read_bytes() for p in [run / "report.md", *sorted((run / "figures").iterdir())]}

    def broken(*args, **kwargs):
        raise RuntimeError("the markdown step failed")

    monkeypatch.setattr("tmem_bench.report.write.render_markdown", broken)
    assert markdown.render_markdown is not broken
    with pytest.raises(RuntimeError):
        write_report(run)
    after = {p: p.read_bytes() for p in [run / "report.md", *sorted((run / "figures").iterdir())]}
    assert after == before
    assert not [p for p in run.iterdir() if p.name.startswith(".report-")]
    assert os.listdir(run / "figures")
