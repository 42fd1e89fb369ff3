"""What the executors' tests share: a plug-in model that fails, dies or waits on request, a tiny
sweep's profile, and the numbers that must not depend on the executor."""
from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from rich.console import Console

from tests.profiles import tiny_profile
from tmem_bench.harness.rundir import RunDir

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
