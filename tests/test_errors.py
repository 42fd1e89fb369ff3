"""An error of the file system is one line that says what to do: a full disk (no torn file is left, and
the same command resumes once space is freed) and a read-only folder, for run, report, submit and build."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import last_line_error, new_board, run_cli, temporaries, write_one_cell


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size) -> the folder of a new tmpfs of that size, unmounted after the test (needs root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = []

    def mount(size: str) -> Path:
        point = tmp_path / f"fs{len(mounted)}"
        point.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                              capture_output=True, text=True)
        if proc.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=True)


def remount(point: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(point)], check=True)


def fill(folder: Path) -> None:
    with open(folder / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def test_a_full_disk_is_one_line_leaves_no_torn_file_and_resumes_once_freed(tmpfs, tmp_path):
    # 12 KiB: the manifest and the jobs record fit, the cell's weights do not, and then neither does
    # the failure record.
    fs = tmpfs("12k")
    profile = write_one_cell(tmp_path, steps=2)
    args = ["run", "coordinate_binding", "--profile", profile, "--out", str(fs / "run"), "--no-report"]
    last_line_error(run_cli(args, tmp_path), "No space left on device; free some space and rerun the same command")
    assert temporaries(fs) == [] and not list((fs / "run" / "cells").glob("*.json"))
    remount(fs, "size=4m")
    resumed = run_cli(args, tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert len(list((fs / "run" / "cells").glob("*.json"))) == 1 and temporaries(fs) == []


def test_report_and_submit_into_a_full_folder_are_one_line_and_change_nothing(tmpfs, finished_run, submittable,
                                                                             tmp_path):
    fs = tmpfs("4m")
    shutil.copytree(finished_run / "run", fs / "run")
    board = new_board(fs / "board")
    fill(fs)
    before = {p: p.read_bytes() for p in (fs / "run").rglob("*") if p.is_file()}
    last_line_error(run_cli(["report", "run"], fs), "No space left on device")
    assert {p: p.read_bytes() for p in (fs / "run").rglob("*") if p.is_file()} == before
    assert temporaries(fs) == []
    last_line_error(run_cli(["leaderboard", "submit", str(submittable / "run"), "--name", "X", "--leaderboard",
                            str(board)], tmp_path), "No space left on device")
    assert list((board / "entries").glob("*")) == []


def test_report_submit_and_build_in_a_read_only_folder_are_one_line(tmpfs, finished_run, submittable, tmp_path):
    fs = tmpfs("4m")
    shutil.copytree(finished_run / "run", fs / "run")
    board = new_board(fs / "board")
    remount(fs, "ro")
    needle = "Read-only file system; give a folder on a writable file system"
    last_line_error(run_cli(["report", "run"], fs), needle)
    last_line_error(run_cli(["leaderboard", "submit", str(submittable / "run"), "--name", "X", "--leaderboard",
                            str(board)], tmp_path), needle)
    last_line_error(run_cli(["leaderboard", "build", "--leaderboard", str(board)], tmp_path), needle)
