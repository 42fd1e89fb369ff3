"""The worked plug-in (examples/kv_memory): installed as a package, it is a model like the suite's own."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "kv_memory"
TINY = """
[train]
steps = 2
batch_size = 8
lr = 1e-3
weight_decay = 0.0
grad_clip = 1.0
log_every = 1
eval_size = 32
seeds = [0]

[tasks.coordinate_binding]
models = ["base"]
model = { d_model = 16, n_layers = 1, n_heads = 2, dropout = 0.0 }
levels = { n_writes = [2, 4], noise = [0.05] }
train_at = { n_writes = 2 }
variants = [{}, { block_queries = true }]
"""


def test_example_is_small():
    lines = (EXAMPLE / "kv_memory.py").read_text().splitlines()
    assert len(lines) < 100


def test_installed_example_is_listed_checked_and_run(tmp_path):
    source = tmp_path / "kv_memory"
    shutil.copytree(EXAMPLE, source)  # the build writes into its source folder; keep the repository clean
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(site), str(source)], check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}  # two cores shared with other tests
    tool = [sys.executable, "-c", "import sys; from tmem_bench.cli import main; sys.exit(main())"]

    def bench(*args):
        return subprocess.run([*tool, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)

    listed = bench("list")
    assert listed.returncode == 0, listed.stderr
    assert "kv_memory" in next(line for line in listed.stdout.splitlines() if line.startswith("models"))

    checked = bench("check", "kv_memory")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "kv_memory: 9 of 9 checks pass" in checked.stdout and "fixed: " in checked.stdout

    (tmp_path / "tiny.toml").write_text(TINY)
    run = bench("run", "coordinate_binding", "--models", "kv_memory", "--profile", "tiny.toml", "--steps", "2",
                "--out", "run", "--no-report")
    assert run.returncode == 0, run.stderr
    assert len(list((tmp_path / "run" / "cells").glob("*.json"))) == 2  # both variants

