"""A preview's own parts (leaderboard/preview.py): where it may be written, which committed entries
it draws and why others are left out, what its banner says; the whole preview is drawn in
test_board.py."""
from __future__ import annotations

import json

import pytest

from tests.leaderboard.helpers import entry_path, load
from tmem_bench.errors import UsageError
from tmem_bench.leaderboard.board import GENERATED
from tmem_bench.leaderboard.preview import banner, committed, preview_entries, preview_folder


def test_a_preview_goes_beside_the_run_by_default(tmp_path, board):
    run = tmp_path / "run"
    assert preview_folder(run, None, board) == run / "board-preview"
    assert preview_folder(run, tmp_path / "elsewhere", board) == tmp_path / "elsewhere"


@pytest.mark.parametrize("where,needle", [
    ("board", "is the leaderboard folder"),
    ("board/entries", "is in the leaderboard folder"),
    ("a_file", "is a file, not a folder"),
    ("in_the_way", "is in the way"),
    ("not_a_board", "holds a README.md that is not a board"),
    ("another_board", "is in the leaderboard folder"),  # a folder with entries/ is a board too
])
def test_a_preview_is_never_written_over_a_board_or_a_stranger(tmp_path, board, where, needle):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "in_the_way" / "index.html").mkdir(parents=True)
    (tmp_path / "not_a_board").mkdir()
    (tmp_path / "not_a_board" / "README.md").write_text("# My project\n")
    (tmp_path / "another_board" / "entries").mkdir(parents=True)
    target = board.parent / where.replace("board", board.name, 1) if where.startswith("board") else tmp_path / where
    with pytest.raises(UsageError, match=needle):
        preview_folder(tmp_path / "run", target, board)


def test_an_earlier_preview_may_be_written_over(tmp_path, board):
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "README.md").write_text(f"# Leaderboard preview\n\n{GENERATED} from `entries/`\n")
    assert preview_folder(tmp_path / "run", earlier, board) == earlier


def test_committed_entries_are_drawn_as_they_are_and_broken_ones_left_out_with_why(board):
    entries, left_out = committed(board)
    assert sorted(path.name for path, _ in entries) == ["tiny-base", "tiny-lstm"] and left_out == []
    assert dict((p.name, e) for p, e in entries)["tiny-base"] == load(board)  # the numbers as committed

    unreadable = entry_path(board, "tiny-lstm") / "entry.json"
    unreadable.write_text("{not json")
    broken = load(board)
    broken["settings"] = [s for s in broken["settings"] if s["task"] != "no_harm"]
    (entry_path(board) / "entry.json").write_text(json.dumps(broken))
    entries, left_out = committed(board)
    assert entries == []
    assert left_out[0] == "tiny-base: a score without its settings"
    assert left_out[1].startswith("tiny-lstm: ") and len(left_out) == 2

    del broken["scores"]
    (entry_path(board) / "entry.json").write_text(json.dumps(broken))
    assert committed(board)[1][0].startswith("tiny-base: entry.json schema: ")


def test_a_missing_board_or_run_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="is not a leaderboard folder"):
        committed(tmp_path / "nowhere")
    with pytest.raises(UsageError, match="is not a run directory"):
        preview_entries(tmp_path / "nowhere")


def test_the_banner_says_whose_rows_and_where_the_published_numbers_come_from(tmp_path):
    text = banner(tmp_path / "my-run", 7, reevaluated=False)
    assert text.startswith("Preview, not the published board: the models of the run my-run ")
    assert "beside 7 published entries, shown as committed to the board" in text and "--full does" in text
    assert "re-evaluated here from their weights (--full)" in banner(tmp_path / "my-run", 7, reevaluated=True)
