"""A model back from any entry: `tmem_bench.load_entry` and `tmem-bench leaderboard show`."""
from __future__ import annotations

import json
import re
import shutil
import textwrap
from pathlib import Path

import pytest
import torch

import tmem_bench
from tests.helpers import ROOT, empty_board
from tests.leaderboard.helpers import tiny_run
from tmem_bench.cli import main
from tmem_bench.contracts.device import hardware
from tmem_bench.contracts.model import TaskModel
from tmem_bench.errors import UsageError
from tmem_bench.harness.train import evaluate
from tmem_bench.leaderboard import api
from tmem_bench.leaderboard.reeval import ACCURACY_TOLERANCE


def documented_example() -> str:
    """The five lines of api.py's docstring (the README's example)."""
    lines = [line for line in api.__doc__.splitlines() if line.startswith("    ")]
    assert len(lines) == 5, lines
    return textwrap.dedent("\n".join(lines))


def spy_reevaluate(monkeypatch) -> list:
    frames, real = [], api.LoadedEntry.reevaluate

    def spying(self, cell_id=None):
        frames.append(real(self, cell_id))
        return frames[-1]

    monkeypatch.setattr(api.LoadedEntry, "reevaluate", spying)
    return frames


def test_the_documented_example_gives_the_stored_numbers_back(monkeypatch, capsys):
    example = documented_example()
    entry_dir = ROOT / re.search(r'load_entry\("([^"]+)"\)', example).group(1)
    if not entry_dir.is_dir():
        pytest.skip(f"{entry_dir} is not committed")
    monkeypatch.chdir(ROOT)
    frames = spy_reevaluate(monkeypatch)
    namespace = {}
    exec(example, namespace)
    printed = capsys.readouterr().out
    cell_id = re.search(r'model\("([0-9a-f]{16})"\)', example).group(1)
    assert cell_id in printed and "recomputed" in printed and "..." not in printed  # every column shown

    entry, model = namespace["entry"], namespace["model"]
    result = entry.cells[cell_id]
    assert isinstance(model, TaskModel) and not model.training
    task = entry.task(cell_id)
    ev = result["eval"][0]
    accuracy, _ = evaluate(model, task.eval_set(ev["level"], result["cell"]["train"]["eval_size"])[0],
                           torch.device("cpu"))
    [table] = frames
    assert table.attrs["rejections"] == [] and len(table) == 2 * len(result["eval"]) + 1  # and validation
    # Bit-equal only where the cell names this machine's CPU: a cell that names none (it predates
    # the record) may come from another instruction set, whose sums round differently.
    if result.get("hardware") == hardware(torch.device("cpu")):
        assert accuracy == ev["accuracy"]
        assert (table["recomputed"] == table["stored"]).all(), table
    else:
        assert abs(accuracy - ev["accuracy"]) <= ACCURACY_TOLERANCE
        assert ((table["recomputed"] - table["stored"]).abs() <= 1e-4 * table["stored"].abs().clip(lower=1)).all(), table


@pytest.fixture(scope="module")
def board(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("load")
    run_dir = tiny_run(folder, "coordinate_binding", "--models", "base")
    board = empty_board(folder)
    assert main(["leaderboard", "submit", str(run_dir), "--name", "Load", "--leaderboard", str(board)]) == 0
    return board


def test_load_entry_reproduces_every_stored_number_exactly_on_the_cpu_that_trained_it(board):
    loaded = tmem_bench.load_entry(board / "entries" / "load")
    assert loaded.entry["name"] == "Load" and list(loaded.cells) == loaded.entry["cells"]
    assert len(loaded.table()) == 3 * 2  # three seeds, two levels
    for cell_id, result in loaded.cells.items():
        model = loaded.model(cell_id)
        task = loaded.task(cell_id)
        for ev in result["eval"]:
            batch, fingerprint = task.eval_set(ev["level"], result["cell"]["train"]["eval_size"])
            assert fingerprint == ev["fingerprint"]
            assert evaluate(model, batch, torch.device("cpu")) == (ev["accuracy"], ev["loss"])
    table = loaded.reevaluate()
    assert table.attrs["rejections"] == [] and len(table) == 3 * (2 * 2 + 1)  # accuracy and loss, and validation
    assert (table["stored"] == table["recomputed"]).all(), table


def test_show_prints_stored_and_recomputed_numbers(board, capsys):
    entry_dir = board / "entries" / "load"
    cell_id = json.loads((entry_dir / "entry.json").read_text())["cells"][1]
    assert main(["leaderboard", "show", str(entry_dir), "--cell", cell_id]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Load: model 'base'") and "recomputed" in out and "difference" in out
    rows = [line for line in out.splitlines() if line.lstrip().startswith(cell_id)]
    assert len(rows) == 5 and all(row.split()[-1] == "0" for row in rows)  # difference 0 at each level and metric
    assert main(["leaderboard", "show", str(entry_dir), "--cell", "0123456789abcdef"]) == 2
    assert "'0123456789abcdef' is not a cell of the entry load; its cells: " in capsys.readouterr().err


def test_a_model_whose_weights_are_not_here_says_how_to_get_them(board, tmp_path, monkeypatch):
    monkeypatch.setenv("TMEM_BENCH_CACHE", str(tmp_path / "cache"))
    entry_dir = tmp_path / "load"
    shutil.copytree(board / "entries" / "load", entry_dir)
    entry = json.loads((entry_dir / "entry.json").read_text())
    cell_id = entry["cells"][0]
    entry["weights"][cell_id]["url"] = "https://example.org/w.safetensors"
    (entry_dir / "entry.json").write_text(json.dumps(entry))
    (entry_dir / "cells" / f"{cell_id}.safetensors").unlink()
    loaded = tmem_bench.load_entry(entry_dir)
    with pytest.raises(UsageError, match=r"referenced at https://example.org/w.safetensors .*leaderboard fetch"):
        loaded.model(cell_id)
    with pytest.raises(UsageError, match="is not a readable leaderboard entry"):
        tmem_bench.load_entry(tmp_path)
