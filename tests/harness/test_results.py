"""A cell's files: its result read and checked against the schema (a malformed one named by the report
and trained again on resume), its weights (the same bytes on every run, trained again when bad or, without
--keep-weightless, absent), its rows of the results table, and the atomic writer."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from tests.helpers import rerun, run_cli, selection
from tmem_bench.errors import UsageError
from tmem_bench.harness.rundir import RunDir

WRITE = """
import sys
import torch
from pathlib import Path
from tmem_bench.harness.results import load_weights, write_weights
torch.manual_seed(0)
make = lambda: torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
model = make()
result = {"cell": {"model": "base", "label": "base", "seed": 0}, "model_config": {"d_model": 4},
          "tmem_bench_version": "0.1.0", "torch_version": torch.__version__}
path = Path(sys.argv[1])
write_weights(path, model, "0123456789abcdef", result)
again = make()
load_weights(path, again)
assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
"""


def test_weights_with_metadata_are_byte_identical_across_processes(tmp_path):
    # safetensors writes its header from hash maps, in an order that changes between processes
    digests = set()
    for i in range(3):
        path = tmp_path / f"w{i}.safetensors"
        subprocess.run([sys.executable, "-c", WRITE, str(path)], check=True)
        digests.add(hashlib.sha256(path.read_bytes()).hexdigest())
    assert len(digests) == 1


def test_finished_cells_say_so_and_carry_their_final_loss(finished_run):
    table = pd.read_csv(finished_run / "run" / "results.csv")
    result = json.loads(next((finished_run / "run" / "cells").glob("*.json")).read_text())
    assert set(table["status"]) == {"finished"} and result["diverged_at_step"] is None
    assert table["final_loss"].iloc[0] == pytest.approx(result["history"][-1]["loss"])


@pytest.mark.parametrize("damage, needle", [
    (lambda r: r["eval"][0].update(accuracy="high"), "is malformed: eval.0.accuracy: 'high' is not of type 'number'"),
    (lambda r: r.update(eval=[]), "is malformed: eval: [] should be non-empty"),
    (lambda r: r["cell"].update(seed="0"), "is malformed: cell.seed: '0' is not of type 'integer'"),
    (lambda r: r.update(cell_id="0" * 16), "holds cell 0000000000000000"),
    (lambda r: r["history"][0].update(loss=None), "is malformed: history.0.loss: None is not of type 'number'"),
])
def test_a_malformed_cell_is_named_by_report_and_retrained_on_resume(finished_run, tmp_path, damage, needle):
    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    args = ["run", "coordinate_binding", "--profile", "tiny.toml", "--out", "run"]
    path = next((tmp_path / "run" / "cells").glob("*.json"))
    good = json.loads(path.read_text())
    bad = json.loads(path.read_text())
    damage(bad)
    path.write_text(json.dumps(bad))
    report = run_cli(["report", "run"], tmp_path)
    assert report.returncode == 0 and "Traceback" not in report.stderr
    assert needle in (tmp_path / "run" / "report.md").read_text()
    resumed = run_cli(args, tmp_path)
    assert resumed.returncode == 0 and f"cells/{path.name}" in resumed.stderr and "training it again" in resumed.stderr
    again = json.loads(path.read_text())
    assert again["eval"] == good["eval"]  # retrained from its seed: the same numbers


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _corrupt(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-16] + bytes(b ^ 0xFF for b in data[-16:]))  # the header still reads


WEIGHTS_DAMAGE = {"missing": Path.unlink, "truncated": _truncate, "corrupt": _corrupt,
                  "not-safetensors": lambda p: p.write_bytes(b"not weights")}


@pytest.mark.parametrize("damage", WEIGHTS_DAMAGE)
def test_a_cell_with_bad_weights_is_trained_again_on_resume_and_says_so(run, capsys, damage):
    import safetensors.torch

    [final] = selection(run)["searches"][0]["final_cells"]
    weights = RunDir(run).weights_path(final)
    good = weights.read_bytes()
    others = {p.name: p.stat().st_mtime_ns for p in (run / "cells").iterdir() if not p.name.startswith(final)}
    WEIGHTS_DAMAGE[damage](weights)
    if damage != "missing":
        # submit refuses them too, rather than copying them into an entry that validate rejects.
        from tmem_bench.leaderboard.submit import make_entries

        with pytest.raises(UsageError, match=f"cells/{final}.safetensors.*rerun the run's command"):
            make_entries(run, "X")
    code, _, err = rerun(run, capsys)
    assert code == 0, err
    said = [line for line in err.splitlines() if f"cells/{final}.safetensors" in line]
    assert len(said) == 1 and "training it again" in said[0], err
    hint = "1 of these lack only their weights file: --keep-weightless keeps their results instead"
    assert (hint in err) == (damage == "missing"), err
    # Trained again from its seed: the same tensors (the header's key order is safetensors' own).
    again, before = safetensors.torch.load(weights.read_bytes()), safetensors.torch.load(good)
    assert again.keys() == before.keys() and all(torch.equal(again[k], before[k]) for k in again)
    assert {p.name: p.stat().st_mtime_ns for p in (run / "cells").iterdir() if not p.name.startswith(final)} == others
    assert "training it again" not in rerun(run, capsys)[2]


def test_keep_weightless_resumes_a_run_committed_without_its_weights(run, capsys):
    """A clone of a run committed without its weights (`.gitignore`) resumes without training those
    cells again; weights present but torn, and a torn result, are trained again all the same."""
    cells = run / "cells"
    torn_weights, torn_result, *absent = sorted(cells.glob("*.safetensors"))
    assert absent, "the fixture's run needs at least three cells"
    _corrupt(torn_weights)
    for path in (torn_result, *absent):
        path.unlink()
    _truncate(torn_result.with_suffix(".json"))
    kept = {p: p.read_bytes() for p in (w.with_suffix(".json") for w in absent)}
    code, _, err = rerun(run, capsys, "--keep-weightless")
    assert code == 0, err
    assert f"kept {len(absent)} finished cell(s) without weights" in err
    again = sorted(line for line in err.splitlines() if "training it again" in line)
    assert len(again) == 2 and all(any(w.stem in line for line in again) for w in (torn_weights, torn_result))
    assert {p: p.read_bytes() for p in kept} == kept and not any(w.exists() for w in absent)
    assert torn_weights.exists() and torn_result.exists()


def test_training_loop_speed_comes_from_the_logged_windows():
    from tmem_bench.harness.results import loop_steps_per_s

    result = {"steps_per_s": 1.0, "history": [{"step": 50, "steps_per_s": 10.0}, {"step": 60, "steps_per_s": 5.0}]}
    assert loop_steps_per_s(result) == pytest.approx(60 / (50 / 10 + 10 / 5))
    assert loop_steps_per_s({"steps_per_s": 1.5, "history": []}) == 1.5


def test_only_a_regular_file_is_read(tmp_path):
    """A FIFO is refused without waiting for a writer (issue 57: reading one blocked until killed),
    and so is a folder."""
    import os

    from tmem_bench.harness.results import read_text

    (tmp_path / "file").write_text("text")
    assert read_text(tmp_path / "file") == "text"
    os.mkfifo(tmp_path / "fifo")
    for path in (tmp_path / "fifo", tmp_path):
        with pytest.raises(OSError, match="not a regular file"):
            read_text(path)
