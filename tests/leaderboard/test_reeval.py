"""An entry's numbers re-evaluated from its weights: forgeries and swapped weights are caught, and
a leak that opens during training is found on the trained weights."""
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from tests.helpers import ROOT, empty_board
from tests.profiles import grid_profile
from tmem_bench.errors import UsageError
from tmem_bench.harness.plan import Overrides, make_plan
from tmem_bench.harness.results import read_cell
from tmem_bench.harness.runner import run_plan
from tmem_bench.leaderboard.reeval import reevaluate
from tmem_bench.registry import module_names

PROFILE = grid_profile("1e-2")  # base and the plug-in below, six steps, seeds 0 and 1


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
    with module_names(True):  # this test's own plug-in, on a run it builds itself
        cells = make_plan("coordinate_binding", str(root / "p.toml"), Overrides(models=["base", f"{__name__}:gated_leak"]))
        run_plan(cells, root / "run", device="cpu")
    results = {c.id: json.loads((root / "run" / "cells" / f"{c.id}.json").read_text()) for c in cells}
    return root / "run", cells, results


def rejections(result, weights):
    found = []
    with module_names(True):  # the run's plug-in is this test's own
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


def test_a_grid_run_is_submitted_with_its_trials_and_validates_from_its_weights(tmp_path):
    from tmem_bench.cli import main
    from tmem_bench.leaderboard import validate

    (tmp_path / "p.toml").write_text(grid_profile(seeds=[0, 1, 2]))
    run_dir, board = tmp_path / "run", empty_board(tmp_path)
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


def recheck_cheapest_cell(entries: Path) -> list[str]:
    """The cheapest cell under `entries`, re-evaluated from its weights as the board's checks do, with
    the registry's defaults: names an entry gives are never trusted here. What was rejected, and
    then what an accuracy 1 point off its weights gives."""
    cells = sorted(entries.glob("*/cells/*.json"))
    if not cells:
        pytest.skip("no entries committed yet")
    results = [read_cell(path) for path in cells]
    result = min(results, key=lambda r: (r["wall_time_s"], r["cell_id"]))
    weights = next(p for p in cells if p.stem == result["cell_id"]).with_suffix(".safetensors")
    found, forged = [], []
    checks = sys.modules["tmem_bench.leaderboard.validate"]
    checks.reevaluate(result, weights, lambda where, reason: found.append(f"{where}: {reason}"))
    result["eval"][0]["accuracy"] += 0.01
    checks.reevaluate(result, weights, lambda where, reason: forged.append(f"{where}: {reason}"))
    return found, forged


def test_a_committed_cell_still_evaluates_to_its_accuracy():
    """The board's cheapest cell, re-evaluated from its weights by the installed suite: a change to a
    model or task that moves published numbers fails here, not first in the slow test."""
    found, forged = recheck_cheapest_cell(ROOT / "leaderboard" / "entries")
    assert found == []
    assert forged, "an accuracy 1 point off the weights' must be rejected"


@pytest.mark.parametrize("field, name", [
    ("task", "os:system"),  # its constructor would be os.system(command=...)
    ("model", "torch.hub:load"),  # a hubconf.py of the entry's own, imported by torch.hub
])
def test_an_entry_naming_a_module_runs_nothing_in_the_test_run(tmp_path, field, name):
    """The exploit of issue 46: a pull request adds an entry whose cheapest cell names a module, and the
    test above, which reaches `reevaluate` outside the board's guard, would run it."""
    marker = tmp_path / "ran"
    committed = sorted((ROOT / "leaderboard" / "entries").glob("*/cells/*.json"))
    if not committed:
        pytest.skip("no entries committed yet")
    committed = committed[0]
    result = read_cell(committed)
    (tmp_path / "hubconf.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef entry(**options): pass\n")
    result["cell"][field] = name
    result["cell"][f"{field}_options"] = (
        {"command": f"touch {marker}"} if field == "task"
        else {**result["cell"]["model_options"], "repo_or_dir": str(tmp_path), "model": "entry", "source": "local",
              "trust_repo": True})
    result["wall_time_s"] = 0.0
    cells = tmp_path / "entries" / "evil" / "cells"
    cells.mkdir(parents=True)
    (cells / f"{result['cell_id']}.json").write_text(json.dumps(result))
    shutil.copy(committed.with_suffix(".safetensors"), cells / f"{result['cell_id']}.safetensors")
    with pytest.raises(UsageError, match="module:attribute names are not imported here"):
        recheck_cheapest_cell(tmp_path / "entries")
    assert not marker.exists()


def test_a_return_earned_in_an_environment_is_earned_again_from_the_weights(tmp_path):
    pytest.importorskip("popgym")
    cell = make_plan("popgym_repeat_first", "external", Overrides(models=["lstm"], steps=2, selection_only=True))[0]
    run_plan([cell], tmp_path, device="cpu")
    honest = read_cell(tmp_path / "cells" / f"{cell.id}.json")
    weights = tmp_path / "cells" / f"{cell.id}.safetensors"
    assert honest["eval"][0]["closed_loop"]["n_episodes"] == 32
    assert rejections(honest, weights) == []

    forged = json.loads(json.dumps(honest))
    claimed = forged["eval"][0]["closed_loop"]
    claimed["mean_return"] = claimed["mean_return"] + 0.5 if claimed["mean_return"] < 0.5 else -1.0
    found = rejections(forged, weights)
    assert len(found) == 1 and ".closed_loop.mean_return: claims" in found[0], found

    other = json.loads(json.dumps(honest))
    other["eval"][0]["closed_loop"]["seeds_fingerprint"] = "0" * 64
    found = rejections(other, weights)
    assert len(found) == 1 and "not the task's fixed closed-loop episodes" in found[0], found
