"""What the leaderboard's test modules share: a tiny run of two models on two tasks to submit (its
profile derived from tests.profiles.TINY_PROFILE), and an entry's files."""
from __future__ import annotations

import json
from pathlib import Path

from tests.profiles import TESTS_ONLY, tiny_profile
from tmem_bench.cli import main

# base and lstm on coordinate_binding (trained at n_writes=2, evaluated at 2 and 4) and on no_harm, three seeds.
BOARD_PROFILE = tiny_profile(description=TESTS_ONLY, train={"seeds": [0, 1, 2]},
                             tasks={"coordinate_binding": {"models": '["base", "lstm"]'},
                                    "no_harm": {"models": '["base", "lstm"]', "levels": "{}"}})


def tiny_run(folder: Path, task: str = "all", *extra: str) -> Path:
    profile = folder / "tiny.toml"
    profile.write_text(BOARD_PROFILE)
    run_dir = folder / "run"
    assert main(["run", task, "--profile", str(profile), "--out", str(run_dir), "--no-report", *extra]) == 0
    return run_dir


def entry_path(board: Path, slug: str = "tiny-base") -> Path:
    return board / "entries" / slug


def load(board: Path, slug: str = "tiny-base") -> dict:
    return json.loads((entry_path(board, slug) / "entry.json").read_text())


def cells(board: Path, slug: str = "tiny-base") -> list[Path]:
    return sorted((entry_path(board, slug) / "cells").glob("*.json"))
