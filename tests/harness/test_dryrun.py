"""`tmem-bench run --dry-run`: what it prints, that it writes nothing, and bad input in one line."""
import os

import torch

from tests.harness.helpers import finish
from tmem_bench.contracts.device import hardware
from tmem_bench.harness.plan import Overrides, plan_run


def _listing(root):
    return sorted((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in root.rglob("*"))


def test_dry_run_prints_and_writes_nothing(tmp_path, capsys, monkeypatch):
    from tmem_bench.cli import main

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    args = ["run", "coordinate_binding", "--models", "base", "--steps", "20", "--out", str(out), "--dry-run"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert not out.exists() and not (tmp_path / "runs").exists()
    assert "dry run of coordinate_binding under profile quick: 2 cells;" in text
    assert f"{out} does not exist yet" in text
    assert "coordinate_binding [standard]: 1 cell\n" in text and "coordinate_binding [block_queries=True]" in text
    assert "2 cell(s) to run" in text and "wall time one after another in this process" in text
    assert f"measured here on cpu ({hardware(torch.device('cpu'))}) with" in text

    plan = plan_run("coordinate_binding", "quick", Overrides(models=["base"], steps=20))
    finish(out, plan.cells[0])
    before = _listing(tmp_path)
    assert main(args + ["--executor", "local", "--workers", "2", "--cpus-per-cell", "1"]) == 0
    text = capsys.readouterr().out
    assert _listing(tmp_path) == before  # no lock, manifest, table or report
    assert f"1 already finished in {out}" in text and "1 cell(s) to run" in text
    assert "wall time on a local pool of 2 worker(s), 1 thread(s) each" in text


def test_dry_run_bad_input_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    from tmem_bench.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["run", "coordinate_binding", "--models", "nope", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'nope'" in err and len(err.strip().splitlines()) == 1
    assert os.listdir(tmp_path) == []


def test_dry_run_rows_name_steps_and_seeds(tmp_path, capsys, monkeypatch):
    from tmem_bench.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["run", "coordinate_binding", "--models", "base", "--seed-list", "0,3", "--steps", "7",
                 "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.strip().startswith("model"))
    assert header.split()[:5] == ["model", "training", "levels", "steps", "batch"]
    row = next(line for line in lines if line.strip().startswith("base"))
    assert row.split()[3:9] == ["7", "64", "0.001", "0,3", "2", "0"]
