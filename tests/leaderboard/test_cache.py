"""Incremental validation: an entry is re-evaluated only when something its verdict depends on changed."""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.helpers import empty_board
from tests.leaderboard.helpers import tiny_run
from tmem_bench.cli import main
from tmem_bench.leaderboard import validate
from tmem_bench.leaderboard.cache import CACHE_FILE


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TMEM_BENCH_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[Path, Path]:
    """(a board with two entries, base and lstm on no_harm with three seeds each, the run they came from)."""
    folder = tmp_path_factory.mktemp("incremental")
    run_dir = tiny_run(folder, "no_harm")
    board = empty_board(folder)
    assert main(["leaderboard", "submit", str(run_dir), "--name", "Inc", "--leaderboard", str(board)]) == 0
    return board, run_dir


@pytest.fixture
def board(made, tmp_path) -> Path:
    shutil.copytree(made[0], tmp_path / "leaderboard")
    return tmp_path / "leaderboard"


@pytest.fixture
def evaluated(monkeypatch) -> list[str]:
    """The ids of the cells re-evaluated from their weights, in order."""
    checks = sys.modules["tmem_bench.leaderboard.validate"]
    calls, real = [], checks.reevaluate

    def counting(result, weights, reject):
        calls.append(result["cell_id"])
        return real(result, weights, reject)

    monkeypatch.setattr(checks, "reevaluate", counting)
    return calls


def cells(board: Path, slug: str) -> list[str]:
    return json.loads((board / "entries" / slug / "entry.json").read_text())["cells"]


def test_an_unchanged_board_re_evaluates_nothing(board, evaluated):
    first = validate(board)
    assert first.rejections == [] and sorted(evaluated) == sorted(cells(board, "inc-base") + cells(board, "inc-lstm"))
    assert not any(s["cached"] for s in first.rechecked.values())
    evaluated.clear()
    second = validate(board)
    assert evaluated == [] and second.rejections == []
    assert [(p.name, e) for p, e in second.accepted] == [(p.name, e) for p, e in first.accepted]
    assert all(s["cached"] for s in second.rechecked.values())
    assert validate(board, full=True).rejections == [] and len(evaluated) == 6  # --full re-evaluates everything


def test_a_changed_cell_or_weights_file_is_re_evaluated(board, evaluated):
    validate(board)
    evaluated.clear()
    cell = board / "entries" / "inc-base" / "cells" / f"{cells(board, 'inc-base')[0]}.json"
    cell.write_text(json.dumps(json.loads(cell.read_text()), indent=2))  # the same numbers, other bytes
    out = validate(board)
    assert out.rejections == [] and sorted(evaluated) == sorted(cells(board, "inc-base"))
    evaluated.clear()

    first, second = (board / "entries" / "inc-lstm" / "cells" / f"{c}.safetensors" for c in cells(board, "inc-lstm")[:2])
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    for _ in range(2):  # a rejection is never recorded: the swapped weights are caught every time
        out = validate(board)
        assert evaluated == cells(board, "inc-lstm")[2:] and [p.name for p, _ in out.accepted] == ["inc-base"]
        assert any(f"inc-lstm: weights: weights file cells/{first.name} has sha256" in line for line in out.rejections)
        evaluated.clear()
    entry_file = board / "entries" / "inc-lstm" / "entry.json"
    old_style = {k: v for k, v in json.loads(entry_file.read_text()).items() if k != "weights"}
    entry_file.write_text(json.dumps(old_style))  # an entry from before the hashes: the files' metadata catches it
    out = validate(board)
    assert any(f"inc-lstm: cells/{first.name}: its metadata names cell_id {second.stem!r}" in line
               for line in out.rejections), out.rejections


def test_a_changed_suite_torch_or_cpu_re_evaluates_everything(board, evaluated, monkeypatch):
    validate(board)
    import tmem_bench.contracts.device as device
    import tmem_bench.leaderboard.cache as cache
    import tmem_bench.version as version

    changes = [(version, "__version__", "0.1.1"), (cache, "source_digest", lambda: "edited"),
               (sys.modules["torch"], "__version__", "9.9.9"), (device, "hardware", lambda device: "another CPU, AVX2")]
    for module, name, value in changes:
        evaluated.clear()
        monkeypatch.setattr(module, name, value)
        assert validate(board).rejections == [] and len(evaluated) == 6, name
        evaluated.clear()
        assert validate(board).rejections == [] and evaluated == [], name


def test_the_records_are_this_machines_and_validating_writes_nothing_into_the_board(board, evaluated, tmp_path):
    """A record in the repository would let a pull request mark a forged entry valid: the records
    live in the user's cache folder, and a copy of the board (another path, the same content) shares them."""
    before = {p.relative_to(board): p.read_bytes() for p in board.rglob("*") if p.is_file()}
    assert validate(board).rejections == [] and len(evaluated) == 6
    assert {p.relative_to(board): p.read_bytes() for p in board.rglob("*") if p.is_file()} == before
    assert (tmp_path / "cache" / CACHE_FILE).is_file()
    copy = tmp_path / "elsewhere" / "board"
    shutil.copytree(board, copy)
    evaluated.clear()
    assert len(validate(copy).accepted) == 2 and evaluated == []


def test_long_validation_shows_its_count_and_time_left_at_80_columns_and_a_line_per_entry_in_a_log(
        board, capsys, monkeypatch):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich: stderr is a terminal, 80 columns wide
    monkeypatch.setenv("TTY_INTERACTIVE", "1")
    monkeypatch.setenv("COLUMNS", "80")
    validate(board, progress=True)
    err = " ".join(re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", capsys.readouterr().err).split())  # colours, wrapping
    assert "re-evaluating 6 cells of 2 entries from their weights: once on this machine" in err, err
    assert re.search(r"6/6 cells, [0-9:]+ left", err) and "inc-" in err, err  # the entry is what may be cut
    monkeypatch.delenv("TTY_COMPATIBLE")
    monkeypatch.delenv("TTY_INTERACTIVE")
    validate(board, full=True, progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "re-evaluating 6 cells of 2 entries from their weights (--full: whatever was recorded)"
    assert [re.sub(r"[0-9:]+ left|in [0-9]+ s", "T", line) for line in lines[1:]] == [
        "3/6 cells, T: inc-base re-evaluated (3 cells T)", "6/6 cells, T: inc-lstm re-evaluated (3 cells T)"]


def test_validate_prints_what_it_recomputed_and_build_previews_from_the_records(board, made, capsys, evaluated):
    assert main(["leaderboard", "validate", str(board)]) == 0
    out, err = capsys.readouterr()
    line = next(x for x in out.splitlines() if x.startswith("inc-base: "))
    assert "3 cells re-evaluated from their weights (6 accuracies, 3 losses)" in line
    assert "largest difference from the stored numbers: accuracy 0, loss 0" in line  # the same CPU: exact
    assert err.count(" re-evaluated (3 cells in ") == 2 and "Traceback" not in err  # as each entry finished
    assert main(["leaderboard", "validate", str(board)]) == 0
    assert "inc-base: unchanged since validated here at " in capsys.readouterr().out
    evaluated.clear()
    assert main(["leaderboard", "build", "--leaderboard", str(board), "--with", str(made[1]),
                 "--out", str(board.parent / "preview")]) == 0
    assert evaluated == [] and "2 published entries, as committed, not re-evaluated" in capsys.readouterr().out
    assert main(["leaderboard", "build", "--leaderboard", str(board), "--full"]) == 0
    assert len(evaluated) == 6 and "2 validated now, 0 unchanged" in capsys.readouterr().out


def test_a_bad_records_file_or_record_is_treated_as_absent_and_said_so(board, tmp_path, capsys, evaluated):
    records = tmp_path / "cache" / CACHE_FILE
    records.mkdir(parents=True)  # a folder where the records file goes
    assert main(["leaderboard", "validate", str(board)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("is not a file; every entry is validated again") == 1, err
    assert records.is_dir() and len(evaluated) == 6
    records.rmdir()

    assert main(["leaderboard", "validate", str(board)]) == 0  # writes the two entries' records
    doc = json.loads(records.read_text())
    key = next(iter(doc["records"]))
    doc["records"][key]["accuracy"] = "0.0"  # a record with a string accuracy
    records.write_text(json.dumps(doc))
    capsys.readouterr()
    evaluated.clear()
    assert main(["leaderboard", "validate", str(board)]) == 0
    out, err = capsys.readouterr()
    assert "1 of the 2 records in" in err and "are malformed and treated as absent" in err, err
    assert "Traceback" not in err and len(evaluated) == 3  # the entry of the bad record only
    assert out.count("unchanged since validated here") == 1, out  # the other entry's record still holds


def test_an_interrupted_validation_keeps_each_finished_entry_and_resumes_after_it(board, monkeypatch, evaluated):
    checks = sys.modules["tmem_bench.leaderboard.validate"]
    counting = checks.reevaluate

    def interrupted(result, weights, reject):
        if len(evaluated) == 4:  # the second entry's second cell: Ctrl-C
            raise KeyboardInterrupt
        return counting(result, weights, reject)

    monkeypatch.setattr(checks, "reevaluate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        validate(board)
    evaluated.clear()
    monkeypatch.setattr(checks, "reevaluate", counting)
    again = validate(board)
    assert len(again.accepted) == 2 and len(evaluated) == 3  # the first entry's record was kept
    assert [slug for slug, summary in again.rechecked.items() if summary["cached"]] == ["inc-base"]
