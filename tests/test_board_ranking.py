"""The board ranks what was trained, and says so: each table is ranked by the score at its models'
training level (the all-level mean is a second column), ties at the shown precision share a rank,
and each table opens with a paragraph naming the task, its variant, the trained level, chance,
ceiling and what the score is."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tmem_bench.leaderboard.board import board_data, markdown

ROOT = Path(__file__).resolve().parents[1]
LEVELS = [5, 10, 20, 50]


def level(w: int) -> str:
    return f"n_writes={w},noise=0.05"


def entry(name: str, means: dict[int, float], trained: tuple[int, ...] = (10,), seeds: int = 3,
          options: dict | None = None) -> tuple[Path, dict]:
    """An accepted entry of coordinate binding with the given mean accuracy per evaluated W, trained
    at `trained` (several: one model per level, each shown at its own, as a capacity profile)."""
    options = options if options is not None else {"block_queries": True, "n_queries": 4, "n_values": 32}
    variant = "block_queries=True" if options.get("block_queries") else "standard"
    rows = []
    for t in trained:
        for w, mean in means.items():
            if len(trained) > 1 and w != t:
                continue
            rows.append({"task": "coordinate_binding", "variant": variant, "train_level": level(t), "level": level(w),
                         "level_values": {"n_writes": w, "noise": 0.05}, "seeds": list(range(seeds)),
                         "mean": mean, "low": mean - 0.01, "high": mean + 0.01, "chance": 1 / 32, "ceiling": 1.0,
                         "n_eval": 1000})
    shown = [r["mean"] for r in rows]
    return Path(name.lower()), {
        "name": name, "url": None, "description": None, "profile": {"id": "study"},
        "model": {"name": name.lower(), "label": name.lower()}, "seeds": list(range(seeds)), "ranked": seeds >= 3,
        "run": {"command": ["tmem-bench", "run"], "cpu": "cpu"}, "devices": ["cpu"], "wall_time_s": 60.0,
        "suite": {"git": {"commit": "0" * 40, "dirty": False}},
        "settings": [{"task": "coordinate_binding", "variant": variant, "task_options": options, "n_params": 1000,
                      "state_size": {"bytes": 64, "seq_len": 14, "fixed": True}}],
        "scores": [{"task": "coordinate_binding", "variant": variant, "levels": len(shown),
                    "score": sum(shown) / len(shown)}],
        "results": rows,
    }


def table(accepted) -> dict:
    (group,) = board_data(accepted)
    return group


def test_ties_at_the_shown_precision_share_a_rank():
    # Trained-level (W=10) accuracy 80.0, 75.0, 75.0 (75.01 and 74.96 both show as 75.0), 70.0.
    group = table([entry("A", {10: 0.80, 20: 0.1}), entry("B", {10: 0.7501, 20: 0.1}),
                   entry("C", {10: 0.7496, 20: 0.9}), entry("D", {10: 0.70, 20: 0.1}),
                   entry("E", {10: 0.99, 20: 0.99}, seeds=1)])
    assert [(r["name"], r["rank"]) for r in group["rows"]] == [("A", 1), ("B", 2), ("C", 2), ("D", 4), ("E", None)]
    text = markdown([group])
    assert re.search(r"^\| 2 \| B \|", text, re.M) and re.search(r"^\| 2 \| C \|", text, re.M)
    assert re.search(r"^\| 4 \| D \|", text, re.M) and "| unranked (1 seed) | E |" in text


def test_the_ranking_column_is_the_score_at_the_trained_level():
    """The issue's case: linear leads the mean over W = 5..50, tensor leads at W=10, where both were trained."""
    linear = entry("Linear", {5: 0.961, 10: 0.874, 20: 0.702, 50: 0.386})
    tensor = entry("Tensor", {5: 0.957, 10: 0.910, 20: 0.689, 50: 0.171})
    group = table([linear, tensor])
    assert [(r["name"], r["rank"]) for r in group["rows"]] == [("Tensor", 1), ("Linear", 2)]
    assert [round(r["score"], 3) for r in group["rows"]] == [0.910, 0.874]
    assert [round(r["mean"], 4) for r in group["rows"]] == [round((0.957 + 0.910 + 0.689 + 0.171) / 4, 4),
                                                           round((0.961 + 0.874 + 0.702 + 0.386) / 4, 4)]
    lines = markdown([group]).splitlines()
    head = next(line for line in lines if line.startswith("| rank |")).split(" | ")
    first = next(line for line in lines if line.startswith("| 1 |")).split(" | ")
    assert head[6:8] == ["trained-level %", "all-level mean %"] and first[1] == "Tensor"
    assert first[6:8] == ["91.0", "68.2"]


def test_every_table_opens_with_what_it_shows():
    group = table([entry("A", {w: 0.5 for w in LEVELS}), entry("B", {w: 0.4 for w in LEVELS})])
    about = group["about"]
    assert about.startswith("Coordinate binding: ")
    for said in ("memory_forcing", "Trained at n_writes=10", "n_writes=5, 10, 20, 50", "noise=0.05",
                 "Chance 3.1%", "ceiling 100.0%", "Ranked by the trained-level score", "all-level mean"):
        assert said in about, (said, about)
    lines = markdown([group]).splitlines()
    heading = next(i for i, line in enumerate(lines) if line.startswith("### "))
    assert next(line for line in lines[heading + 1:] if line) == about


def test_a_capacity_table_ranks_each_model_at_its_own_training_levels():
    group = table([entry("A", {5: 0.9, 10: 0.8, 20: 0.5}, trained=(5, 10, 20)),
                   entry("B", {5: 0.95, 10: 0.6, 20: 0.6}, trained=(5, 10, 20))])
    assert group["kind"] == "capacity" and [r["name"] for r in group["rows"]] == ["A", "B"]
    assert all(abs(r["score"] - r["mean"]) < 1e-12 for r in group["rows"])
    assert "trained at each level" in group["about"]


def test_a_training_level_no_table_evaluates_is_said_and_the_mean_ranks():
    group = table([entry("A", {5: 0.9, 20: 0.1}, trained=(10,)), entry("B", {5: 0.5, 20: 0.4}, trained=(10,))])
    assert [r["name"] for r in group["rows"]] == ["A", "B"] and group["mean_label"] is None
    assert "not among the evaluated levels" in group["about"] and "Ranked by the all-level mean" in group["about"]


def test_the_committed_board_ranks_each_table_by_its_trained_level():
    """Every committed table: rank order is the order of the accuracy at the level(s) each entry was
    trained at, recomputed here from the entries' own results; equal shown scores share a rank."""
    entries = ROOT / "leaderboard" / "entries"
    accepted = [(d, json.loads((d / "entry.json").read_text())) for d in sorted(entries.iterdir())
                if (d / "entry.json").is_file()]
    if not accepted:
        pytest.skip("no entries committed yet")
    for group in board_data(accepted):
        ranked = [r for r in group["rows"] if r["ranked"]]
        trained = {}
        for path, e in accepted:
            rows = [r for r in e["results"] if (e["profile"]["id"], r["task"], r["variant"]) ==
                    (group["profile"], group["task"], group["variant"]) and r["train_level"] == r["level"]]
            if rows:
                trained[path.name] = round(100 * sum(r["mean"] for r in rows) / len(rows), 1)
        shown = [trained[r["slug"]] for r in ranked]
        assert shown == sorted(shown, reverse=True), (group["task"], group["variant"], shown)
        for row in ranked:
            assert row["rank"] == 1 + sum(s > trained[row["slug"]] for s in shown)
        assert "Chance" in group["about"] and "ceiling" in group["about"]
