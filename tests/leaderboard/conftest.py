"""The board most leaderboard tests start from (a module that needs another defines its own)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers import empty_board
from tests.leaderboard.helpers import tiny_run
import tmem_bench.leaderboard.validate  # noqa: F401 - loaded lazily by the package; tests patch it through sys.modules
from tmem_bench.cli import main


@pytest.fixture(scope="package")
def pristine(tmp_path_factory) -> Path:
    """A leaderboard with two entries (base and lstm on two tasks, three seeds each) submitted from a real run."""
    folder = tmp_path_factory.mktemp("lb")
    run_dir = tiny_run(folder)
    board = empty_board(folder)
    assert main(["leaderboard", "submit", str(run_dir), "--name", "Tiny", "--leaderboard", str(board),
                 "--url", "https://example.org/tiny", "--description", "a test"]) == 0
    return board


@pytest.fixture
def board(pristine, tmp_path) -> Path:
    copy = tmp_path / "leaderboard"
    shutil.copytree(pristine, copy)
    return copy
