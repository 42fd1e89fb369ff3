"""The report's tables: the summary (its intervals, cost and probe verdict, a leaking model marked) and the
console summary of a run's results."""
import json

import pytest

from tests.report.helpers import CB_SUPPORT, NOISES, RunBuilder
from tmem_bench.report import load_run, mean_ci, run_data, summary_frame, summary_rich


def test_summary_rows_have_ci_cost_and_probe(report):
    s = report.summary
    row = s[(s["task"] == "coordinate_binding") & (s["series"] == "tensor") & (s["level"] == "n_writes=50,noise=0.0")]
    assert len(row) == 1
    row = row.iloc[0]
    assert (row["accuracy"], row["low"], row["high"]) == mean_ci(CB_SUPPORT[(50, "tensor")])
    assert row["memory off"] == pytest.approx(1 / 32) and row["seeds"] == 3
    assert row["steps/s"] == 2.0 and row["wall s"] == 15.0 and row["probe"] == "causal"
    # Summary lists where models were trained (the per-level training view), sorted by level.
    cb = s[(s["task"] == "coordinate_binding") & (s["series"] == "base")]
    assert list(cb["level"]) == [f"n_writes={w},noise={n}" for w in (5, 20, 50) for n in NOISES]


def test_console_summary_from_runner_results(tmp_path):
    from rich.console import Console

    b = RunBuilder(tmp_path)
    for seed in range(2):
        b.cell("map_building", "tensor", seed, (16,), {(16,): 0.7 + 0.1 * seed}, memory_off={(16,): 0.5},
               gates={"layer0": 0.6, "layer1": 0.4})
    b.cell("map_building", "tensor", 0, (8,), {(8,): 0.9}, variant="block_queries=True", memory_off={(8,): 0.5},
           gates={"layer0": 0.6, "layer1": 0.4})
    results = [json.loads(p.read_text()) for p in sorted((tmp_path / "cells").glob("*.json"))]
    console = Console(width=200, record=True)
    console.print(summary_rich(run_data(results)))
    text = console.export_text()
    assert "map_building: accuracy" in text and "map_building [block_queries=True]: accuracy" in text
    # Two seeds, 70% and 80%: the t interval (1 degree of freedom) reaches past 100, where no mean can lie.
    assert "75.0% [11.5, 100.0]" in text and "50.0%" in text and "90.0%" in text


def test_a_leaking_backbone_is_marked_everywhere(tmp_path):
    b = RunBuilder(tmp_path)
    b.cell("occlusion", "lstm", 0, (0,), {(0,): 0.9, (6,): 0.9}, probe="leaking")
    b.cell("map_building", "lstm", 0, (16,), {(16,): 0.7})
    b.cell("map_building", "base", 0, (16,), {(16,): 0.7})
    s = summary_frame(load_run(tmp_path))
    assert set(s[s["label"] == "lstm"]["probe"]) == {"leaking"}
    assert set(s[s["label"] == "base"]["probe"]) == {"causal"}
