"""The command line's errors: bad input of every kind (arguments, profiles, plug-ins, run directories,
boards, jobs records) is one line, exit 2, no traceback and nothing written, in this process and in a
real one, and --debug shows the plug-in author's traceback; cli.py runs from the clone."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.helpers import CLI, ROOT, new_board
from tests.profiles import one_cell


def run(args, cwd):
    return subprocess.run(CLI + args, capture_output=True, text=True, cwd=cwd, timeout=300)


def run_in_process(args, cwd, capsys, monkeypatch):
    from tmem_bench.cli import main

    monkeypatch.chdir(cwd)
    try:
        code = main(args)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("args, needle", [
    (["run", "nope"], "unknown task 'nope'; known: coordinate_binding"),
    (["run", "coordinate_binding", "--models", "base,nope"], "unknown model 'nope'; known: base"),
    (["run", "coordinate_binding", "--models", "nomodule:thing"], "cannot load model 'nomodule:thing'"),
    (["run", "all", "--profile", "validity_toy", "--models", "tensor,tensor_grid9"],
     "unknown model 'tensor_grid9'; known: base"),
    (["run", "all", "--profile", "validity_toy", "--models", "tensor_grid9"], "the profile's labels tensor_channels8"),
    (["run", "coordinate_binding", "--profile", "nope"], "unknown profile 'nope'; known:"),
    (["run", "coordinate_binding", "--steps", "0"], "--steps: must be positive, got 0"),
    (["run", "coordinate_binding", "--batch-size", "-4"], "--batch-size: must be positive, got -4"),
    (["run", "coordinate_binding", "--steps", "ten"], "--steps: 'ten' is not an integer"),
    (["run", "coordinate_binding", "--level", "n_writes"], "--level 'n_writes' is malformed"),
    (["run", "coordinate_binding", "--level", "n_writes=5,x"], "'x' is not a number"),
    (["run", "coordinate_binding", "--level", "n_writes=0"], "n_writes must be an integer >= 1"),
    (["run", "coordinate_binding", "--level", "depth=3"], "has no axis 'depth'; its axes: n_writes, noise"),
    (["run", "coordinate_binding", "--seed-list", "a,b"], "--seed-list 'a,b' is malformed"),
    (["run", "coordinate_binding", "--seeds", "3,4"], "--seeds '3,4' is not a count (3 runs seeds 0, 1, 2); for the "
                                                      "seeds 3,4 themselves give --seed-list 3,4"),
    (["run", "coordinate_binding", "--seeds", "2", "--seed-list", "3"], "--seeds (a count) and --seed-list"),
    (["run", "coordinate_binding", "--seeds", "0"], "--seeds count must be positive"),
    (["run", "coordinate_binding", "--train-at", "n_writes"], "--train-at 'n_writes' is malformed"),
    (["run", "coordinate_binding", "--device", "tpu"], "invalid choice: 'tpu'"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, needle, capsys, monkeypatch):
    out = tmp_path / "run"
    code, err = run_in_process(args + ["--out", str(out)], tmp_path, capsys, monkeypatch)
    assert code == 2, err
    assert needle in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists() and not (tmp_path / "runs").exists()


def test_bad_input_in_a_real_process_has_no_traceback(tmp_path):
    proc = run(["run", "coordinate_binding", "--models", "nope"], cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("tmem-bench: error: unknown model 'nope'") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_malformed_profile_file(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nsteps = 3")
    code, err = run_in_process(["run", "coordinate_binding", "--profile", str(bad)], tmp_path, capsys, monkeypatch)
    assert code == 2 and "is not valid TOML" in err
    assert len(err.strip().splitlines()) == 1


def test_cuda_request_without_cuda(tmp_path, capsys, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    code, err = run_in_process(["run", "coordinate_binding", "--device", "cuda"], tmp_path, capsys, monkeypatch)
    assert code == 2 and "no CUDA device" in err


def test_cli_py_from_the_clone_and_list(tmp_path):
    # -S skips site directories, so the editable install's finder is not there: cli.py alone
    # must find tasks/ and baselines/; the dependencies come through PYTHONPATH.
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    proc = subprocess.run([sys.executable, "-S", str(ROOT / "cli.py"), "list"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    for word in ("coordinate_binding", "n_writes", "quick", "paper", "base"):
        assert word in proc.stdout


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


def profile_with(folder: Path, text: str, name: str = "bad.toml") -> str:
    path = folder / name
    path.write_text(text)
    return str(path)


def replace_line(key: str, line: str) -> str:
    body = one_cell()
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
     "n_writes must be an integer from 1 to 2147483647"),
    ("batch-unallocatable", ["run", "coordinate_binding", "--batch-size", "1000000000"], "GiB needed"),
    ("seeds-count-huge", ["run", "coordinate_binding", "--seeds", "3000000000"], "--seeds count must be at most"),
    ("seeds-repeated", ["run", "coordinate_binding", "--seed-list", "0,0"], "seeds list 0 more than once"),
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


@pytest.fixture
def inputs(tmp_path, monkeypatch, submittable):
    """The files the malformed command lines name, in their own folder; the command runs in another."""
    files = tmp_path / "inputs"
    files.mkdir()
    (files / "folder.toml").mkdir()
    profile_with(files, replace_line("model", 'model = { d_model = 16, n_layers = 1, n_heads = 2, dropout = "lots" }'),
                 "dropout.toml")
    new_board(files / "board")
    shutil.copytree(submittable / "published", files / "published")
    (new_board(files / "notutf8") / "entries" / "notutf8").mkdir(parents=True)
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
    profile_with(files, one_cell() + "train = 5\n", "train5.toml")
    profile_with(files, replace_line("levels", 'levels = "5,10"'), "levels.toml")
    profile_with(files, replace_line("models", "models = []"), "nomodels.toml")
    profile_with(files, replace_line("seeds", "seeds = [1, 1]"), "seeds.toml")
    profile_with(files, one_cell().replace("coordinate_binding]", "mapbuilding]"),
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
        "early_stop, eval_size, grad_clip, log_every, lr, mixed_levels, seeds, selection_second_seed, steps, "
        "weight_decay"]
    assert tree(work) == []


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_the_version_flag_prints_the_version(flag, capsys):
    """Issue 57: `-V` said "the following arguments are required: command"."""
    from tmem_bench.cli import main
    from tmem_bench.version import __version__

    with pytest.raises(SystemExit) as done:
        main([flag])
    assert done.value.code == 0 and capsys.readouterr().out == f"tmem-bench {__version__}\n"
