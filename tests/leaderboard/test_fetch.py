"""`tmem-bench leaderboard fetch` (leaderboard/fetch.py): the weights an entry references by URL
come into the cache once, by hash; an entry that holds its weights needs nothing; a file:// URL is
read only when allowed; an entry its schema refuses is named and nothing fetched for it."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.leaderboard.helpers import entry_path, load
from tmem_bench.errors import UsageError
from tmem_bench.leaderboard.fetch import fetch_board


@pytest.fixture
def referenced(board, tmp_path, monkeypatch):
    """The board with tiny-base's weights published elsewhere (file:// URLs) and not in its folder,
    and an empty weights cache; (board, the number of weights files referenced)."""
    monkeypatch.setenv("TMEM_BENCH_CACHE", str(tmp_path / "cache"))
    published = tmp_path / "published"
    published.mkdir()
    entry = load(board)
    for cell_id, record in entry["weights"].items():
        held = entry_path(board) / "cells" / f"{cell_id}.safetensors"
        shutil.move(held, published / held.name)
        record["url"] = (published / held.name).as_uri()
    (entry_path(board) / "entry.json").write_text(json.dumps(entry))
    return board, len(entry["weights"])


def test_referenced_weights_come_into_the_cache_once(referenced, tmp_path, capsys):
    board, n = referenced
    assert fetch_board(board, allow_file_urls=True) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"tiny-base: {n} fetched, 0 in the cache",
                   "1 entry holds its weights in its folder: nothing to fetch",
                   f"weights cache: {tmp_path / 'cache' / 'weights'}"]
    hashes = {r["sha256"] for r in load(board)["weights"].values()}
    assert {p.name for p in (tmp_path / "cache" / "weights").iterdir()} == hashes
    assert fetch_board(board, allow_file_urls=True) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"tiny-base: 0 fetched, {n} in the cache"


def test_a_file_url_is_not_read_unless_allowed(referenced, tmp_path, capsys):
    board, n = referenced
    assert fetch_board(board) == 1
    captured = capsys.readouterr()
    assert f"tiny-base: 0 fetched, 0 in the cache, {n} failed" in captured.out
    assert "its URL is a file:// URL, which reads a file of this machine: not read" in captured.err
    assert not (tmp_path / "cache" / "weights").exists()


def test_a_download_that_is_not_the_file_recorded_is_refused(referenced, tmp_path, capsys):
    board, n = referenced
    for path in (tmp_path / "published").iterdir():
        path.write_bytes(b"not the weights")
    assert fetch_board(board, allow_file_urls=True) == 1
    captured = capsys.readouterr()
    assert f"{n} failed" in captured.out and len(captured.err.splitlines()) == n
    cache = tmp_path / "cache" / "weights"
    assert not cache.exists() or not any(cache.iterdir())  # nothing kept that is not what the entry names


def test_an_entry_its_schema_refuses_is_named_and_the_others_still_fetched(referenced, capsys):
    board, n = referenced
    broken = load(board, "tiny-lstm")
    del broken["scores"]
    (entry_path(board, "tiny-lstm") / "entry.json").write_text(json.dumps(broken))
    assert fetch_board(board, allow_file_urls=True) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("tiny-lstm: entry.json schema: ") and "nothing fetched" in captured.err
    assert f"tiny-base: {n} fetched, 0 in the cache" in captured.out


def test_a_path_that_does_not_exist_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="does not exist; give a leaderboard folder"):
        fetch_board(tmp_path / "nowhere")
