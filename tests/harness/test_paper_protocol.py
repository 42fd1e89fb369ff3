"""The paper_protocol profile against docs/tasks.md's table of the authors' settings: the suite's
column is what the profile plans, a row says why wherever the authors' value and the suite's differ
(and only there), and every family covers the settings that make its protocol (each model's lr:
tests/harness/test_profile_lrs.py)."""
from __future__ import annotations

import json
import re
import tomllib

import pytest

from tests.helpers import ROOT
from tmem_bench.harness.plan import plan_run
from tmem_bench.harness.profiles import load_profile
from tmem_bench.registry import get_task

PROFILE = "paper_protocol"
DOC = ROOT / "docs" / "tasks.md"
SECTION = "## The authors' protocol, point by point"
COLUMNS = ("setting", "key", "authors", "suite", "why")
# What a family's table must give, beyond one `trained_at.AXIS` and one `levels.AXIS` row per axis.
REQUIRED = ("models", "model.d_model", "model.n_layers", "model.n_heads", "model.dropout", "train.steps",
            "train.early_stop", "train.batch_size", "train.lr", "train.weight_decay", "train.grad_clip",
            "train.eval_size", "seeds")


def family_tables(text: str) -> dict[str, list[dict]]:
    """Task name -> its table's rows (dicts over COLUMNS) from the section of docs/tasks.md."""
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    tables = {}
    for chunk in section.split("\n### ")[1:]:
        heading, *lines = chunk.splitlines()
        name = re.search(r"\(`(\w+)`\)", heading).group(1)
        rows = [line for line in lines if line.startswith("|")][2:]  # past the header and its rule
        tables[name] = [dict(zip(COLUMNS, (c.strip() for c in row.strip("|").split("|")), strict=True))
                        for row in rows]
    return tables


def value(text: str):
    """A table cell's TOML value (in backticks)."""
    return tomllib.loads(f"v = {text.strip('`')}")["v"]


def _one(values, key: str):
    distinct = {json.dumps(v, sort_keys=True) for v in values}
    assert len(distinct) == 1, f"{key}: the planned cells differ ({sorted(distinct)})"
    return values[0]


def planned(key: str, task: str, plan) -> object:
    """The value of `key` in the cells the profile plans for `task` (see the table's keys)."""
    cells = plan.cells
    if key == "models":
        return list(dict.fromkeys(c.label for c in cells))
    if key == "seeds":
        return sorted({c.seed for c in cells})
    kind, name = key.split(".", 1)
    if kind == "model":
        return _one([c.model_options.get(name) for c in cells], key)
    if kind == "task":
        return _one([get_task(task, **c.task_options).options().get(name) for c in cells], key)
    if kind in ("levels", "trained_at"):
        levels = [lv for c in cells for lv in c.eval_levels] if kind == "levels" else [c.train_level for c in cells]
        return sorted({lv[name] for lv in levels})
    if key == "train.early_stop":
        return _one(["early_stop" in c.train for c in cells], key)
    if key == "train.lr" and plan.searches:
        return _one([list(s.grid) for s in plan.searches], key)
    # A training setting: one value, else one per model (a table), else one per trained level (a list).
    values = {(c.label, json.dumps(c.train_level, sort_keys=True)): c.train[name] for c in cells}
    if len(set(values.values())) == 1:
        return next(iter(values.values()))
    for axis, at in ((0, lambda labels: dict(labels)), (1, lambda levels: [v for _, v in levels])):
        groups = {}
        for k, v in values.items():
            groups.setdefault(k[axis], set()).add(v)
        if all(len(g) == 1 for g in groups.values()):
            return at([(k, g.pop()) for k, g in groups.items()])
    raise AssertionError(f"{key}: varies by both model and level")


def mismatches(tables: dict[str, list[dict]], profile: str) -> list[str]:
    """Every way the tables and the profile disagree, as messages (empty when they match)."""
    found = []
    listed = set(load_profile(profile)["tasks"])
    if set(tables) != listed:
        found.append(f"tables for {sorted(tables)}, profile tasks {sorted(listed)}")
    for task in sorted(set(tables) & listed):
        plan = plan_run(task, profile)
        keyed = {row["key"].strip("`"): row for row in tables[task] if row["key"] != "-"}
        axes = get_task(task).axes
        for key in (*REQUIRED, *(f"{kind}.{a}" for a in axes for kind in ("trained_at", "levels"))):
            if key not in keyed:
                found.append(f"{task}: no row for {key}")
        for key, row in keyed.items():
            suite, authors = value(row["suite"]), value(row["authors"])
            if planned(key, task, plan) != suite:
                found.append(f"{task}: {key} is {planned(key, task, plan)!r} in the profile, {suite!r} in the table")
            if (authors == suite) != row["why"].startswith("-"):
                found.append(f"{task}: {key} differs ({authors!r} against {suite!r}) without a reason"
                             if authors != suite else f"{task}: {key} is the same yet gives a reason")
        for row in tables[task]:
            if row["key"] == "-" and not row["why"]:
                found.append(f"{task}: row {row['setting']!r} says nothing in its last column")
    return found


@pytest.fixture(scope="module")
def tables():
    return family_tables(DOC.read_text())


def test_the_profile_is_the_table_of_the_authors_settings(tables):
    assert set(tables) == {"coordinate_binding", "occlusion", "map_building", "no_harm"}
    assert mismatches(tables, PROFILE) == []


def test_every_level_is_trained_and_the_authors_sweeps_are_kept(tables):
    for task, rows in tables.items():
        plan = plan_run(task, PROFILE)
        for axis in get_task(task).axes:
            assert planned(f"trained_at.{axis}", task, plan) == planned(f"levels.{axis}", task, plan)
        sweep = [r for r in rows if r["key"].strip("`").startswith("trained_at.")]
        if task != "coordinate_binding":  # coordinate binding reads one of the authors' three noises
            assert all(value(r["authors"]) == value(r["suite"]) for r in sweep), task


@pytest.mark.parametrize("change, message", [
    (("occlusion", "model.d_model", "suite", "`33`"), "occlusion: model.d_model is 32 in the profile, 33"),
    (("map_building", "model.d_model", "why", "-"), "map_building: model.d_model differs (96 against 64)"),
    (("no_harm", "model.d_model", "why", "because"), "no_harm: model.d_model is the same yet gives a reason"),
    (("coordinate_binding", "train.steps", "suite", "`1200`"), "coordinate_binding: train.steps is [600, 1000"),
    (("map_building", "train.lr", "key", "-"), "map_building: no row for train.lr"),
])
def test_the_check_finds_a_wrong_row(tables, change, message):
    task, key, column, text = change
    changed = json.loads(json.dumps(tables))
    (row,) = [r for r in changed[task] if r["key"].strip("`") == key]
    row[column] = text
    assert any(m.startswith(message) for m in mismatches(changed, PROFILE)), mismatches(changed, PROFILE)


def test_the_check_finds_another_profile(tables):
    found = mismatches(tables, "paper_claims")
    assert any("tables for" in m for m in found)
    assert any(m.startswith("occlusion: trained_at.occlusion_len") for m in found)

