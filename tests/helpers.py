"""What tests in more than one folder share: the command line in a process or in this one, one-line
error checks, empty boards, the profile file of one cell, and reading a finished grid run."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.profiles import one_cell

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "tmem_bench.cli"]
BOARD_SCHEMA = ROOT / "leaderboard" / "entry.schema.json"


def run_cli(args, cwd):
    # A wide console: rich would otherwise fold the messages the tests look for.
    return subprocess.run(CLI + args, capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**os.environ, "COLUMNS": "400"})


def cli(args, capsys) -> tuple[int, str, str]:
    from tmem_bench.cli import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def last_line_error(proc, needle: str) -> None:
    """A process that failed with exit 2, no traceback, and `needle` in its last line, the error."""
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("tmem-bench: error: ") and needle in last, proc.stderr


def temporaries(folder: Path) -> list[str]:
    return [str(p) for p in folder.rglob(".*") if p.name != ".lock"]


def new_board(folder: Path) -> Path:
    """An empty leaderboard in `folder`: its schema and nothing else."""
    folder.mkdir(parents=True)
    shutil.copy(BOARD_SCHEMA, folder / BOARD_SCHEMA.name)
    return folder


def empty_board(folder: Path) -> Path:
    """An empty leaderboard in folder/leaderboard."""
    return new_board(folder / "leaderboard")


def write_one_cell(folder: Path, steps: int = 4, lr: float = 1e-3, extra: str = "") -> str:
    """folder/tiny.toml: the profile of one cell (tests.profiles.one_cell), `extra` appended."""
    path = folder / "tiny.toml"
    path.write_text(one_cell(steps, lr) + extra)
    return str(path)


def middle_level(task) -> dict:
    """The middle of the small grid the task declares (some evidence seen, some held back)."""
    return {axis: values[len(values) // 2] for axis, values in task.levels.items()}


# A copy of the finished grid run (the `run` fixture of tests/conftest.py).

def rerun(run: Path, capsys, *flags: str) -> tuple[int, str, str]:
    return cli(["run", "coordinate_binding", "--profile", run.parent / "grid.toml", "--out", run, "--device", "cpu",
                "--no-report", *flags], capsys)


def selection(run: Path) -> dict:
    return json.loads((run / "selection.json").read_text())


def chosen_cells(run: Path) -> set[str]:
    """The cells a report may show: the trial at the chosen lr and the seeds trained at it."""
    [search] = selection(run)["searches"]
    return {t["cell_id"] for t in search["trials"] if t["lr"] == search["chosen_lr"]} | set(search["final_cells"])
