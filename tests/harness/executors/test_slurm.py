"""Slurm through submitit: its own options (parsed by the CLI whichever engine runs), submitit's local
jobs giving the serial engine's numbers, the settings reaching sbatch, and `jobs` of a Slurm run
naming a missing sacct or scancel in one line."""
from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import sys
import types
from pathlib import Path

import pytest

from tests.harness.executors.helpers import need, numbers, partial_files, quiet
from tests.helpers import cli, one_line_error
from tmem_bench.cli import main
from tmem_bench.errors import UsageError
from tmem_bench.harness.executors import ENGINES, ExecutorOptions, SlurmOptions, usable
from tmem_bench.harness.executors.slurm import minutes
from tmem_bench.harness.runner import run_plan


def test_submitit_jobs_give_the_serial_numbers_and_are_listed(sweep, tmp_path, capsys):
    need("submitit")
    folder, cells, reference = sweep
    run_dir = tmp_path / "run"
    run_plan(cells[:2], run_dir, device="cpu", console=quiet(),
             executor=ExecutorOptions(kind="slurm", cpus_per_cell=1, own=SlurmOptions(cluster="local", time="10")))
    assert numbers(run_dir) == {c.id: reference[c.id] for c in cells[:2]}
    assert (run_dir / "slurm").is_dir() and partial_files(run_dir) == []
    record = json.loads((run_dir / "jobs.json").read_text())
    assert record["cluster"] == "local" and {j["cell"] for j in record["jobs"]} == {c.id for c in cells[:2]}

    assert main(["jobs", str(run_dir)]) == 0
    listing = capsys.readouterr().out
    assert listing.count("ENDED") == 2 and listing.count(" finished") == 2 and "2 job(s) on local" in listing


def test_the_slurm_settings_reach_sbatch(tmp_path, monkeypatch):
    need("submitit")
    from tmem_bench.harness.executors.slurm import SubmititJobs, sbatch_options

    bin_dir = tmp_path / "bin"  # stand-ins, so that submitit believes it is on a login node
    bin_dir.mkdir()
    for tool in ("sbatch", "srun"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    extra = sbatch_options(["account=proj", "--mail-type=END"])
    options = usable(ExecutorOptions(kind="slurm", cpus_per_cell=8, gpus_per_cell=1,
                                     own=SlurmOptions(partition="gpu", time="1-02:00:00", options=extra)))
    jobs = SubmititJobs(tmp_path / "run", options)
    script = jobs.executor._executor._make_submission_file_text("python -m job", "uid")
    for line in ("--partition=gpu", "--time=1560", "--cpus-per-task=8", "--gpus-per-node=1", "--account=proj",
                 "--mail-type=END", f"--output={tmp_path / 'run' / 'slurm'}"):
        assert f"#SBATCH {line}" in script, line
    assert jobs.threads == 8


def test_a_time_limit_is_read_in_minutes():
    assert minutes("90") == 90 and minutes("0:30:00") == 30 and minutes("1-02:00:00") == 1560
    for bad in ("soon", "0", "1:30", "0:00:10"):
        with pytest.raises(UsageError, match=f"--slurm-time '{bad}' must be"):
            minutes(bad)


@pytest.mark.parametrize("options, needle", [
    (lambda: ExecutorOptions(kind="slurm", gpus_per_cell=0.5, own=SlurmOptions(cluster="local")),
     "must be a whole number"),
    (lambda: SlurmOptions(cluster="local", time="soon"), "--slurm-time 'soon' must be"),
    (lambda: SlurmOptions(cluster="pbs"), "--slurm-cluster 'pbs' is unknown"),
])
def test_bad_slurm_settings_are_refused(options, needle):
    with pytest.raises(UsageError, match=needle):
        usable(options())


@pytest.mark.parametrize("flags, needle", [
    (["--executor", "local", "--slurm-partition", "gpu"], "--slurm-partition applies to --executor slurm, not local"),
    (["--slurm-option", "qos=high"], "--slurm-option applies to --executor slurm, not serial"),
    (["--executor", "local", "--slurm-time", "soon"], "--slurm-time 'soon' must be"),
    (["--executor", "slurm", "--slurm-cluster", "local", "--slurm-option", "qos"], "--slurm-option 'qos' is malformed"),
])
def test_the_cli_refuses_slurm_flags_before_planning(tmp_path, monkeypatch, capsys, flags, needle):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(["run", "coordinate_binding", "--models", "nope", *flags], capsys)
    one_line_error(code, err, needle)  # before the unknown model is noticed
    assert os.listdir(tmp_path) == []


def test_the_dry_run_of_slurm_leaves_the_wall_time_to_the_cluster():
    sketch = ENGINES["slurm"].sketch(ExecutorOptions(kind="slurm"), "cpu")
    assert (sketch.text, sketch.threads, sketch.workers) == ("--executor slurm (1 CPU(s) per cell)", 1, None)


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
