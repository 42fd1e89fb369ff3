"""Every executor (a local process pool, submitit's local jobs, a real local Ray) finishes a tiny
sweep with results identical to the serial one; a killed driver resumes; a failing cell is
retried, recorded and reported while the others finish; `jobs` of a Slurm run names a missing
sacct or scancel in one line."""
from __future__ import annotations

import importlib.machinery
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from rich.console import Console

from tests.helpers import cli, one_line_error
from tests.profiles import tiny_profile
from tmem_bench.cli import main
from tmem_bench.errors import UsageError
from tmem_bench.harness.executors.base import ExecutorOptions, usable
from tmem_bench.harness.plan import Overrides, make_plan
from tmem_bench.harness.results import read_cell
from tmem_bench.harness.rundir import RunDir
from tmem_bench.harness.runner import run_plan
from tmem_bench.registry import module_names
from tmem_bench.report.data import load_run

# A model plugin that, in training, fails while TMEM_TEST_FAIL is set, kills its own process while
# TMEM_TEST_EXIT is set, and waits while the file TMEM_TEST_HOLD names exists.
PLUGIN = '''
import os
import time

import torch
import torch.nn as nn


class Plugin(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x, blocked=None):
        if self.training and torch.is_grad_enabled():
            if os.environ.get("TMEM_TEST_FAIL"):
                raise RuntimeError("the plugin broke in training")
            if os.environ.get("TMEM_TEST_EXIT"):
                os._exit(3)
            while os.path.exists(os.environ.get("TMEM_TEST_HOLD", "")):
                time.sleep(0.05)
        return self.proj(x)


def model(d_model, n_layers, n_heads, **options):
    return Plugin(d_model)
'''


def need(module: str):
    """The extra's module; where it is missing the test is skipped, except in CI, where it fails."""
    if os.environ.get("CI"):
        return __import__(module)
    return pytest.importorskip(module)


def sweep_profile(folder: Path, models: str = '["base"]') -> str:
    """folder/sweep.toml: `models` on coordinate_binding at n_writes 3 and 4, four steps, seeds 0 and 1."""
    path = folder / "sweep.toml"
    path.write_text(tiny_profile(train={"steps": 4, "weight_decay": "0.01", "log_every": 2, "eval_size": 16,
                                        "seeds": [0, 1]},
                                 tasks={"coordinate_binding": {"models": models, "train_at": None,
                                                               "levels": "{ n_writes = [3, 4], noise = [0.0] }"}}))
    return str(path)


def quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


def numbers(run_dir: Path) -> dict:
    """Cell id -> the numbers that must not depend on the executor."""
    results, errors = RunDir(run_dir).load_cells()
    assert errors == []
    return {r["cell_id"]: ([e["accuracy"] for e in r["eval"]], [h["loss"] for h in r["history"]]) for r in results}


def partial_files(run_dir: Path) -> list[str]:
    return [str(p) for p in run_dir.rglob(".*.tmp")]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The plan's folder, its four cells, and the serial executor's numbers for them."""
    folder = tmp_path_factory.mktemp("sweep")
    profile = sweep_profile(folder)
    cells = make_plan("coordinate_binding", profile, Overrides(train_at="each"))
    threads = torch.get_num_threads()
    # One thread per cell under every executor: CPU numbers are identical for the same thread count.
    run_plan(cells, folder / "serial", device="cpu", console=quiet(), executor=ExecutorOptions(cpus_per_cell=1))
    assert torch.get_num_threads() == threads  # the driver's own setting is left as it was
    reference = numbers(folder / "serial")
    assert len(cells) == 4 and set(reference) == {c.id for c in cells}
    return folder, cells, reference


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


def test_submitit_jobs_give_the_serial_numbers_and_are_listed(sweep, tmp_path, capsys):
    need("submitit")
    folder, cells, reference = sweep
    run_dir = tmp_path / "run"
    run_plan(cells[:2], run_dir, device="cpu", console=quiet(),
             executor=ExecutorOptions(kind="slurm", slurm_cluster="local", slurm_time="10", cpus_per_cell=1))
    assert numbers(run_dir) == {c.id: reference[c.id] for c in cells[:2]}
    assert (run_dir / "slurm").is_dir() and partial_files(run_dir) == []
    record = json.loads((run_dir / "jobs.json").read_text())
    assert record["cluster"] == "local" and {j["cell"] for j in record["jobs"]} == {c.id for c in cells[:2]}

    assert main(["jobs", str(run_dir)]) == 0
    listing = capsys.readouterr().out
    assert listing.count("ENDED") == 2 and listing.count(" finished") == 2 and "2 job(s) on local" in listing


@pytest.fixture(scope="module")
def local_ray():
    ray = need("ray")
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield ray
    ray.shutdown()


def test_ray_tasks_give_the_serial_numbers(sweep, local_ray, tmp_path):
    folder, cells, reference = sweep
    console = quiet()
    run_plan(cells, tmp_path / "run", device="cpu", console=console,
             executor=ExecutorOptions(kind="ray", cpus_per_cell=1))
    assert numbers(tmp_path / "run") == reference
    assert "as Ray tasks on a local Ray (1 CPU(s), 0 GPU(s) per cell)" in console.file.getvalue()
    assert local_ray.is_initialized()  # a Ray the caller started is left to the caller


def test_a_killed_ray_driver_leaves_none_of_its_local_rays_processes(tmp_path):
    need("ray")
    from tmem_bench.harness.executors.reaper import descendants

    (tmp_path / "held_plugin.py").write_text(PLUGIN)
    profile = sweep_profile(tmp_path, '[{ name = "held_plugin:model", label = "held" }]')
    hold = tmp_path / "hold"
    hold.touch()
    command = [sys.executable, "-m", "tmem_bench.cli", "run", "coordinate_binding", "--profile", profile,
               "--level", "n_writes=3", "--seeds", "1", "--device", "cpu", "--out", "run", "--no-report",
               "--executor", "ray", "--cpus-per-cell", "1"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TMEM_TEST_HOLD": str(hold)}
    log = tmp_path / "driver.log"
    with log.open("w") as out:
        driver = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    ray_processes = []
    try:
        deadline = time.monotonic() + 180
        while "running 1 cell(s)" not in log.read_text() and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.2)
        assert driver.poll() is None, log.read_text()
        ray_processes = descendants(driver.pid)
        titles = {Path(f"/proc/{p.split(':')[0]}/cmdline").read_bytes().split(b"\0")[0] for p in ray_processes}
        assert {b"ray::DashboardAgent", b"ray::RuntimeEnvAgent"} <= titles, titles
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=60)
        hold.unlink()
    deadline = time.monotonic() + 60
    while (alive := [p for p in ray_processes if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    for p in alive:  # left for the assertion to name, not on the machine
        os.kill(int(p.split(":")[0]), signal.SIGKILL)
    assert alive == []


def _alive(process: str) -> bool:
    pid, start = process.split(":")
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19] == start
    except (OSError, IndexError):
        return False


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


def test_a_failing_cell_is_retried_recorded_and_reported_while_the_others_finish(tmp_path, monkeypatch, capsys):
    (tmp_path / "flaky_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    profile = sweep_profile(tmp_path, '["base", { name = "flaky_plugin:model", label = "flaky" }]')
    args = ["run", "coordinate_binding", "--profile", profile, "--level", "n_writes=3", "--seeds", "1",
            "--device", "cpu", "--out", "run", "--no-report", "--retries", "2"]
    monkeypatch.setenv("TMEM_TEST_FAIL", "1")
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.count("FAILED coordinate_binding flaky") == 4  # three attempts, then the summary line
    assert "attempt 3 of 3" in err and "1 of 2 cells failed; rerun the same command" in err

    run_dir = tmp_path / "run"
    with module_names(True):  # the test's own plug-in
        (flaky,) = [c for c in make_plan("coordinate_binding", profile, Overrides(levels={"n_writes": [3]}, seeds=[0]))
                    if c.label == "flaky"]
    record = json.loads(RunDir(run_dir).failed_path(flaky.id).read_text())
    assert record["attempts"] == 3 and record["error"] == "RuntimeError: the plugin broke in training"
    assert "flaky_plugin.py" in record["traceback"] and record["cell"]["label"] == "flaky"
    assert [r["cell"]["label"] for r in RunDir(run_dir).load_cells()[0]] == ["base"]  # the other cell finished
    with pytest.raises(ValueError):
        read_cell(RunDir(run_dir).failed_path(flaky.id))  # never taken for a finished cell
    problems = load_run(run_dir).problems
    assert len(problems) == 1 and f"cell {flaky.id}" in problems[0] and "FAILED after 3 attempt(s)" in problems[0]

    monkeypatch.delenv("TMEM_TEST_FAIL")
    assert main(args) == 0
    assert "resuming: 1 of 2 cells already finished" in capsys.readouterr().err
    assert not RunDir(run_dir).failed_path(flaky.id).exists() and len(RunDir(run_dir).load_cells()[0]) == 2
    assert load_run(run_dir).problems == []


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


def test_the_slurm_settings_reach_sbatch(tmp_path, monkeypatch):
    need("submitit")
    from tmem_bench.cli.args import sbatch_options
    from tmem_bench.harness.executors.base import minutes
    from tmem_bench.harness.executors.slurm import SubmititJobs

    bin_dir = tmp_path / "bin"  # stand-ins, so that submitit believes it is on a login node
    bin_dir.mkdir()
    for tool in ("sbatch", "srun"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    extra = sbatch_options(["account=proj", "--mail-type=END"])
    options = usable(ExecutorOptions(kind="slurm", slurm_partition="gpu", slurm_time="1-02:00:00", cpus_per_cell=8,
                                     gpus_per_cell=1, slurm_options=extra))
    jobs = SubmititJobs(tmp_path / "run", options)
    script = jobs.executor._executor._make_submission_file_text("python -m job", "uid")
    for line in ("--partition=gpu", "--time=1560", "--cpus-per-task=8", "--gpus-per-node=1", "--account=proj",
                 "--mail-type=END", f"--output={tmp_path / 'run' / 'slurm'}"):
        assert f"#SBATCH {line}" in script, line
    assert jobs.threads == 8 and minutes("90") == 90 and minutes("0:30:00") == 30


@pytest.mark.parametrize("options, needle", [
    (ExecutorOptions(kind="dask"), "--executor 'dask' is unknown; allowed: serial, local, ray, slurm"),
    (ExecutorOptions(kind="serial", workers=2), "--workers applies to --executor local or slurm, not serial"),
    (ExecutorOptions(kind="local", address="ray://x"), "--address applies to --executor ray, not local"),
    (ExecutorOptions(kind="slurm", slurm_cluster="local", gpus_per_cell=0.5), "must be a whole number"),
    (ExecutorOptions(kind="slurm", slurm_cluster="local", slurm_time="soon"), "--slurm-time 'soon' must be"),
    (ExecutorOptions(kind="slurm", slurm_cluster="pbs"), "--slurm-cluster 'pbs' is unknown"),
])
def test_bad_executor_settings_are_refused(options, needle):
    with pytest.raises(UsageError, match=needle.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        usable(options)


def test_a_missing_extra_names_it_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    monkeypatch.chdir(tmp_path)
    profile = sweep_profile(tmp_path)
    assert main(["run", "coordinate_binding", "--profile", profile, "--out", "run", "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ['tmem-bench: error: --executor ray needs ray, which is not installed; '
                                        'install it with: pip install "tmem-bench[ray]"']
    assert not (tmp_path / "run").exists()


@pytest.fixture
def slurm_record(tmp_path, monkeypatch):
    """A run directory whose jobs.json records one Slurm job, a submitit that reports what it does
    without sacct (every job UNKNOWN), and a PATH holding only the commands the test puts in bin/."""
    fake = types.ModuleType("submitit")
    fake.__spec__ = importlib.machinery.ModuleSpec("submitit", None)

    class SlurmJob:
        def __init__(self, folder, job_id):
            self.job_id = job_id

        @property
        def state(self):
            return "RUNNING" if shutil.which("sacct") else "UNKNOWN"

        def cancel(self, check=True):
            if shutil.which("scancel") is None:
                raise FileNotFoundError("scancel")

    fake.SlurmJob = SlurmJob
    monkeypatch.setitem(sys.modules, "submitit", fake)
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    (tmp_path / "jobs.json").write_text(json.dumps({
        "executor": "slurm", "driver": {"pid": 1, "host": "login1"}, "cluster": "slurm", "folder": "slurm",
        "jobs": [{"cell": "0123456789abcdef", "job": "4242_0"}]}))
    return tmp_path


def _command(folder: Path, name: str) -> None:
    path = folder / "bin" / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)


@pytest.mark.parametrize("cancel", [False, True])
def test_jobs_of_slurm_without_sacct_is_one_line_naming_it(slurm_record, capsys, cancel):
    code, out, err = cli(["jobs", slurm_record, *(["--cancel"] if cancel else [])], capsys)
    one_line_error(code, err, "sacct", "not on PATH")
    assert "cancelled" not in out


def test_jobs_cancel_without_scancel_is_one_line_naming_it(slurm_record, capsys):
    _command(slurm_record, "sacct")
    code, out, err = cli(["jobs", slurm_record, "--cancel"], capsys)
    one_line_error(code, err, "scancel", "not on PATH")
    assert "4242_0" in out and "cancelled" not in out
    _command(slurm_record, "scancel")
    code, out, err = cli(["jobs", slurm_record, "--cancel"], capsys)
    assert code == 0 and "cancelled 1 job(s)" in out, err
