"""The contract of a task that acts (tmem_bench.contracts.environment): the example task of
docs/bring-a-task.md, read from the page, passes `check --task` and runs one closed-loop cell; the
environment check fails where the contract is broken."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tmem_bench.cli import main
from tmem_bench.contracts.environment import EnvironmentTask, acts
from tmem_bench.diagnostics.conformance_acting import environment_problem
from tmem_bench.registry import get_task

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def first_symbol(tmp_path, monkeypatch):
    """The docs' example task, saved as the page says (first_symbol.py on the path) and imported."""
    page = (ROOT / "docs" / "bring-a-task.md").read_text()
    section = page[page.index("## A task that acts"):]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    (tmp_path / "first_symbol.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield __import__("first_symbol")
    sys.modules.pop("first_symbol", None)


def test_the_docs_task_passes_check_task(first_symbol, capsys):
    assert main(["check", "--task", "first_symbol:FirstSymbol"]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "task first_symbol:FirstSymbol: 9 of 9 checks pass" in out
    assert re.search(r"environment\W+pass\W+acts in its environment at 2 \(variant, level\) pairs", out), out


def test_the_docs_task_runs_one_closed_loop_cell(first_symbol, tmp_path):
    run = tmp_path / "run"
    assert main(["run", "first_symbol:FirstSymbol", "--models", "base", "--level", "length=4", "--steps", "2",
                 "--out", str(run), "--no-report"]) == 0
    (cell,) = [json.loads(p.read_text()) for p in (run / "cells").glob("*.json")]
    (ev,) = cell["eval"]
    loop = ev["closed_loop"]
    assert loop["n_episodes"] == len(loop["returns"]) == 32
    assert -1.0 <= loop["mean_return"] <= 1.0 and loop["forward_passes"] == 1  # observations ignore the actions


def test_an_oracle_acting_in_the_docs_environment_earns_the_most(first_symbol):
    task = first_symbol.FirstSymbol()
    level = {"length": 4}
    assert isinstance(task, EnvironmentTask) and acts(task) and not acts(get_task("coordinate_binding"))
    env = task.make_env(level)
    obs, _ = env.reset(seed=3)
    total, done = 0.0, False
    while not done:
        obs, reward, done, _, _ = env.step(env.symbol)
        total += reward
    assert total == pytest.approx(1.0)


def test_the_environment_check_fails_where_the_contract_is_broken(first_symbol):
    task_class, level = first_symbol.FirstSymbol, {"length": 4}
    assert environment_problem(task_class(), level) is None

    class Drifting(task_class):
        calls = 0

        def closed_loop_seeds(self, level):  # other seeds at every call
            Drifting.calls += 1
            return [Drifting.calls]

    class Late(task_class):
        def rollout(self, level, seed, env=None):
            return {"obs": super().rollout(level, seed, env)["obs"][1:]}  # misses the reset observation

    class OneAction(first_symbol.FirstSymbolAdapter):
        def head(self, h, batch):
            return super().head(h, batch)[:, :1]  # one action per episode, not one per step

    class Short(task_class):
        def make_adapter(self, d_model):
            return OneAction(d_model)

    class Mute(task_class):
        rollout = None

    assert "closed_loop_seeds" in environment_problem(Drifting(), level)
    assert "reset observation" in environment_problem(Late(), level)
    assert "no rollout" in environment_problem(Mute(), level)
    assert "one action per step" in environment_problem(Short(), level)
