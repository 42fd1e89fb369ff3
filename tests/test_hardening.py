"""Bad input of every kind is one line, exit 2, no traceback, nothing written; divergence
is recorded; a run directory has one writer and one plan; malformed cells are retrained."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from tmem_bench.diagnostics.causality import causality_probe

CLI = [sys.executable, "-m", "tmem_bench.cli"]

TINY = """
[train]
steps = {steps}
batch_size = 8
lr = {lr}
weight_decay = 0.01
grad_clip = 1.0
log_every = 2
eval_size = 16
seeds = [0]

[tasks.coordinate_binding]
models = ["base"]
model = {{ d_model = 16, n_layers = 1, n_heads = 2, dropout = 0.0 }}
levels = {{ n_writes = [3], noise = [0.0] }}
"""

PLUGINS = '''
import torch
import torch.nn as nn


def returns_dict(d_model, n_layers, n_heads, **options):
    return {"not": "a module"}


def returns_none(d_model, n_layers, n_heads, **options):
    return None


class WrongShape(nn.Module):
    def forward(self, x, blocked=None):
        return x[:, :1]


def wrong_shape(d_model, n_layers, n_heads, **options):
    return WrongShape()


def raises(d_model, n_layers, n_heads, **options):
    raise KeyError("the author's bug")
'''


def tiny_profile(folder: Path, steps: int = 4, lr: float = 1e-3, extra: str = "") -> str:
    path = folder / "tiny.toml"
    path.write_text(TINY.format(steps=steps, lr=lr) + extra)
    return str(path)


def profile_with(folder: Path, text: str, name: str = "bad.toml") -> str:
    path = folder / name
    path.write_text(text)
    return str(path)


def replace_line(key: str, line: str) -> str:
    body = TINY.format(steps=4, lr=1e-3)
    return "\n".join(line if row.startswith(f"{key} =") else row for row in body.splitlines())


# jobs.json records a new user might hand `tmem-bench jobs`: file name -> (content, the message's needle).
JOBS_RECORDS = {
    "jobs-not-utf8": (b"\xff\xfe{}", "jobs.json is unreadable"),
    "jobs-not-a-list": ({"executor": "slurm", "driver": {"pid": 1, "host": "h"}, "cluster": "local",
                         "folder": "slurm", "jobs": "x"}, "'jobs' must be a list"),
    "jobs-no-driver": ({"executor": "local"}, "it names no driver"),
    "jobs-slurm-no-cluster": ({"executor": "slurm", "driver": {"pid": 1, "host": "h"}, "folder": "slurm", "jobs": []},
                              "cluster None is not one of slurm, local"),
    "jobs-executor-alone": ({"executor": "slurm"}, "it names no driver"),
}

# (id, command line after `tmem-bench`, a needle of the one-line message[, exit code, 2 unless given]).
# `{p}` is the folder of the test's files, `{f}` a plain file in it, `{r}` a finished run that can be
# submitted; `{p}/board` is an empty leaderboard and `{p}/published` one where that run is published.
MALFORMED = [
    ("out-unwritable", ["run", "coordinate_binding", "--out", "/proc/forbidden/run"], "cannot be created"),
    ("out-under-a-file", ["run", "coordinate_binding", "--out", "{f}/sub"], "cannot be created"),
    ("out-is-a-file", ["run", "coordinate_binding", "--out", "{f}"], "exists and is not a directory"),
    ("out-empty", ["run", "coordinate_binding", "--out", ""], "--out is empty"),
    ("level-unallocatable", ["run", "coordinate_binding", "--level", "n_writes=10000000000000"],
     "one sequence cannot be built"),
    ("batch-unallocatable", ["run", "coordinate_binding", "--batch-size", "1000000000"], "GiB needed"),
    ("seeds-count-huge", ["run", "coordinate_binding", "--seeds", "3000000000"], "--seeds count must be at most"),
    ("seeds-repeated", ["run", "coordinate_binding", "--seeds", "0,0"], "seeds list 0 more than once"),
    ("levels-repeated", ["run", "coordinate_binding", "--level", "n_writes=5,5"], "list 5 more than once"),
    ("level-axis-twice", ["run", "coordinate_binding", "--level", "n_writes=5", "--level", "n_writes=10"],
     "--level n_writes is given twice"),
    ("models-empty", ["run", "coordinate_binding", "--models", ""], "names an empty model"),
    ("models-empty-entry", ["run", "coordinate_binding", "--models", "base,,tensor"], "names an empty model"),
    ("profile-unknown-key", ["run", "coordinate_binding", "--profile", "{p}/stepz.toml"],
     "unknown key 'stepz'; allowed: batch_size"),
    ("profile-lr-string", ["run", "coordinate_binding", "--profile", "{p}/lr_string.toml"],
     "train.lr: 'fast' is not a learning rate (a finite number > 0 and <= 10) or a list of them"),
    ("profile-lr-negative", ["run", "coordinate_binding", "--profile", "{p}/lr_negative.toml"], "train.lr: -1.0"),
    ("profile-weight-decay-string", ["run", "coordinate_binding", "--profile", "{p}/wd.toml"],
     "train.weight_decay: 'none' is not of type 'number'"),
    ("profile-train-not-a-table", ["run", "coordinate_binding", "--profile", "{p}/train5.toml"],
     "tasks.coordinate_binding.train: 5 is not of type 'object'"),
    ("profile-levels-string", ["run", "coordinate_binding", "--profile", "{p}/levels.toml"],
     "tasks.coordinate_binding.levels: '5,10' is not of type 'object'"),
    ("profile-not-utf8", ["run", "coordinate_binding", "--profile", "{p}/latin1.toml"], "is not UTF-8 text"),
    ("profile-no-models", ["run", "coordinate_binding", "--profile", "{p}/nomodels.toml"],
     "tasks.coordinate_binding.models: [] should be non-empty"),
    ("profile-unknown-task", ["run", "all", "--profile", "{p}/unknown_task.toml"], "names unknown task 'mapbuilding'"),
    ("profile-seeds-repeated", ["run", "coordinate_binding", "--profile", "{p}/seeds.toml"], "lists a value twice"),
    ("plugin-returns-dict", ["run", "coordinate_binding", "--models", "hardening_plugins:returns_dict"],
     "returned dict, not a torch.nn.Module"),
    ("plugin-returns-none", ["run", "coordinate_binding", "--models", "hardening_plugins:returns_none"],
     "returned NoneType, not a torch.nn.Module"),
    ("plugin-without-blocked", ["run", "coordinate_binding", "--models", "torch.nn:Identity"],
     "forward takes no `blocked` argument"),
    ("plugin-wrong-shape", ["run", "coordinate_binding", "--models", "hardening_plugins:wrong_shape"],
     "returned (2, 1, 64), expected (2, 3, 64)"),
    ("plugin-raises", ["run", "coordinate_binding", "--models", "hardening_plugins:raises"],
     "its factory raised KeyError: \"the author's bug\""),
    ("plugin-import-fails", ["run", "coordinate_binding", "--models", "hardening_broken:thing"],
     "importing hardening_broken raised ZeroDivisionError"),
    ("report-not-a-run", ["report", "{p}"], "is not a run directory"),
    ("profile-is-a-folder", ["run", "coordinate_binding", "--profile", "{p}/folder.toml"],
     "is a folder; give a profile's TOML file"),
    ("profile-dropout-string", ["run", "coordinate_binding", "--profile", "{p}/dropout.toml"],
     "tasks.coordinate_binding.model.dropout: 'lots' is not of type 'number'"),
    ("submit-leaderboard-is-a-file", ["leaderboard", "submit", "{r}", "--name", "X", "--leaderboard", "{f}"],
     "--leaderboard '{f}' is a file, not a folder"),
    ("submit-name-too-long", ["leaderboard", "submit", "{r}", "--name", "N" * 200, "--leaderboard", "{p}/board"],
     "--name is 200 characters long; at most 120 are allowed"),
    ("submit-url-with-a-space", ["leaderboard", "submit", "{r}", "--name", "X", "--url", "https://example.org/a b",
                                 "--leaderboard", "{p}/board"], "is not an http:// or https:// address"),
    ("submit-url-scheme-alone", ["leaderboard", "submit", "{r}", "--name", "X", "--url", "http://",
                                 "--leaderboard", "{p}/board"], "--url 'http://' is not an http:// or https://"),
    ("submit-description-too-long", ["leaderboard", "submit", "{r}", "--name", "X", "--description", "d" * 2001,
                                     "--leaderboard", "{p}/board"],
     "--description is 2,001 characters long; at most 2,000 are allowed"),
    ("submit-published-twice", ["leaderboard", "submit", "{r}", "--name", "Again", "--leaderboard", "{p}/published"],
     "are published already in the entry first; a run is submitted once"),
    ("submit-name-without-letters", ["leaderboard", "submit", "{r}", "--name", "☃ ☃", "--leaderboard", "{p}/board"],
     "has no letters or digits"),
    ("validate-entry-not-utf8", ["leaderboard", "validate", "{p}/notutf8"],
     "notutf8: entry.json: unreadable (UnicodeDecodeError", 1),
    *((f"{name}{' --cancel' if cancel else ''}", ["jobs", f"{{p}}/{name}", *(["--cancel"] if cancel else [])], needle)
      for name, (_, needle) in JOBS_RECORDS.items() for cancel in (False, True)),
]


BOARD_SCHEMA = Path(__file__).resolve().parents[1] / "leaderboard" / "entry.schema.json"


def empty_board(folder: Path) -> Path:
    folder.mkdir(parents=True)
    shutil.copy(BOARD_SCHEMA, folder / BOARD_SCHEMA.name)
    return folder


@pytest.fixture(scope="module")
def submittable(tmp_path_factory):
    """A folder with a finished run (run/, planned from an absolute profile path, so that it can be
    submitted from anywhere) and a leaderboard where it is published as 'First' (published/)."""
    from tmem_bench.cli import main

    folder = tmp_path_factory.mktemp("submittable")
    profile = tiny_profile(folder, steps=2)
    assert main(["run", "coordinate_binding", "--profile", profile, "--out", str(folder / "run"), "--no-report"]) == 0
    board = empty_board(folder / "published")
    assert main(["leaderboard", "submit", str(folder / "run"), "--name", "First", "--leaderboard", str(board)]) == 0
    return folder


@pytest.fixture
def inputs(tmp_path, monkeypatch, submittable):
    """The files the malformed command lines name, in their own folder; the command runs in another."""
    files = tmp_path / "inputs"
    files.mkdir()
    (files / "folder.toml").mkdir()
    profile_with(files, replace_line("model", 'model = { d_model = 16, n_layers = 1, n_heads = 2, dropout = "lots" }'),
                 "dropout.toml")
    empty_board(files / "board")
    shutil.copytree(submittable / "published", files / "published")
    (empty_board(files / "notutf8") / "entries" / "notutf8").mkdir(parents=True)
    (files / "notutf8" / "entries" / "notutf8" / "entry.json").write_bytes(b"\xff\xfe{}")
    for name, (content, _) in JOBS_RECORDS.items():
        (files / name).mkdir()
        text = content if isinstance(content, bytes) else json.dumps(content).encode()
        (files / name / "jobs.json").write_bytes(text)
    (files / "plain").write_text("a file, not a folder")
    profile_with(files, replace_line("steps", "stepz = 4"), "stepz.toml")
    profile_with(files, replace_line("lr", 'lr = "fast"'), "lr_string.toml")
    profile_with(files, replace_line("lr", "lr = -1.0"), "lr_negative.toml")
    profile_with(files, replace_line("weight_decay", 'weight_decay = "none"'), "wd.toml")
    profile_with(files, TINY.format(steps=4, lr=1e-3) + "train = 5\n", "train5.toml")
    profile_with(files, replace_line("levels", 'levels = "5,10"'), "levels.toml")
    profile_with(files, replace_line("models", "models = []"), "nomodels.toml")
    profile_with(files, replace_line("seeds", "seeds = [1, 1]"), "seeds.toml")
    profile_with(files, TINY.format(steps=4, lr=1e-3).replace("coordinate_binding]", "mapbuilding]"),
                 "unknown_task.toml")
    (files / "latin1.toml").write_bytes("description = \"caf\xe9\"\n".encode("latin-1"))
    (files / "hardening_plugins.py").write_text(PLUGINS)
    (files / "hardening_broken.py").write_text("thing = 1 / 0\n")
    monkeypatch.syspath_prepend(str(files))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return files, work


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("args, needle, code", [(m[1], m[2], m[3] if len(m) > 3 else 2) for m in MALFORMED],
                         ids=[m[0] for m in MALFORMED])
def test_malformed_input_is_one_line_exit_2_and_writes_nothing(args, needle, code, inputs, submittable, capsys):
    from tmem_bench.cli import main

    files, work = inputs
    names = {"p": files, "f": files / "plain", "r": submittable / "run"}
    args, needle = [a.format(**names) for a in args], needle.format(**names)
    before = {"inputs": tree(files), "work": tree(work), "run": tree(submittable / "run")}
    assert main(args) == code
    err = capsys.readouterr().err
    assert err.startswith("tmem-bench: error: " if code == 2 else "rejected: "), err
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err, err
    assert "Traceback" not in err
    assert {"inputs": tree(files), "work": tree(work), "run": tree(submittable / "run")} == before


def test_debug_shows_the_plugin_authors_traceback(inputs, capsys):
    from tmem_bench.cli import main

    assert main(["run", "coordinate_binding", "--models", "hardening_plugins:raises", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "hardening_plugins.py" in err
    assert err.strip().splitlines()[-1].startswith("tmem-bench: error: model 'hardening_plugins:raises'")


def test_malformed_input_in_a_real_process_has_no_traceback(inputs):
    files, work = inputs
    proc = subprocess.run(CLI + ["run", "coordinate_binding", "--profile", str(files / "stepz.toml")],
                          capture_output=True, text=True, cwd=work, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"tmem-bench: error: profile '{files / 'stepz.toml'}': train: unknown key 'stepz'; allowed: batch_size, "
        "early_stop, eval_size, grad_clip, log_every, lr, seeds, selection_second_seed, steps, weight_decay"]
    assert tree(work) == []


def run_cli(args, cwd):
    # A wide console: rich would otherwise fold the messages the tests look for.
    return subprocess.run(CLI + args, capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**os.environ, "COLUMNS": "400"})


# Finite at initialisation; Adam's first step moves `g` by the lr whatever its gradient, and cosh(1e5 g)
# then overflows: the loss of step 2 is not finite (an lr out of range is refused before training).
DIVERGING = '''
import torch
import torch.nn as nn


class Diverging(nn.Module):
    def __init__(self):
        super().__init__()
        self.g = nn.Parameter(torch.tensor(1e-9))

    def forward(self, x, blocked=None):
        return x * torch.cosh(1e5 * self.g)


def diverging(d_model, n_layers, n_heads, **options):
    return Diverging()
'''


def test_divergence_stops_the_cell_and_is_reported(tmp_path):
    profile = tiny_profile(tmp_path, steps=20)
    (tmp_path / "hardening_diverging.py").write_text(DIVERGING)
    proc = run_cli(["run", "coordinate_binding", "--profile", profile, "--out", "run",
                    "--models", "hardening_diverging:diverging"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "DIVERGED at step" in proc.stderr
    result = json.loads(next((tmp_path / "run" / "cells").glob("*.json")).read_text())
    assert result["status"] == "diverged" and 1 < result["diverged_at_step"] <= 20
    assert all(h["step"] < result["diverged_at_step"] for h in result["history"])
    table = pd.read_csv(tmp_path / "run" / "results.csv")
    assert set(table["status"]) == {"diverged"} and table["final_loss"].notna().all()
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Diverged training" in report and f"step {result['diverged_at_step']} of 20" in report
    assert "diverged at step" in proc.stdout  # the console summary's status column


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A folder holding tiny.toml and the finished run of it in run/ (copy it before changing it)."""
    folder = tmp_path_factory.mktemp("finished")
    tiny_profile(folder, steps=2)
    proc = run_cli(["run", "coordinate_binding", "--profile", "tiny.toml", "--out", "run"], folder)
    assert proc.returncode == 0, proc.stderr
    return folder


def test_finished_cells_say_so_and_carry_their_final_loss(finished_run):
    table = pd.read_csv(finished_run / "run" / "results.csv")
    result = json.loads(next((finished_run / "run" / "cells").glob("*.json")).read_text())
    assert set(table["status"]) == {"finished"} and result["diverged_at_step"] is None
    assert table["final_loss"].iloc[0] == pytest.approx(result["history"][-1]["loss"])


def test_probe_names_non_finite_outputs():
    class NaNs(torch.nn.Module):
        def forward(self, x, blocked=None):
            return x * float("nan")

    assert causality_probe(NaNs(), d_model=4, seq_len=6)["verdict"] == "non-finite"


def test_a_second_writer_is_refused_and_a_killed_ones_lock_is_taken_over(tmp_path):
    profile = tiny_profile(tmp_path, steps=100000)
    first = subprocess.Popen(CLI + ["run", "coordinate_binding", "--profile", profile, "--out", "run"],
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lock = tmp_path / "run" / ".lock"
    try:
        deadline = time.monotonic() + 120
        while not (lock.exists() and lock.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert json.loads(lock.read_text())["pid"] == first.pid
        second = run_cli(["run", "coordinate_binding", "--profile", profile, "--out", "run"], tmp_path)
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert f"is in use by process {first.pid}" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    (tmp_path / "run" / ".results.csv.stale.tmp").write_text("left by a kill")
    third = run_cli(["run", "coordinate_binding", "--profile", profile, "--out", "run", "--steps", "4", "--append"],
                    tmp_path)
    assert third.returncode == 0, third.stderr
    assert f"taking over the lock of an earlier run that ended without releasing it (pid {first.pid}" in third.stderr
    assert "removed .results.csv.stale.tmp" in third.stderr
    assert not list((tmp_path / "run").glob(".*.tmp"))
    assert lock.read_text() == ""  # released cleanly


def test_another_plan_in_the_same_directory_is_refused_unless_appended(finished_run, tmp_path):
    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    profile = "tiny.toml"
    other = run_cli(["run", "coordinate_binding", "--profile", profile, "--out", "run", "--seeds", "5,6"], tmp_path)
    assert other.returncode == 2 and "holds another plan" in other.stderr and "seeds" in other.stderr
    assert len(list((tmp_path / "run" / "cells").glob("*.json"))) == 1
    appended = run_cli(["run", "coordinate_binding", "--profile", profile, "--out", "run", "--seeds", "5,6",
                        "--append"], tmp_path)
    assert appended.returncode == 0, appended.stderr
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert len(manifest["cells"]) == 3 and len(list((tmp_path / "run" / "cells").glob("*.json"))) == 3
    assert "3 readable of 3 planned" in (tmp_path / "run" / "report.md").read_text()


@pytest.mark.parametrize("damage, needle", [
    (lambda r: r["eval"][0].update(accuracy="high"), "is malformed: eval.0.accuracy: 'high' is not of type 'number'"),
    (lambda r: r.update(eval=[]), "is malformed: eval: [] should be non-empty"),
    (lambda r: r["cell"].update(seed="0"), "is malformed: cell.seed: '0' is not of type 'integer'"),
    (lambda r: r.update(cell_id="0" * 16), "holds cell 0000000000000000"),
    (lambda r: r["history"][0].update(loss=None), "is malformed: history.0.loss: None is not of type 'number'"),
])
def test_a_malformed_cell_is_named_by_report_and_retrained_on_resume(finished_run, tmp_path, damage, needle):
    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    args = ["run", "coordinate_binding", "--profile", "tiny.toml", "--out", "run"]
    path = next((tmp_path / "run" / "cells").glob("*.json"))
    good = json.loads(path.read_text())
    bad = json.loads(path.read_text())
    damage(bad)
    path.write_text(json.dumps(bad))
    report = run_cli(["report", "run"], tmp_path)
    assert report.returncode == 0 and "Traceback" not in report.stderr
    assert needle in (tmp_path / "run" / "report.md").read_text()
    resumed = run_cli(args, tmp_path)
    assert resumed.returncode == 0 and f"cells/{path.name}" in resumed.stderr and "training it again" in resumed.stderr
    again = json.loads(path.read_text())
    assert again["eval"] == good["eval"]  # retrained from its seed: the same numbers


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


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size) -> the folder of a new tmpfs of that size, unmounted after the test (needs root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = []

    def mount(size: str) -> Path:
        point = tmp_path / f"fs{len(mounted)}"
        point.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                              capture_output=True, text=True)
        if proc.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=True)


def remount(point: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(point)], check=True)


def fill(folder: Path) -> None:
    with open(folder / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def one_line_error(proc, needle: str) -> None:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("tmem-bench: error: ") and needle in last, proc.stderr


def temporaries(folder: Path) -> list[str]:
    return [str(p) for p in folder.rglob(".*") if p.name != ".lock"]


def test_a_full_disk_is_one_line_leaves_no_torn_file_and_resumes_once_freed(tmpfs, tmp_path):
    # 12 KiB: the manifest and the jobs record fit, the cell's weights do not, and then neither does
    # the failure record.
    fs = tmpfs("12k")
    profile = tiny_profile(tmp_path, steps=2)
    args = ["run", "coordinate_binding", "--profile", profile, "--out", str(fs / "run"), "--no-report"]
    one_line_error(run_cli(args, tmp_path), "No space left on device; free some space and rerun the same command")
    assert temporaries(fs) == [] and not list((fs / "run" / "cells").glob("*.json"))
    remount(fs, "size=4m")
    resumed = run_cli(args, tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert len(list((fs / "run" / "cells").glob("*.json"))) == 1 and temporaries(fs) == []


def test_report_and_submit_into_a_full_folder_are_one_line_and_change_nothing(tmpfs, finished_run, submittable,
                                                                             tmp_path):
    fs = tmpfs("4m")
    shutil.copytree(finished_run / "run", fs / "run")
    board = empty_board(fs / "board")
    fill(fs)
    before = {p: p.read_bytes() for p in (fs / "run").rglob("*") if p.is_file()}
    one_line_error(run_cli(["report", "run"], fs), "No space left on device")
    assert {p: p.read_bytes() for p in (fs / "run").rglob("*") if p.is_file()} == before
    assert temporaries(fs) == []
    one_line_error(run_cli(["leaderboard", "submit", str(submittable / "run"), "--name", "X", "--leaderboard",
                            str(board)], tmp_path), "No space left on device")
    assert list((board / "entries").glob("*")) == []


def test_report_submit_and_build_in_a_read_only_folder_are_one_line(tmpfs, finished_run, submittable, tmp_path):
    fs = tmpfs("4m")
    shutil.copytree(finished_run / "run", fs / "run")
    board = empty_board(fs / "board")
    remount(fs, "ro")
    needle = "Read-only file system; give a folder on a writable file system"
    one_line_error(run_cli(["report", "run"], fs), needle)
    one_line_error(run_cli(["leaderboard", "submit", str(submittable / "run"), "--name", "X", "--leaderboard",
                            str(board)], tmp_path), needle)
    one_line_error(run_cli(["leaderboard", "build", "--leaderboard", str(board)], tmp_path), needle)


def test_report_refuses_a_run_directory_another_process_holds(finished_run, tmp_path):
    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    hold = ("import sys, time\nfrom tmem_bench.harness.rundir import RunDir\n"
            "with RunDir(sys.argv[1]).lock():\n    print('held', flush=True)\n    time.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, "run"], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = (tmp_path / "run" / "report.md").read_bytes()
        refused = run_cli(["report", "run"], tmp_path)
    finally:
        holder.kill()
        holder.wait()
    one_line_error(refused, f"is in use by process {holder.pid}")
    assert (tmp_path / "run" / "report.md").read_bytes() == before and temporaries(tmp_path / "run") == []


def test_a_report_killed_midway_leaves_a_staging_folder_the_next_report_removes(finished_run, tmp_path, capsys):
    from tmem_bench.cli import main

    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    staging = tmp_path / "run" / ".report-k1lled00"
    (staging / "figures").mkdir(parents=True)
    (staging / "report.md").write_text("half a report")
    assert main(["report", str(tmp_path / "run")]) == 0
    assert not staging.exists() and temporaries(tmp_path / "run") == []


def test_jobs_names_a_driver_only_while_it_runs(finished_run, tmp_path, capsys):
    from tmem_bench.cli import main
    from tmem_bench.harness.rundir import RunDir

    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    pid = json.loads((tmp_path / "run" / "jobs.json").read_text())["driver"]["pid"]
    assert main(["jobs", str(tmp_path / "run")]) == 0
    assert f"serial executor: no driver is running; the last one was process {pid}" in capsys.readouterr().out
    with RunDir(tmp_path / "run").lock():
        assert main(["jobs", str(tmp_path / "run")]) == 0
        assert "the cells run under their driver" in capsys.readouterr().out
        assert main(["jobs", str(tmp_path / "run"), "--cancel"]) == 2


def test_jobs_of_slurm_without_submitit_names_the_extra(tmp_path, monkeypatch, capsys):
    import importlib.util

    from tmem_bench.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "submitit" else real(name, *a))
    (tmp_path / "jobs.json").write_text(json.dumps({"executor": "slurm", "driver": {"pid": 1, "host": "h"},
                                                    "cluster": "slurm", "folder": "slurm", "jobs": []}))
    for cancel in ([], ["--cancel"]):
        assert main(["jobs", str(tmp_path), *cancel]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and 'install it with: pip install "tmem-bench[slurm]"' in err[0]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_the_atomic_writer_honours_the_umask(tmp_path, umask, mode):
    from tmem_bench.harness.results import write_atomic

    previous = os.umask(umask)
    try:
        write_atomic(tmp_path / "file", "text")
    finally:
        os.umask(previous)
    assert (tmp_path / "file").stat().st_mode & 0o777 == mode


def test_console_lines_keep_the_variant_in_brackets(tmp_path):
    import io

    from rich.console import Console

    from tmem_bench.harness.plan import make_plan
    from tmem_bench.harness.runner import run_plan

    profile = tiny_profile(tmp_path, extra="variants = [{}, { block_queries = true }]\n")
    console = Console(file=io.StringIO(), width=400)
    run_plan(make_plan("coordinate_binding", profile), tmp_path / "run", device="cpu", console=console)
    lines = [line for line in console.file.getvalue().splitlines() if line.startswith("done ")]
    assert sorted(line.split(":")[0] for line in lines) == [
        "done coordinate_binding [block_queries=True] base @ n_writes=3,noise=0.0 seed 0",
        "done coordinate_binding base @ n_writes=3,noise=0.0 seed 0"]


@pytest.mark.parametrize("name, slug", [("日本語", "日本語"), ("Ünïcödé ☃", "unicode"), ("KV memory (v2)", "kv-memory-v2")])
def test_entry_names_keep_their_letters_in_the_slug(submittable, tmp_path, name, slug, capsys):
    from tmem_bench.cli import main

    board = empty_board(tmp_path / "board")
    assert main(["leaderboard", "submit", str(submittable / "run"), "--name", name, "--leaderboard", str(board)]) == 0
    assert [p.name for p in (board / "entries").iterdir()] == [slug]
    assert json.loads((board / "entries" / slug / "entry.json").read_text())["name"] == name


def test_of_two_entries_of_one_run_the_earlier_submitted_stays_and_a_parenthesis_keeps_its_link(submittable,
                                                                                                tmp_path, capsys):
    from tmem_bench.cli import main
    from tmem_bench.leaderboard import validate

    board = tmp_path / "board"
    shutil.copytree(submittable / "published", board)
    later = board / "entries" / "a-later"  # sorts before "first", which was submitted earlier
    shutil.copytree(board / "entries" / "first", later)
    entry = json.loads((later / "entry.json").read_text())
    entry.update(name="A later", submitted="2999-01-01T00:00:00+00:00",
                 url="https://en.wikipedia.org/wiki/Memory_(computing)")
    (later / "entry.json").write_text(json.dumps(entry))
    result = validate(board)
    assert [path.name for path, _ in result.accepted] == ["first"]
    assert len(result.rejections) == 1 and result.rejections[0].startswith("a-later: cells: duplicate of first")

    shutil.rmtree(board / "entries" / "first")
    assert main(["leaderboard", "build", "--leaderboard", str(board)]) == 0
    assert "[A later](https://en.wikipedia.org/wiki/Memory_%28computing%29)" in (board / "README.md").read_text()
