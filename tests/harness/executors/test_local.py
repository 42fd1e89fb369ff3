"""The local process pool: the serial engine's numbers, a dry run that starts no pool, workers that
die with their driver (a rerun resumes to the same numbers), and a dead worker that fails only its cell."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.harness.executors.helpers import PLUGIN, numbers, partial_files, quiet, sweep_profile
from tmem_bench.cli import main
from tmem_bench.errors import UsageError
from tmem_bench.harness.executors import ENGINES, ExecutorOptions, LocalOptions, LocalPool, usable
from tmem_bench.harness.executors.base import available_cores
from tmem_bench.harness.plan import Overrides, make_plan
from tmem_bench.harness.results import read_cell
from tmem_bench.harness.rundir import RunDir
from tmem_bench.harness.runner import run_plan
from tmem_bench.registry import module_names


def test_a_local_process_pool_gives_the_serial_numbers(sweep, tmp_path):
    folder, cells, reference = sweep
    console = quiet()
    run_plan(cells, tmp_path / "run", device="cpu", console=console,
             executor=ExecutorOptions(kind="local", workers=2, cpus_per_cell=1))
    assert numbers(tmp_path / "run") == reference
    out = console.file.getvalue()
    assert "local pool of 2 worker(s), 1 thread(s) each" in out and out.count("done coordinate_binding") == 4
    assert {r["torch_threads"] for r in RunDir(tmp_path / "run").load_cells()[0]} == {1}
    assert json.loads((tmp_path / "run" / "jobs.json").read_text())["executor"] == "local"


def test_the_dry_run_sketch_sizes_the_pool_as_it_would_be_made(monkeypatch):
    import tmem_bench.harness.executors.local as local

    monkeypatch.setattr(local, "ProcessPoolExecutor", None)  # a sketch starts no process
    cores = available_cores()
    for o in (ExecutorOptions(kind="local"), ExecutorOptions(kind="local", workers=cores + 1, cpus_per_cell=2)):
        sketch = ENGINES["local"].sketch(usable(o), "cpu")
        pool = LocalPool(o.workers, o.cpus_per_cell, 0)
        assert (sketch.workers, sketch.threads) == (pool.workers, pool.threads)
        assert sketch.text == f"on a local pool of {pool.workers} worker(s), {pool.threads} thread(s) each"
    assert "exceed the" in sketch.note


def test_a_driver_killed_midway_resumes_to_the_same_numbers(tmp_path, monkeypatch):
    # The kill point is fixed, not raced: the held model's cells wait while the file TMEM_TEST_HOLD names
    # exists, so the driver dies with exactly base's two cells finished whatever the machine's load.
    (tmp_path / "held_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    profile = sweep_profile(tmp_path, '["base", { name = "held_plugin:model", label = "held" }]')
    with module_names(True):  # the test's own plug-in
        cells = make_plan("coordinate_binding", profile, Overrides(levels={"n_writes": [3]}))
        assert [c.label for c in cells] == ["base", "base", "held", "held"]  # base's cells reach the two workers first
        run_plan(cells, tmp_path / "serial", device="cpu", console=quiet(), executor=ExecutorOptions(cpus_per_cell=1))
    reference = numbers(tmp_path / "serial")

    command = [sys.executable, "-m", "tmem_bench.cli", "run", "coordinate_binding", "--profile", profile,
               "--level", "n_writes=3", "--device", "cpu", "--out", "run", "--cpus-per-cell", "1", "--no-report",
               "--executor", "local", "--workers", "2"]
    env = {**os.environ, "COLUMNS": "400", "PYTHONPATH": str(tmp_path)}
    cells_dir = tmp_path / "run" / "cells"
    hold = tmp_path / "hold"
    hold.touch()
    log = tmp_path / "driver.log"
    with log.open("w") as out:
        driver = subprocess.Popen(command, cwd=tmp_path, env={**env, "TMEM_TEST_HOLD": str(hold)}, stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while len(list(cells_dir.glob("*.json"))) < 2 and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.05)
        assert driver.poll() is None, log.read_text()
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=60)
    assert sorted(read_cell(p)["cell"]["label"] for p in cells_dir.glob("*.json")) == ["base", "base"]
    hold.unlink()  # an orphaned worker would now finish its held cell
    time.sleep(3)
    assert len(list(cells_dir.glob("*.json"))) == 2  # the workers died with their driver

    # Resumed by the serial executor: any executor completes what another started.
    resumed = subprocess.run(command[:-5], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming: 2 of 4 cells already finished" in resumed.stderr
    assert numbers(tmp_path / "run") == reference
    assert partial_files(tmp_path / "run") == [] and not (tmp_path / "run" / "failed").exists()


def test_a_dead_worker_fails_only_its_cell_and_the_pool_is_rebuilt_for_the_others(tmp_path, monkeypatch, capsys):
    (tmp_path / "killer_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the spawned workers import the plugin too
    monkeypatch.setenv("TMEM_TEST_EXIT", "1")
    # The killer first, so that base's cells are in the pool (running or queued) when its worker dies.
    profile = sweep_profile(tmp_path, '[{ name = "killer_plugin:model", label = "killer" }, "base"]')
    args = ["run", "coordinate_binding", "--profile", profile, "--level", "n_writes=3", "--device", "cpu",
            "--out", "run", "--no-report", "--executor", "local", "--workers", "2", "--cpus-per-cell", "1",
            "--steps", "30"]
    assert main(args) == 1
    err = capsys.readouterr().err
    run_dir = tmp_path / "run"
    assert sorted(r["cell"]["label"] for r in RunDir(run_dir).load_cells()[0]) == ["base", "base"]
    records = [json.loads(p.read_text()) for p in (run_dir / "failed").glob("*.json")]
    assert sorted(r["cell"]["seed"] for r in records) == [0, 1]
    for record in records:
        assert record["cell"]["label"] == "killer" and record["attempts"] == 2
        assert record["error"] == "its worker process died (exit code 3) while running this cell"
    assert "BrokenProcessPool" not in err and "FAILED coordinate_binding base" not in err, err
    assert "2 of 4 cells failed" in err


def test_workers_per_gpu_multiplies_the_gpus_and_is_refused_without_one():
    assert LocalPool(None, 1, gpus=2, per_gpu=3).workers == 6
    for make in (lambda: LocalPool.sketch(ExecutorOptions(kind="local", own=LocalOptions(workers_per_gpu=2)), "cpu"),
                 lambda: LocalPool.make(ExecutorOptions(kind="local", own=LocalOptions(workers_per_gpu=2)), None, "cpu"),
                 lambda: LocalPool(2, 1, gpus=1, per_gpu=2)):
        with pytest.raises(UsageError) as e:
            make()
        assert "\n" not in str(e.value) and "--workers" in str(e.value)
    with pytest.raises(UsageError, match="--workers-per-gpu applies to --executor local, not serial"):
        usable(ExecutorOptions(kind="serial", own=LocalOptions(workers_per_gpu=2)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_two_workers_share_one_gpu(sweep, tmp_path):
    """Two workers on one GPU plan and run the sweep's cells there."""
    folder, cells, _ = sweep
    console = quiet()
    run_plan(cells[:2], tmp_path / "run", device="cuda", console=console,
             executor=ExecutorOptions(kind="local", own=LocalOptions(workers_per_gpu=2), cpus_per_cell=1))
    assert "local pool of 2 worker(s)" in console.file.getvalue()
    results = RunDir(tmp_path / "run").load_cells()[0]
    assert len(results) == 2 and {r["device"] for r in results} == {"cuda"}
