"""Profiles that train each model at the lr another run chose for it on validation data, per family
(or per family, variant and training level): every model the profile trains at one lr is trained at
the lr that run's selection.json chose for it there, and every model the profile names and that run
chose for is trained at it (a model the profile searches a grid for instead chooses its own)."""
from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT
from tmem_bench.contracts.task import level_key
from tmem_bench.harness.plan import plan_run
from tmem_bench.harness.profiles import load_profile

# profile -> the committed run whose selection it takes
SOURCES = {"paper_protocol": "paper_claims", "paper_gpu": "paper_claims", "study_retrain": "study_converge"}


@pytest.mark.parametrize("profile,source", sorted(SOURCES.items()))
def test_each_model_trains_at_the_lr_its_source_run_chose(profile, source):
    searches = json.loads((ROOT / "docs" / "runs" / source / "selection.json").read_text())["searches"]
    chosen = {(s["task"], s["label"]): s["chosen_lr"] for s in searches}
    tasks = [t for t in load_profile(profile)["tasks"] if any(task == t for task, _ in chosen)]
    assert tasks, f"{profile} trains no family {source} chose lrs for"
    for task in tasks:
        plan = plan_run(task, profile)
        searched = {s.trials[0].label for s in plan.searches}
        fixed = {}
        for c in (c for c in plan.cells if c.label not in searched):
            fixed.setdefault((task, c.label), set()).add(c.train["lr"])
        assert fixed == {k: {lr} for k, lr in chosen.items() if k[0] == task and k in fixed}, task
        assert {label for t, label in chosen if t == task} <= {label for _, label in fixed} | searched, task


# profile -> the committed run whose selection it takes, chosen per training level
SOURCES_BY_LEVEL = {"validity_external_long": "validity_external"}


@pytest.mark.parametrize("profile,source", sorted(SOURCES_BY_LEVEL.items()))
def test_each_model_trains_at_the_lr_its_source_run_chose_at_each_level(profile, source):
    searches = json.loads((ROOT / "docs" / "runs" / source / "selection.json").read_text())["searches"]
    chosen = {(s["task"], s["variant"], s["train_level"], s["label"]): s["chosen_lr"] for s in searches}
    for task in load_profile(profile)["tasks"]:
        trained = {}
        for c in plan_run(task, profile).cells:
            trained.setdefault((task, c.variant, level_key(c.train_level), c.label), set()).add(c.train["lr"])
        assert trained and all(key in chosen for key in trained), task
        assert trained == {key: {chosen[key]} for key in trained}, task
        variants = {variant for _, variant, _, _ in trained}
        assert {key for key in chosen if key[0] == task and key[1] in variants} <= set(trained), task
