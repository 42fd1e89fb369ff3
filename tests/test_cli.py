import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "tmem_bench.cli"]


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
    (["run", "coordinate_binding", "--profile", "nope"], "unknown profile 'nope'; known:"),
    (["run", "coordinate_binding", "--steps", "0"], "--steps: must be positive, got 0"),
    (["run", "coordinate_binding", "--batch-size", "-4"], "--batch-size: must be positive, got -4"),
    (["run", "coordinate_binding", "--steps", "ten"], "--steps: 'ten' is not an integer"),
    (["run", "coordinate_binding", "--level", "n_writes"], "--level 'n_writes' is malformed"),
    (["run", "coordinate_binding", "--level", "n_writes=5,x"], "'x' is not a number"),
    (["run", "coordinate_binding", "--level", "n_writes=0"], "n_writes must be an integer >= 1"),
    (["run", "coordinate_binding", "--level", "depth=3"], "has no axis 'depth'; its axes: n_writes, noise"),
    (["run", "coordinate_binding", "--seeds", "a,b"], "--seeds 'a,b' is malformed"),
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


def test_tiny_end_to_end_run_writes_a_results_table(tmp_path):
    exe = shutil.which("tmem-bench")
    assert exe, "the tmem-bench command is not installed"
    out = tmp_path / "run"
    args = ["run", "coordinate_binding", "--models", "base", "--steps", "3", "--batch-size", "8",
            "--level", "n_writes=4", "--seeds", "0,1", "--out", str(out)]
    proc = subprocess.run([exe] + args, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out / "results.csv")
    n_variants = table["variant"].nunique()
    assert sorted(table["seed"]) == [0] * n_variants + [1] * n_variants
    assert set(table["n_writes"]) == {4}
    assert (table["chance"] == 1 / 32).all() and (table["ceiling"] == 1.0).all()
    assert len(list((out / "cells").glob("*.json"))) == 2 * n_variants
    assert (out / "manifest.json").exists()
    assert "resuming" not in proc.stderr
    again = subprocess.run([exe] + args, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    n = 2 * n_variants
    assert again.returncode == 0 and f"resuming: {n} of {n} cells already finished" in again.stderr


def test_cli_py_from_the_clone_and_list(tmp_path):
    # -S skips site directories, so the editable install's finder is not there: cli.py alone
    # must find tasks/ and baselines/; the dependencies come through PYTHONPATH.
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    proc = subprocess.run([sys.executable, "-S", str(ROOT / "cli.py"), "list"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    for word in ("coordinate_binding", "n_writes", "quick", "paper", "base"):
        assert word in proc.stdout
