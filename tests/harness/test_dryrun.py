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

    (out / "cells" / f"{plan.cells[0].id}.safetensors").unlink()  # as in a clone of a run committed without them
    assert main(args) == 0
    assert "2 cell(s) to run" in capsys.readouterr().out
    assert main(args + ["--keep-weightless"]) == 0
    assert "1 cell(s) to run" in capsys.readouterr().out


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


def test_a_run_tells_its_plan_and_estimate_before_it_trains(tmp_path, tiny_profile):
    import subprocess

    from tests.helpers import CLI

    (tmp_path / "tiny.toml").write_text(tiny_profile())
    # Both streams in one, in the order they were written: the estimate, then the progress of training.
    proc = subprocess.run(CLI + ["run", "coordinate_binding", "--profile", "tiny.toml", "--out", "run", "--no-report"],
                          cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout
    said = proc.stdout
    # Told once the run directory is this run's (a refusal comes first, alone): it exists by then.
    assert said.startswith("plan of coordinate_binding under profile tiny.toml: 1 cell; 0 already finished in run.\n")
    estimate, running = said.index("\nestimate: 1 cell(s) to run"), said.index("\nrunning 1 cell(s)")
    assert estimate < running and "wall time one after another in this process" in said[estimate:running]


def test_a_second_dry_run_reads_the_timings_the_first_measured(tmp_path, capsys, monkeypatch):
    from tmem_bench.cli import main

    monkeypatch.chdir(tmp_path)
    args = ["run", "coordinate_binding", "--models", "base", "--steps", "20", "--dry-run"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "measured here on cpu" in first and "kept in " in first
    assert main(args) == 0
    second = capsys.readouterr().out
    assert "from the step timings of cpu" in second and "measured here before" in second
    # The same numbers: every line but the one saying where they came from.
    assert [line for line in first.splitlines() if not line.startswith(("estimate:", "note: the load"))] == \
        [line for line in second.splitlines() if not line.startswith("estimate:")]
    assert first.split("(the longest cell")[0] == second.split("(the longest cell")[0]


def test_a_plug_in_is_not_run_to_estimate_and_a_failed_measurement_leaves_the_run_to_train(
        tmp_path, capsys, monkeypatch, tiny_profile):
    from tmem_bench.cli import main
    from tmem_bench.harness.estimate import MeasuredCost

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(tiny_profile())
    base = ["run", "coordinate_binding", "--profile", "tiny.toml", "--no-report"]
    # A plug-in's code runs in its cells only: it may hang or end the process it runs in.
    measured = []
    monkeypatch.setattr(MeasuredCost, "cost", lambda self, cell: measured.append(cell) or 1 / 0)
    assert main(base + ["--models", "tmem_bench.baselines.transformer:base", "--out", "plugin"]) == 0
    out = capsys.readouterr().out
    assert measured == [] and ("no estimate before training: the plan runs plug-in code "
                               "(tmem_bench.baselines.transformer:base); --dry-run measures it\n") in out
    assert main(base + ["--out", "builtin"]) == 0
    out = capsys.readouterr().out
    assert len(measured) == 1 and "no estimate before training: measuring a step raised ZeroDivisionError" in out
    assert "results: builtin/results.csv" in out
