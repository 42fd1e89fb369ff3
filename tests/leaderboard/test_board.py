"""The board ranks what was trained, and says so: each table is ranked by the score at its models'
training level (the all-level mean is a second column), ties at the shown precision share a rank,
and each table opens with a paragraph naming the task, its variant, the trained level, chance,
ceiling and what the score is. Tables come memory forcing first, then capacity, then the standard
variants, levels in order of value; a preview draws a run beside the board and leaves it alone; the
committed board rebuilds to its committed files."""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, empty_board
from tests.leaderboard.helpers import tiny_run
from tmem_bench.cli import main
from tmem_bench.leaderboard.board import board_data, markdown
from tmem_bench.registry import TASKS

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
    trained at (an external table: of the normalised return there), recomputed here from the entries'
    own results; equal shown scores share a rank."""
    entries = ROOT / "leaderboard" / "entries"
    accepted = [(d, json.loads((d / "entry.json").read_text())) for d in sorted(entries.iterdir())
                if (d / "entry.json").is_file()]
    if not accepted:
        pytest.skip("no entries committed yet")
    for group in board_data(accepted):
        external = group["kind"] == "external"
        ranked = [r for r in group["rows"] if r["ranked"]]
        trained = {}
        for path, e in accepted:
            rows = [r for r in e["results"] if e["profile"]["id"] == group["profile"] and r["train_level"] == r["level"]
                    and (("normalised_return" in r) if external else
                         (r["task"], r["variant"]) == (group["task"], group["variant"]))]
            if rows and external:
                trained[path.name] = round(sum(r["normalised_return"]["mean"] for r in rows) / len(rows), 2)
            elif rows:
                trained[path.name] = round(100 * sum(r["mean"] for r in rows) / len(rows), 1)
        shown = [trained[r["slug"]] for r in ranked]
        assert shown == sorted(shown, reverse=True), (group["task"], group["variant"], shown)
        for row in ranked:
            assert row["rank"] == 1 + sum(s > trained[row["slug"]] for s in shown)
        assert ("normalised return" if external else "Chance") in group["about"]
        assert external or "ceiling" in group["about"]


def _rebuilds_to_the_committed_files(tmp_path) -> None:
    committed = ROOT / "leaderboard"
    if not list((committed / "entries").glob("*/entry.json")):
        pytest.skip("no entries committed yet")
    extras = sorted({TASKS.extra_of(s["task"]) for path in (committed / "entries").glob("*/entry.json")
                     for s in json.loads(path.read_text())["settings"]} - {None})
    if extras:  # build then exits 3, naming the extra: the board is drawn only once every entry is checked
        pytest.skip(f"the committed board has entries of the {', '.join(extras)} extra, not installed here: "
                    f"pip install -e '.[{','.join(extras)}]'")
    copy = tmp_path / "leaderboard"
    shutil.copytree(committed, copy)
    # build validates every entry first and writes nothing when one is rejected: one pass, not two;
    # --full: this machine's validation records may hold the committed entries, which are re-evaluated whole
    assert main(["leaderboard", "build", "--leaderboard", str(copy), "--full"]) == 0
    for name in ("README.md", "index.html"):
        stale = f"leaderboard/{name} is stale: run tmem-bench leaderboard build"
        assert (copy / name).read_text() == (committed / name).read_text(), stale


@pytest.mark.slow
def test_the_committed_board_validates_and_rebuilds_to_the_same_files(tmp_path):
    _rebuilds_to_the_committed_files(tmp_path)


def test_the_committed_board_rebuilds_to_the_same_files_from_its_cells(tmp_path, monkeypatch):
    """Every check of validate but the re-evaluation from weights and the probe on trained weights
    (minutes for the whole board: the slow test above; test_reeval covers both on small runs)."""
    checks = sys.modules["tmem_bench.leaderboard.validate"]
    monkeypatch.setattr(checks, "reevaluate", lambda result, weights, reject: None)
    monkeypatch.setattr(checks, "_probe_again", lambda results, reject: None)
    _rebuilds_to_the_committed_files(tmp_path)


def test_the_board_orders_levels_by_value():
    """The committed capacity entries: W=5, 10, 20, 40 in that order, not as strings sort."""
    from tmem_bench.leaderboard.board import board_data

    entries = ROOT / "leaderboard" / "entries"
    accepted = [(d, json.loads((d / "entry.json").read_text())) for d in sorted(entries.glob("tmem-bench-capacity-*"))]
    assert accepted
    (group,) = [g for g in board_data(accepted) if g["kind"] == "capacity"]
    assert [group["values"][lv]["n_writes"] for lv in group["levels"]] == [5, 10, 20, 40]


def _entry(task, variant, options, train_levels=("n_writes=5,noise=0.05",)):
    results = [{"task": task, "variant": variant, "train_level": tl, "level": tl, "level_values": {"n_writes": 5},
                "seeds": [0, 1, 2], "mean": 0.5, "low": 0.4, "high": 0.6, "chance": 0.03, "ceiling": 1.0,
                "n_eval": 1000}
               for tl in train_levels]
    return {"name": f"{task} {variant}", "url": None, "description": None, "model": {"name": "base", "label": "base"},
            "profile": {"id": "quick"}, "seeds": [0, 1, 2], "ranked": True, "devices": ["cpu"], "wall_time_s": 1.0,
            "run": {"command": ["tmem-bench"], "cpu": "x"}, "suite": {"git": {"commit": None, "dirty": None}},
            "settings": [{"task": task, "variant": variant, "task_options": options, "n_params": 1,
                          "state_size": {"bytes": 4, "seq_len": 9, "fixed": True}}],
            "scores": [{"task": task, "variant": variant, "score": 0.5}], "results": results}


def test_the_board_leads_with_memory_forcing_then_capacity_then_standard_variants(tmp_path):
    from tmem_bench.leaderboard.board import board_data, markdown

    entries = [
        _entry("coordinate_binding", "standard", {"n_queries": 4, "n_values": 32, "block_queries": False}),
        _entry("occlusion", "hide=end", {"n_frames": 8, "occluder": False, "hide": "end", "block_hidden": True}),
        _entry("coordinate_binding", "block_queries=True", {"n_queries": 4, "n_values": 32, "block_queries": True}),
        _entry("coordinate_binding", "block_queries=True,n_queries=2",
               {"n_queries": 2, "n_values": 32, "block_queries": True},
               train_levels=("n_writes=5,noise=0.05", "n_writes=10,noise=0.05")),
    ]
    groups = board_data([(tmp_path / str(i), e) for i, e in enumerate(entries)])
    assert [(g["kind"], g["task"], g["variant"]) for g in groups] == [
        ("memory forcing", "coordinate_binding", "block_queries=True"),
        ("memory forcing", "occlusion", "hide=end"),
        ("capacity", "coordinate_binding", "block_queries=True,n_queries=2"),
        ("standard", "coordinate_binding", "standard"),
    ]
    text = markdown(groups)
    assert text.index("## Memory forcing") < text.index("## Capacity") < text.index("## Standard variants: attention "
                                                                                  "alone solves these")


def test_every_profiles_memory_forcing_tables_lead_the_board(tmp_path):
    """Across profiles too: the study's forcing tables (three families) before the quick profile's
    (one), both before any capacity curve, and the standard variants last."""
    from tmem_bench.leaderboard.board import board_data

    cb, forcing = {"n_queries": 4, "n_values": 32}, {"n_frames": 8, "occluder": False, "hide": "end",
                                                     "block_hidden": True}
    made = [("quick", "coordinate_binding", "standard", {**cb, "block_queries": False}, ("n_writes=10,noise=0.05",)),
            ("quick", "coordinate_binding", "block_queries=True", {**cb, "block_queries": True},
             ("n_writes=10,noise=0.05",)),
            ("capacity", "coordinate_binding", "block_queries=True", {**cb, "block_queries": True},
             ("n_writes=5,noise=0.05", "n_writes=10,noise=0.05")),
            ("study", "occlusion", "hide=end", forcing, ("occlusion_len=2",)),
            ("study", "coordinate_binding", "block_queries=True", {**cb, "block_queries": True},
             ("n_writes=10,noise=0.05",))]
    entries = []
    for profile, task, variant, options, levels in made:
        entry = _entry(task, variant, options, train_levels=levels)
        entry["profile"]["id"] = profile
        entries.append(entry)
    groups = board_data([(tmp_path / str(i), e) for i, e in enumerate(entries)])
    assert [(g["kind"], g["profile"], g["task"]) for g in groups] == [
        ("memory forcing", "study", "coordinate_binding"),
        ("memory forcing", "study", "occlusion"),
        ("memory forcing", "quick", "coordinate_binding"),
        ("capacity", "capacity", "coordinate_binding"),
        ("standard", "quick", "coordinate_binding"),
    ]


def test_a_preview_draws_a_run_beside_the_board_and_leaves_the_board_alone(tmp_path, capsys, monkeypatch):
    """Only the run's own cells are re-evaluated; the published entries are drawn as committed, and
    both pages say they are a preview, with the run's rows highlighted."""
    from tmem_bench.cli import main
    from tmem_bench.leaderboard import reeval

    run_dir, board = tiny_run(tmp_path), empty_board(tmp_path)
    assert main(["leaderboard", "submit", str(run_dir), "--name", "Tiny", "--model", "base",
                 "--leaderboard", str(board)]) == 0
    before = sorted(p.relative_to(board) for p in board.rglob("*"))
    evaluated, real = [], reeval.reevaluate
    monkeypatch.setattr(reeval, "reevaluate",
                        lambda result, *a: evaluated.append(result["cell_id"]) or real(result, *a))
    capsys.readouterr()
    assert main(["leaderboard", "build", "--leaderboard", str(board), "--with", str(run_dir),
                 "--out", str(tmp_path / "preview")]) == 0
    out = capsys.readouterr().out
    assert sorted(evaluated) == sorted(p.stem for p in (run_dir / "cells").glob("*.json"))  # the run's, once each
    assert "beside 1 published entries, as committed, not re-evaluated (--full re-evaluates them)" in out
    assert sorted(p.relative_to(board) for p in board.rglob("*")) == before
    text = (tmp_path / "preview" / "README.md").read_text()
    assert text.startswith("# Leaderboard preview\n\n> Preview, not the published board: the models of the run run ")
    assert "| Tiny |" in text or "[Tiny]" in text
    assert "**lstm (preview)**" in text and "**base (preview)**" in text and "**Tiny**" not in text
    page = (tmp_path / "preview" / "index.html").read_text()
    assert "<title>tmem-bench leaderboard preview</title>" in page and '<p class="banner" role="note">Preview' in page
    assert '"preview": true' in page and "tr.preview td" in page
    assert main(["leaderboard", "build", "--leaderboard", str(board), "--out", str(tmp_path / "x")]) == 2
    assert "--out goes with --with" in capsys.readouterr().err


def test_a_preview_model_with_too_few_seeds_says_where_it_would_rank_with_three(tmp_path):
    options = {"n_queries": 4, "n_values": 32, "block_queries": False}
    entries = []
    for name, score, seeds in (("first", 0.9, 3), ("second", 0.5, 3), ("third", 0.3, 3), ("mine", 0.6, 1)):
        entry = _entry("coordinate_binding", "standard", options)
        entry.update(name=name, seeds=list(range(seeds)), ranked=seeds >= 3, preview=name == "mine")
        entry["results"][0]["mean"] = entry["scores"][0]["score"] = score
        entries.append((tmp_path / name, entry))
    (group,) = board_data(entries)
    rows = {r["name"]: r for r in group["rows"]}
    assert [rows[n]["rank"] for n in ("first", "second", "third")] == [1, 2, 3]
    assert rows["mine"]["rank"] is None and rows["mine"]["would_rank"] == 2
    assert rows["first"]["would_rank"] is None  # published rows: only their own rank
    line = next(x for x in markdown([group], "a preview").splitlines() if "**mine**" in x)
    assert line.startswith("| unranked (1 seed); rank 2 with 3 seeds | **mine** |")


def test_a_preview_of_an_unfinished_run_is_refused_before_the_board_is_validated(tmp_path, capsys, monkeypatch):
    """Validating the board re-evaluates every entry (minutes); a run that could not be submitted is
    refused first, in a line, without it."""
    import tmem_bench.leaderboard as leaderboard
    from tmem_bench.cli import main

    run_dir, board = tiny_run(tmp_path), empty_board(tmp_path)
    next(iter(sorted((run_dir / "cells").glob("*.json")))).unlink()
    capsys.readouterr()

    def validate(*_):
        raise AssertionError("the board was validated before the run was checked")

    monkeypatch.setattr(leaderboard, "validate", validate)
    assert main(["leaderboard", "build", "--leaderboard", str(board), "--with", str(run_dir),
                 "--out", str(tmp_path / "preview")]) != 0
    err = capsys.readouterr().err
    assert "is incomplete" in err and "has no result" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "preview").exists()


def test_both_pages_say_which_interval_the_board_shows(tmp_path):
    """The reports' rule, and the kind the board's seed counts give: t for three seeds, the bootstrap
    from five (report/stats.py interval_label)."""
    import html

    from tmem_bench.leaderboard.board import build_pages

    for seeds, kind in ((3, "95% Student's t"), (5, "95% percentile bootstrap")):
        folder = tmp_path / str(seeds)
        readme, page = build_pages(folder, [entry("A", {10: 0.5}, seeds=seeds), entry("B", {10: 0.4}, seeds=1)])
        said = (f"Student's t below 5 seeds, the percentile bootstrap from 5, a point for one seed (this board's "
                f"are {kind} intervals)")
        text = readme.read_text() + html.unescape(page.read_text())  # the page escapes "'" as &#39;
        assert text.count(said) == 2 and "its 95% bootstrap" not in text and "percentile-bootstrap" not in text


def test_a_model_at_chance_is_never_rank_1_and_says_why():
    """A 30-step preview stood "rank 1 with 3 seeds" at 3.1%, chance: a model within two standard errors of
    chance on its evaluation set (1/32 on 1,000 targets: up to 4.2%) takes no rank, alone or among others."""
    (row,) = table([entry("Tiny", {5: 0.031, 10: 0.032})])["rows"]
    assert row["rank"] is None and row["unranked"] == "at chance" and row["would_rank"] is None
    path, preview = entry("Mine", {5: 0.031, 10: 0.040}, seeds=1)
    preview["preview"] = True
    group = table([entry("Learnt", {5: 0.5, 10: 0.3}), (path, preview)])
    assert [(r["name"], r["rank"], r["unranked"], r["would_rank"]) for r in group["rows"]] == [
        ("Learnt", 1, None, None), ("Mine", None, "at chance", None)]
    assert "| unranked (at chance) | **Mine** |" in markdown([group], "a preview")
    # Just past the bound it is ranked: the rule is chance, not a low score.
    assert table([entry("Some", {5: 0.031, 10: 0.043})])["rows"][0]["rank"] == 1


def test_a_preview_no_published_entry_shares_says_it_cannot_be_compared():
    """A run at a profile of its own (--steps 30) lands in a table with no published row: it is not ranked
    first there, nor promised a rank with more seeds, but told why."""
    path, mine = entry("Mine", {5: 0.9, 10: 0.8}, seeds=1)
    mine.update(preview=True, profile={"id": "quick~1234abcd"})
    groups = board_data([entry("Published", {5: 0.5, 10: 0.3}), (path, mine)])
    rows = {r["name"]: r for g in groups for r in g["rows"]}
    assert rows["Published"]["rank"] == 1
    assert rows["Mine"]["rank"] is None and rows["Mine"]["would_rank"] is None
    assert rows["Mine"]["unranked"] == "not comparable: no published entry at profile quick~1234abcd"


def test_a_preview_at_a_board_profile_lands_in_that_profiles_table(tmp_path, board, capsys):
    """Another model trained at the board's profile (--models and --seeds keep it) is drawn in the published
    table, beside the published rows, not in a table of its own."""
    run_dir = tiny_run(tmp_path, "coordinate_binding", "--models", "linear", "--seeds", "1")
    assert main(["leaderboard", "build", "--leaderboard", str(board), "--with", str(run_dir),
                 "--out", str(tmp_path / "preview")]) == 0
    text = (tmp_path / "preview" / "README.md").read_text()
    tables = [t for t in text.split("\n### ")[1:] if t.startswith("coordinate_binding")]
    assert len(tables) == 1, [t.splitlines()[0] for t in tables]
    assert "Tiny (base)" in tables[0] and "Tiny (lstm)" in tables[0] and "**linear (preview)**" in tables[0]
    assert "not comparable" not in text
