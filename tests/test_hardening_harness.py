"""The run directory against bad input and damage (issue 34): learning rates in range, a report that
recomputes the lr choice from the cells instead of trusting selection.json, weights checked on
resume, figures that honour the umask, a folder where selection.json goes, and `jobs` on a
machine without Slurm's commands."""
from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch

from tmem_bench.cli import main
from tmem_bench.errors import UsageError
from tmem_bench.harness.rundir import RunDir
from tmem_bench.report import load_run, write_report

GRID = """
[train]
steps = 6
batch_size = 8
lr = [1e-3, 1e-2]
weight_decay = 0.01
grad_clip = 1.0
log_every = 2
eval_size = 32
seeds = [0, 1]

[tasks.coordinate_binding]
models = ["base"]
model = { d_model = 16, n_layers = 1, n_heads = 2 }
levels = { n_writes = [3], noise = [0.05] }
"""


def cli(args, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory):
    """A folder holding grid.toml and its finished run in run/: one search of two lrs at seed 0, and
    seed 1 at the lr chosen (copy it before changing it)."""
    folder = tmp_path_factory.mktemp("grid")
    (folder / "grid.toml").write_text(GRID)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the tests that train its cells again have (conftest)
    try:
        assert main(["run", "coordinate_binding", "--profile", str(folder / "grid.toml"), "--out", str(folder / "run"),
                     "--device", "cpu", "--no-report"]) == 0
    finally:
        torch.set_num_threads(threads)
    return folder


@pytest.fixture
def run(grid_run, tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("COLUMNS", "400")  # rich would fold the lines the tests look for
    shutil.copytree(grid_run, tmp_path, dirs_exist_ok=True)
    return tmp_path / "run"


def rerun(run: Path, capsys) -> tuple[int, str, str]:
    return cli(["run", "coordinate_binding", "--profile", run.parent / "grid.toml", "--out", run, "--device", "cpu",
                "--no-report"], capsys)


def selection(run: Path) -> dict:
    return json.loads((run / "selection.json").read_text())


def chosen_cells(run: Path) -> set[str]:
    """The cells a report may show: the trial at the chosen lr and the seeds trained at it."""
    [search] = selection(run)["searches"]
    return {t["cell_id"] for t in search["trials"] if t["lr"] == search["chosen_lr"]} | set(search["final_cells"])


# 5: learning rates in range, wherever a profile sets one.

SITES = {
    "train": lambda text, lr: text.replace("lr = [1e-3, 1e-2]", f"lr = {lr}"),
    "task-train": lambda text, lr: text + f"train = {{ lr = {lr} }}\n",
    "model-entry": lambda text, lr: text.replace('models = ["base"]',
                                                 f'models = [{{ name = "base", train = {{ lr = {lr} }} }}]'),
    "at": lambda text, lr: text + f"at = [{{ n_writes = 3, lr = {lr} }}]\n",
    "variant": lambda text, lr: text + f"variants = [{{ train = {{ lr = {lr} }} }}]\n",
}
WHERE = {"train": "train.lr", "task-train": "tasks.coordinate_binding.train.lr",
         "model-entry": "tasks.coordinate_binding.models.0.train.lr", "at": "tasks.coordinate_binding.at.0.lr",
         "variant": "tasks.coordinate_binding.variants.0.train.lr"}


@pytest.mark.parametrize("lr", ["nan", "inf", "-inf", "1e300", "0", "11", "[1e-3, nan]", "[inf]"])
@pytest.mark.parametrize("site", SITES)
def test_a_learning_rate_out_of_range_is_refused_before_anything_runs(tmp_path, capsys, site, lr):
    profile = tmp_path / "p.toml"
    profile.write_text(SITES[site](GRID, lr))
    for extra in ([], ["--dry-run"]):
        code, _, err = cli(["run", "coordinate_binding", "--profile", profile, "--out", tmp_path / "out", *extra],
                           capsys)
        one_line_error(code, err, f"{WHERE[site]}: ", "is not a learning rate (a finite number > 0 and <= 10)")
    assert not (tmp_path / "out").exists()


def test_the_largest_learning_rate_allowed_plans(tmp_path):
    from tmem_bench.harness.plan import plan_run

    profile = tmp_path / "p.toml"
    profile.write_text(GRID.replace("lr = [1e-3, 1e-2]", "lr = [1e-3, 10]"))
    assert plan_run("coordinate_binding", str(profile)).searches[0].grid == (1e-3, 10)


def test_selection_json_never_holds_a_bare_nan(run, capsys):
    def strict(text):
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"selection.json holds a bare {name}"))

    [search] = selection(run)["searches"]
    trial = search["trials"][0]["cell_id"]
    path = run / "cells" / f"{trial}.json"
    result = json.loads(path.read_text())
    result["validation"]["loss"] = float("nan")  # a trial whose last weights evaluate to a non-finite loss
    path.write_text(json.dumps(result))
    assert rerun(run, capsys)[0] == 0
    [search] = strict((run / "selection.json").read_text())["searches"]
    assert search["trials"][0]["loss"] is None
    report = write_report(run)
    assert not [p for p in report.problems if "selection.json" in p], report.problems


# 6: the report recomputes the lr choice from the cells; a selection.json it cannot check is refused.

def _other_trial(search: dict) -> dict:
    return next(t for t in search["trials"] if t["lr"] != search["chosen_lr"])


DAMAGE = {
    # Each gave a traceback.
    "search-not-an-object": lambda d: d.update(searches=[1]),
    "trial-without-cell-id": lambda d: d["searches"][0]["trials"][0].pop("cell_id"),
    "chosen-lr-a-string": lambda d: d["searches"][0].update(chosen_lr="fast"),
    "grid-with-a-string": lambda d: d["searches"][0]["grid"].append("x"),
    "search-without-label": lambda d: d["searches"][0].pop("label"),
    # Each gave a report showing a trial that was not chosen, with exit 0 and no warning.
    "chosen-lr-edited": lambda d: d["searches"][0].update(chosen_lr=_other_trial(d["searches"][0])["lr"]),
    "unknown-trial-id": lambda d: _other_trial(d["searches"][0]).update(cell_id="0" * 16),
    "searches-a-string": lambda d: d.update(searches="all"),
    "file-deleted": None,
}
REFUSED = {"search-not-an-object": "selection.json is malformed: searches.0",
           "trial-without-cell-id": "selection.json is malformed: searches.0.trials.0",
           "chosen-lr-a-string": "selection.json is malformed: searches.0.chosen_lr",
           "grid-with-a-string": "selection.json is malformed: searches.0.grid.2",
           "search-without-label": "selection.json is malformed: searches.0",
           "unknown-trial-id": "0000000000000000",
           "searches-a-string": "selection.json is malformed: searches",
           "file-deleted": "selection.json is missing"}


@pytest.mark.parametrize("damage", DAMAGE)
def test_the_report_never_shows_a_trial_the_cells_did_not_choose(run, capsys, damage):
    chosen, written = chosen_cells(run), selection(run)
    if DAMAGE[damage] is None:
        (run / "selection.json").unlink()
    else:
        broken = selection(run)
        DAMAGE[damage](broken)
        (run / "selection.json").write_text(json.dumps(broken))
    code, _, err = cli(["report", run], capsys)
    if damage in REFUSED:
        one_line_error(code, err, REFUSED[damage], "rerun the run's command")
        assert not (run / "report.md").exists()
        # The rerun writes selection.json again from the cells, and trains nothing.
        assert rerun(run, capsys)[0] == 0
        assert selection(run) == written
        code, _, err = cli(["report", run], capsys)
    assert code == 0 and "Traceback" not in err, err
    assert set(load_run(run).table["cell_id"]) == chosen
    [search] = load_run(run).selection
    assert {t["cell_id"] for t in search["trials"] if t["lr"] == search["chosen_lr"]} < chosen
    text = (run / "report.md").read_text()
    if damage == "chosen-lr-edited":
        assert "selection.json disagrees with the cells" in text and "warning" in err


def test_an_intact_selection_gives_a_report_without_selection_problems(run):
    report = write_report(run)
    assert set(report.data.table["cell_id"]) == chosen_cells(run)
    assert not [p for p in report.problems if "selection" in p], report.problems


# 8: a finished cell is its result and its weights.

def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _corrupt(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-16] + bytes(b ^ 0xFF for b in data[-16:]))  # the header still reads


WEIGHTS_DAMAGE = {"missing": Path.unlink, "truncated": _truncate, "corrupt": _corrupt,
                  "not-safetensors": lambda p: p.write_bytes(b"not weights")}


@pytest.mark.parametrize("damage", WEIGHTS_DAMAGE)
def test_a_cell_with_bad_weights_is_trained_again_on_resume_and_says_so(run, capsys, damage):
    import safetensors.torch

    [final] = selection(run)["searches"][0]["final_cells"]
    weights = RunDir(run).weights_path(final)
    good = weights.read_bytes()
    others = {p.name: p.stat().st_mtime_ns for p in (run / "cells").iterdir() if not p.name.startswith(final)}
    WEIGHTS_DAMAGE[damage](weights)
    if damage != "missing":
        # submit refuses them too, rather than copying them into an entry that validate rejects.
        from tmem_bench.leaderboard.submit import make_entries

        with pytest.raises(UsageError, match=f"cells/{final}.safetensors.*rerun the run's command"):
            make_entries(run, "X")
    code, _, err = rerun(run, capsys)
    assert code == 0, err
    said = [line for line in err.splitlines() if f"cells/{final}.safetensors" in line]
    assert len(said) == 1 and "training it again" in said[0], err
    # Trained again from its seed: the same tensors (the header's key order is safetensors' own).
    again, before = safetensors.torch.load(weights.read_bytes()), safetensors.torch.load(good)
    assert again.keys() == before.keys() and all(torch.equal(again[k], before[k]) for k in again)
    assert {p.name: p.stat().st_mtime_ns for p in (run / "cells").iterdir() if not p.name.startswith(final)} == others
    assert "training it again" not in rerun(run, capsys)[2]


def test_a_missing_weights_file_at_submit_names_a_rerun_that_trains_it(run):
    from tmem_bench.leaderboard.submit import make_entries

    [final] = selection(run)["searches"][0]["final_cells"]
    RunDir(run).weights_path(final).unlink()
    with pytest.raises(UsageError) as error:
        make_entries(run, "X")
    assert "rerun the run's command" in str(error.value) and "rerun the cell" not in str(error.value)


# 9: figures honour the umask, as every other file does.

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


# 11b: a folder where selection.json goes.

def test_selection_json_as_a_folder_is_one_line_on_resume_and_report(run, capsys):
    (run / "selection.json").unlink()
    (run / "selection.json").mkdir()
    before = {p.name: p.stat().st_mtime_ns for p in (run / "cells").iterdir()}
    one_line_error(*rerun(run, capsys)[::2], "selection.json is a folder")
    assert {p.name: p.stat().st_mtime_ns for p in (run / "cells").iterdir()} == before
    code, _, err = cli(["report", run], capsys)
    one_line_error(code, err, "selection.json is a folder")


# 13: `jobs` of a Slurm run where Slurm's commands are missing.

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
