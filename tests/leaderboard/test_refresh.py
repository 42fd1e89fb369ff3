"""Refresh: an entry made under an earlier interval rule is rejected with a line naming refresh;
refresh rebuilds its derived numbers from its cells, leaves everything else as it was, records
itself, and the entry validates again. An entry already fresh is left untouched."""
from __future__ import annotations

import json

import pytest

from tests.leaderboard.helpers import entry_path, load
from tmem_bench.cli import main
from tmem_bench.files import write_json
from tmem_bench.harness.results import read_cell
from tmem_bench.leaderboard import validate
from tmem_bench.leaderboard.entry import derived
from tmem_bench.report.stats import bootstrap_ci
from tmem_bench.version import __version__

DERIVED = ("seeds", "ranked", "causality", "settings", "results", "scores", "devices", "wall_time_s")


def make_stale(board, monkeypatch, slug: str = "tiny-base") -> dict:
    """The entry as submit wrote it before issue 43: the percentile bootstrap at every seed count."""
    import tmem_bench.leaderboard.entry as entry_module

    entry = load(board, slug)
    results = [json.loads((entry_path(board, slug) / "cells" / f"{c}.json").read_text()) for c in entry["cells"]]
    with monkeypatch.context() as patched:
        patched.setattr(entry_module, "mean_ci", bootstrap_ci)
        entry.update(derived(results))
    write_json(entry_path(board, slug) / "entry.json", entry)
    return entry


def files(board, slug: str = "tiny-base") -> dict[str, bytes]:
    """Every file of the entry but entry.json: cells and weights."""
    folder = entry_path(board, slug)
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "entry.json"}


def test_a_stale_entry_is_rejected_naming_refresh_and_validates_once_refreshed(board, monkeypatch, capsys):
    stale = make_stale(board, monkeypatch)
    before = files(board)
    result = validate(board)
    assert [path.name for path, _ in result.accepted] == ["tiny-lstm"]
    assert result.rejections and all(line.startswith("tiny-base: results[") for line in result.rejections)
    assert all("`tmem-bench leaderboard refresh tiny-base`" in line and "\n" not in line
               for line in result.rejections)

    capsys.readouterr()
    assert main(["leaderboard", "refresh", "--leaderboard", str(board)]) == 0
    out = capsys.readouterr().out
    assert "refreshed: tiny-base" in out and "1 refreshed, 1 unchanged, 0 not refreshed" in out
    fresh = load(board)
    assert {k: v for k, v in fresh.items() if k not in (*DERIVED, "refreshed")} == \
           {k: v for k, v in stale.items() if k not in DERIVED}  # name, submitted, suite, run, weights, ...
    assert fresh["refreshed"]["tmem_bench_version"] == __version__ and "git" in fresh["refreshed"]
    assert fresh["results"] != stale["results"] and files(board) == before  # cells and weights untouched
    assert "refreshed" not in load(board, "tiny-lstm")  # fresh already: not rewritten
    result = validate(board)
    assert result.rejections == [] and len(result.accepted) == 2

    written = (entry_path(board) / "entry.json").read_bytes()
    assert main(["leaderboard", "refresh", "tiny-base", "--leaderboard", str(board)]) == 0
    assert "0 refreshed, 1 unchanged" in capsys.readouterr().out
    assert (entry_path(board) / "entry.json").read_bytes() == written


@pytest.mark.parametrize("slugs, said", [(["nope"], "no entry nope in"), ([], "not a leaderboard folder")])
def test_refresh_refuses_what_is_not_an_entry_in_one_line(board, tmp_path, capsys, slugs, said):
    folder = board if slugs else tmp_path / "elsewhere"
    assert main(["leaderboard", "refresh", *slugs, "--leaderboard", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("rehash", [False, True])
def test_refresh_refuses_a_cell_whose_task_option_validate_refuses(board, monkeypatch, capsys, rehash):
    """Issue 57: refresh rewrote an entry whose cell names a task option value (n_values = 1) that
    validate then refused; with the cell's file named for its new settings too (`rehash`), it is the
    task that refuses the value."""
    from tmem_bench.harness.plan import cell_from_dict

    make_stale(board, monkeypatch)  # so that refresh has something to rewrite
    entry = load(board)
    folder = entry_path(board) / "cells"
    old = next(c for c in entry["cells"] if read_cell(folder / f"{c}.json")["cell"]["task"] == "coordinate_binding")
    result = read_cell(folder / f"{old}.json")
    result["cell"]["task_options"]["n_values"] = 1
    new = cell_from_dict(result["cell"]).id if rehash else old
    (folder / f"{old}.json").unlink()
    write_json(folder / f"{new}.json", {**result, "cell_id": new})
    (folder / f"{old}.safetensors").rename(folder / f"{new}.safetensors")
    write_json(entry_path(board) / "entry.json", {**entry, "cells": [new if c == old else c for c in entry["cells"]]})
    written = (entry_path(board) / "entry.json").read_bytes()

    assert main(["leaderboard", "refresh", "tiny-base", "--leaderboard", str(board)]) == 1
    err = capsys.readouterr().err
    said = "n_values must be an integer >= 2, got 1" if rehash else "the file name is not the hash of the cell's"
    assert err.startswith(f"not refreshed: tiny-base: cells/{new}.json: ") and said in err, err
    assert (entry_path(board) / "entry.json").read_bytes() == written
    assert [line for line in validate(board).rejections if line.startswith("tiny-base")]
