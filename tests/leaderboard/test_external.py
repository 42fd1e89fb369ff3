"""The external part of the board (issue 45): where an entry's cells acted in an environment, its
results carry the normalised return over seeds with its interval, and the board draws one table per
profile across the environments, ranked by that return, opening with a paragraph that links the
validity table; a board without such entries is drawn as before (test_board's committed-board test)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers import empty_board
from tmem_bench.cli import main
from tmem_bench.leaderboard.about import VALIDITY_LINK
from tmem_bench.leaderboard.board import board_data, markdown
from tmem_bench.leaderboard.entry import aggregate
from tmem_bench.leaderboard.page import render_page

from .test_board import entry as toy_entry


def _results(returns: list[float] | None, accuracy: float = 0.6) -> list[dict]:
    """One cell result per seed at difficulty 1, with a closed-loop return where `returns` gives one."""
    level = {"difficulty": 1}
    out = []
    for seed, ret in enumerate(returns or [None, None, None]):
        ev = {"level": level, "level_key": "difficulty=1", "accuracy": accuracy, "chance": 0.25, "ceiling": 1.0,
              "n": 256}
        if ret is not None:
            ev["closed_loop"] = {"mean_return": ret, "returns": [ret], "n_episodes": 1, "seeds_fingerprint": "0"}
        out.append({"cell": {"task": "popgym_repeat_first", "variant": "standard", "train_level": level,
                             "eval_levels": [level], "seed": seed}, "eval": [ev]})
    return out


def test_a_row_carries_the_return_only_where_its_cells_acted_in_an_environment():
    from tmem_bench.report.stats import mean_ci

    returns = [0.2, 0.4, 0.3]
    (row,), _ = aggregate(_results(returns))
    mean, low, high = mean_ci(returns)
    assert row["normalised_return"] == pytest.approx({"mean": mean, "low": low, "high": high})
    (row,), _ = aggregate(_results(None))
    assert "normalised_return" not in row
    # A t interval of few seeds near the oracle's return reaches past 1; the return's range is [-1, 1].
    (row,), _ = aggregate(_results([0.98, 1.0, 1.0]))
    assert row["normalised_return"]["high"] == 1.0 and row["normalised_return"]["low"] > -1.0
    (row,), _ = aggregate(_results([-1.0, -1.0, -0.96]))
    assert row["normalised_return"]["low"] == -1.0
    # An episode's sum of rewards may pass 1 by a rounding error; the stored return stays in POPGym's range.
    (row,), _ = aggregate(_results([1.0000000000000007] * 3))
    assert row["normalised_return"] == {"mean": 1.0, "low": 1.0, "high": 1.0}


def external_entry(name: str, per_column: dict[tuple[str, int], tuple[float, float]], seeds: int = 3,
                   profile: str = "external") -> tuple[Path, dict]:
    """An accepted entry trained at each (task, difficulty) it is read at, with (return, accuracy) there."""
    rows, settings, scores = [], {}, {}
    for (task, difficulty), (ret, accuracy) in per_column.items():
        level = f"difficulty={difficulty}"
        rows.append({"task": task, "variant": "standard", "train_level": level, "level": level,
                     "level_values": {"difficulty": difficulty}, "seeds": list(range(seeds)),
                     "mean": accuracy, "low": accuracy - 0.01, "high": accuracy + 0.01, "chance": 0.25,
                     "ceiling": 1.0, "n_eval": 256,
                     "normalised_return": {"mean": ret, "low": ret - 0.02, "high": ret + 0.02}})
        settings[task] = {"task": task, "variant": "standard", "task_options": {"closed_loop_episodes": 32},
                          "n_params": 1000, "state_size": {"bytes": 64, "seq_len": 51, "fixed": True}}
        scores.setdefault(task, []).append(accuracy)
    return Path(name.lower()), {
        "name": name, "url": None, "description": None, "profile": {"id": profile},
        "model": {"name": name.lower(), "label": name.lower()}, "seeds": list(range(seeds)), "ranked": seeds >= 3,
        "run": {"command": ["tmem-bench", "run"], "cpu": "cpu"}, "devices": ["cpu"], "wall_time_s": 60.0,
        "suite": {"git": {"commit": "0" * 40, "dirty": False}},
        "settings": list(settings.values()),
        "scores": [{"task": t, "variant": "standard", "levels": len(v), "score": sum(v) / len(v)}
                   for t, v in scores.items()],
        "results": rows,
    }


RF, RP = "popgym_repeat_first", "popgym_repeat_previous"


def test_the_external_table_ranks_by_return_not_accuracy():
    """Higher return ranks first even with lower accuracy; equal returns at two decimals share a rank;
    an entry trained at each difficulty is not also a capacity curve; toy tables are as before."""
    accepted = [
        external_entry("Accurate", {(RF, 1): (0.10, 0.90), (RP, 1): (0.20, 0.90), (RP, 2): (0.00, 0.90)}),
        external_entry("Acting", {(RF, 1): (0.80, 0.40), (RP, 1): (0.60, 0.40), (RP, 2): (0.40, 0.40)}),
        external_entry("Tied", {(RF, 1): (0.801, 0.30), (RP, 1): (0.60, 0.30), (RP, 2): (0.40, 0.30)}),
        toy_entry("Toy", {5: 0.9, 10: 0.8}),
    ]
    groups = board_data(accepted)
    assert [g["kind"] for g in groups] == ["memory forcing", "external"]
    (group,) = [g for g in groups if g["kind"] == "external"]
    assert group["levels"] == [f"{RF}@difficulty=1", f"{RP}@difficulty=1", f"{RP}@difficulty=2"]
    assert [(r["name"], r["rank"]) for r in group["rows"]] == [("Acting", 1), ("Tied", 1), ("Accurate", 3)]
    assert group["rows"][0]["score"] == pytest.approx(0.6)
    assert group["rows"][-1]["accuracy"] == pytest.approx(0.9)

    text = markdown(groups)
    assert "## External: POPGym's environments (profile external)" in text
    assert f"[the validity table]({VALIDITY_LINK})" in text and VALIDITY_LINK == \
        "../docs/external-validity.md#validity-measured"
    line = next(ln for ln in text.splitlines() if ln.startswith("| 1 | Acting"))
    assert "+0.60" in line and "+0.80 [+0.78, +0.82]" in line and "%" not in line
    assert "| rank | entry | model | seeds | mean normalised return | mean accuracy % |" in text
    about = group["about"]
    assert "oracle" in about and "closed loop" in about and "-1 always wrong" in about and RP in about

    page = render_page(json.dumps(groups, sort_keys=True))
    assert "returnColumns(group)" in page and "toFixed(2)" in page and "group.link" in page
    toy_only = render_page(json.dumps(board_data(accepted[-1:]), sort_keys=True))
    # One script draws both; only the how-to-read text about returns is left out of a board without them.
    assert "In the external part" not in toy_only and "In the external part" in page


def test_memory_forcing_columns_are_marked_and_said_to_join_the_mean():
    forced = external_entry("Forced", {(RF, 1): (0.5, 0.7), (RP, 1): (0.1, 0.4)})
    for part in ("results", "settings", "scores"):
        forced[1][part][1]["variant"] = "block_past=True"
    (group,) = board_data([forced])
    assert group["levels"] == [f"{RF}@difficulty=1", f"{RP} [block_past=True]@difficulty=1"]
    assert group["rows"][0]["score"] == pytest.approx(0.3)
    assert "memory-forcing variant" in group["about"] and "standard ones alike" in group["about"]
    (plain,) = board_data([external_entry("Plain", {(RF, 1): (0.5, 0.7)})])
    assert "memory-forcing" not in plain["about"]


def test_profiles_of_external_entries_get_a_table_each():
    accepted = [external_entry("A", {(RF, 1): (0.5, 0.7)}), external_entry("B", {(RF, 1): (0.4, 0.7)}, profile="x")]
    groups = board_data(accepted)
    assert [(g["profile"], [r["name"] for r in g["rows"]]) for g in groups] == [("external", ["A"]), ("x", ["B"])]


def test_a_tiny_external_run_submits_validates_and_draws_its_part(tmp_path, capsys):
    """Two models, one seed, two steps on RepeatFirst Easy: submit carries the returns, validate
    re-earns them from the weights and rebuilds the new fields, build draws the external table."""
    pytest.importorskip("popgym")
    run_dir = tmp_path / "run"
    assert main(["run", "popgym_repeat_first", "--profile", "external", "--models", "base,lstm", "--seeds", "1",
                 "--steps", "2", "--out", str(run_dir), "--no-report"]) == 0
    board = empty_board(tmp_path)
    assert main(["leaderboard", "submit", str(run_dir), "--name", "Ext", "--leaderboard", str(board)]) == 0
    for slug in ("ext-base", "ext-lstm"):
        stored = json.loads((board / "entries" / slug / "entry.json").read_text())
        (row,) = stored["results"]
        assert set(row["normalised_return"]) == {"mean", "low", "high"}
        assert row["normalised_return"]["low"] == row["normalised_return"]["mean"]  # one seed: a point
    assert main(["leaderboard", "build", "--leaderboard", str(board), "--full"]) == 0
    readme = (board / "README.md").read_text()
    # --steps makes the profile its own (external~hash), ranked only against itself.
    assert re.search(r"^## External: POPGym's environments \(profile external~[0-9a-f]{8}\)$", readme, re.M)
    assert "Capacity" not in readme
    assert f"{RF}@difficulty=1" in readme and VALIDITY_LINK in readme
    assert "returnColumns" in (board / "index.html").read_text()

    # An edited return is rejected, named as the field validation rebuilds.
    path = board / "entries" / "ext-lstm" / "entry.json"
    forged = json.loads(path.read_text())
    forged["results"][0]["normalised_return"]["mean"] = 0.99
    forged["results"][0]["normalised_return"]["high"] = 0.99
    path.write_text(json.dumps(forged))
    capsys.readouterr()
    assert main(["leaderboard", "validate", str(board), "--full"]) == 1
    out = capsys.readouterr()
    assert "ext-lstm: results[0].normalised_return.high: claims 0.99" in out.err
