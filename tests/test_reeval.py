"""An entry's numbers re-evaluated from its weights: forgeries and swapped weights are caught, and
a leak that opens during training is found on the trained weights."""
import json
import shutil

import pytest
import torch
import torch.nn as nn

from tmem_bench.harness.plan import Overrides, make_plan
from tmem_bench.harness.runner import run_plan
from tmem_bench.leaderboard.reeval import reevaluate

PROFILE = """
[train]
steps = 6
batch_size = 8
lr = 1e-2
weight_decay = 0.01
grad_clip = 1.0
log_every = 2
eval_size = 32
seeds = [0, 1]

[tasks.coordinate_binding]
models = ["base"]
model = { d_model = 16, n_layers = 1, n_heads = 2 }
levels = { n_writes = [3], noise = [0.05] }
"""


class GatedLeak(nn.Module):
    """Causal as built; its gate on the next token's input starts at zero and opens with training."""

    def __init__(self, d_model: int):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)
        self.gate = nn.Parameter(torch.zeros(()))

    def forward(self, x, blocked=None):  # (B, S, d) -> (B, S, d)
        h = self.proj(x).cumsum(1) / torch.arange(1, x.shape[1] + 1, device=x.device)[:, None]
        future = torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], dim=1)
        return h + self.gate * future


def gated_leak(d_model, n_layers, n_heads, **options):
    return GatedLeak(d_model)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("reeval")
    (root / "p.toml").write_text(PROFILE)
    cells = make_plan("coordinate_binding", str(root / "p.toml"), Overrides(models=["base", "tests.test_reeval:gated_leak"]))
    run_plan(cells, root / "run", device="cpu")
    results = {c.id: json.loads((root / "run" / "cells" / f"{c.id}.json").read_text()) for c in cells}
    return root / "run", cells, results


def rejections(result, weights):
    found = []
    reevaluate(result, weights, lambda where, reason: found.append(f"{where}: {reason}"))
    return found


def test_honest_cells_are_reproduced_from_their_weights(run):
    run_dir, cells, results = run
    for cell in cells[:2]:  # base, seeds 0 and 1
        assert rejections(results[cell.id], run_dir / "cells" / f"{cell.id}.safetensors") == []


def test_an_edited_accuracy_is_rejected(run):
    run_dir, cells, results = run
    forged = json.loads(json.dumps(results[cells[0].id]))
    forged["eval"][0]["accuracy"] = min(1.0, forged["eval"][0]["accuracy"] + 0.1)
    found = rejections(forged, run_dir / "cells" / f"{cells[0].id}.safetensors")
    assert len(found) == 1 and ".accuracy: claims" in found[0]


def test_weights_swapped_between_two_cells_are_rejected(run):
    run_dir, cells, results = run
    found = rejections(results[cells[0].id], run_dir / "cells" / f"{cells[1].id}.safetensors")
    assert any(".loss: claims" in line for line in found), found


def test_missing_or_foreign_weights_are_rejected(run, tmp_path):
    run_dir, cells, results = run
    assert "missing" in rejections(results[cells[0].id], tmp_path / "none.safetensors")[0]
    foreign = tmp_path / "foreign.safetensors"
    shutil.copy(run_dir / "cells" / f"{cells[2].id}.safetensors", foreign)  # the leak model's weights
    assert "does not fit" in rejections(results[cells[0].id], foreign)[0]


def test_a_leak_that_opens_in_training_is_flagged_in_the_run_and_rejected(run):
    run_dir, cells, results = run
    leak = results[cells[2].id]
    assert leak["causality"]["verdict"] == "causal"  # as built, the gate is zero
    assert leak["causality_trained"]["eval"]["verdict"] == "leaking"
    found = rejections(leak, run_dir / "cells" / f"{cells[2].id}.safetensors")
    assert any("causality" in line and "leaking" in line for line in found), found


def _board(folder):
    from tests.test_leaderboard import empty_board
    return empty_board(folder)


def test_a_grid_run_is_submitted_with_its_trials_and_validates_from_its_weights(tmp_path):
    from tmem_bench.cli import main
    from tmem_bench.leaderboard import validate

    (tmp_path / "p.toml").write_text(PROFILE.replace("lr = 1e-2", "lr = [1e-3, 1e-2]").replace("[0, 1]", "[0, 1, 2]"))
    run_dir, board = tmp_path / "run", _board(tmp_path)
    assert main(["run", "coordinate_binding", "--profile", str(tmp_path / "p.toml"), "--out", str(run_dir),
                 "--no-report"]) == 0
    assert main(["leaderboard", "submit", str(run_dir), "--name", "Grid", "--leaderboard", str(board)]) == 0
    entry_dir = board / "entries" / "grid"
    entry = json.loads((entry_dir / "entry.json").read_text())
    [search] = json.loads((run_dir / "selection.json").read_text())["searches"]
    assert entry["selection"] == [{k: search[k] for k in ("task", "variant", "train_level", "grid", "chosen_lr",
                                                          "at_edge")}]
    assert len(entry["cells"]) == 4 and entry["seeds"] == [0, 1, 2]  # two trials, two seeds at the chosen lr
    assert len(list(entry_dir.glob("cells/*.safetensors"))) == 4
    assert validate(board).rejections == []
    # A forger who edits the losing trial's validation accuracy to change the choice is caught twice.
    loser = next(t for t in search["trials"] if t["lr"] != search["chosen_lr"])
    path = entry_dir / "cells" / f"{loser['cell_id']}.json"
    result = json.loads(path.read_text())
    result["validation"]["accuracy"] = 1.0
    path.write_text(json.dumps(result))
    rejections = validate(board).rejections
    assert rejections[0].startswith("grid: selection: claims"), rejections
    # The same edit on the winning trial keeps the choice, and its weights give it away.
    winner = next(t for t in search["trials"] if t["lr"] == search["chosen_lr"])
    path.write_text(json.dumps({**result, "validation": {**result["validation"], "accuracy": loser["accuracy"]}}))
    path = entry_dir / "cells" / f"{winner['cell_id']}.json"
    result = json.loads(path.read_text())
    path.write_text(json.dumps({**result, "validation": {**result["validation"], "accuracy": 1.0}}))
    rejections = validate(board).rejections
    assert [line.split(": ")[2] for line in rejections] == ["validation.accuracy"], rejections


def test_a_diverged_cell_is_refused_at_submit_and_rejected_at_validate(tmp_path):
    from tmem_bench.cli import main
    from tmem_bench.leaderboard import validate

    (tmp_path / "p.toml").write_text(PROFILE)
    copy = tmp_path / "run"
    assert main(["run", "coordinate_binding", "--profile", str(tmp_path / "p.toml"), "--out", str(copy),
                 "--no-report"]) == 0
    cells = make_plan("coordinate_binding", str(tmp_path / "p.toml"))
    board = _board(tmp_path)
    assert main(["leaderboard", "submit", str(copy), "--name", "Base", "--model", "base",
                 "--leaderboard", str(board)]) == 0
    assert validate(board).rejections == []
    for folder in (copy / "cells", board / "entries" / "base" / "cells"):
        path = folder / f"{cells[0].id}.json"
        result = json.loads(path.read_text())
        result.update(status="diverged", diverged_at_step=3)
        path.write_text(json.dumps(result))
    assert any("status: 'diverged'" in line for line in validate(board).rejections)
    shutil.rmtree(board / "entries" / "base")
    assert main(["leaderboard", "submit", str(copy), "--name", "Base", "--model", "base",
                 "--leaderboard", str(board)]) == 2
    assert not (board / "entries" / "base").exists()


def _entry(task, variant, options, train_levels=("n_writes=5,noise=0.05",)):
    results = [{"task": task, "variant": variant, "train_level": tl, "level": tl, "level_values": {"n_writes": 5},
                "mean": 0.5, "low": 0.4, "high": 0.6, "chance": 0.03, "ceiling": 1.0} for tl in train_levels]
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


def test_a_preview_draws_a_run_beside_the_board_and_leaves_the_board_alone(tmp_path, capsys):
    from tests.test_leaderboard import tiny_run
    from tmem_bench.cli import main

    run_dir, board = tiny_run(tmp_path), _board(tmp_path)
    assert main(["leaderboard", "submit", str(run_dir), "--name", "Tiny", "--model", "base",
                 "--leaderboard", str(board)]) == 0
    before = sorted(p.relative_to(board) for p in board.rglob("*"))
    assert main(["leaderboard", "build", "--leaderboard", str(board), "--with", str(run_dir),
                 "--out", str(tmp_path / "preview")]) == 0
    assert sorted(p.relative_to(board) for p in board.rglob("*")) == before
    text = (tmp_path / "preview" / "README.md").read_text()
    assert "| Tiny |" in text or "[Tiny]" in text
    assert "lstm (preview)" in text and "base (preview)" in text
    assert (tmp_path / "preview" / "index.html").is_file()
    assert main(["leaderboard", "build", "--leaderboard", str(board), "--out", str(tmp_path / "x")]) == 2
    assert "--out goes with --with" in capsys.readouterr().err


def test_a_preview_of_an_unfinished_run_is_refused_before_the_board_is_validated(tmp_path, capsys, monkeypatch):
    """Validating the board re-evaluates every entry (minutes); a run that could not be submitted is
    refused first, in a line, without it."""
    import tmem_bench.leaderboard as leaderboard
    from tests.test_leaderboard import tiny_run
    from tmem_bench.cli import main

    run_dir, board = tiny_run(tmp_path), _board(tmp_path)
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
