"""An error of the file system is one line that says what to do: a full disk (no torn file is left, and
the same command resumes once space is freed) and a read-only folder, for run, report, submit and build;
and a count that is no integer in range (check_int) is one line too."""
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


# Issue 57: "1e9" and "2.0" gave a ValueError traceback (`validity --resamples 1e9`, `probe --calibrate
# --steps 1e1`), and 99999999999999999999 a numpy one, since no count had an upper bound.
@pytest.mark.parametrize("value, expected", [("1e9", 1_000_000_000), ("2.0", 2), (" 7 ", 7), (3.0, 3), (12, 12)])
def test_check_int_reads_an_integer_in_any_notation(value, expected):
    from tmem_bench.errors import check_int

    assert check_int("--n", value) == expected and type(check_int("--n", value)) is int


@pytest.mark.parametrize("value, maximum, message", [
    ("99999999999999999999", None, "--n must be an integer from 1 to 2147483647, got '99999999999999999999'"),
    (10**400, None, "--n must be an integer from 1 to 2147483647, got 1000000000000000000000000000000000000..."),
    ("1e400", None, "--n must be an integer >= 1, got '1e400'"),
    ("nan", None, "--n must be an integer >= 1, got 'nan'"),
    (float("inf"), None, "--n must be an integer >= 1, got inf"),
    ("2.5", None, "--n must be an integer >= 1, got '2.5'"),
    ("x", None, "--n must be an integer >= 1, got 'x'"),
    (True, None, "--n must be an integer >= 1, got True"),
    ("0", None, "--n must be an integer >= 1, got '0'"),
    ("1e9", 100_000, "--n must be an integer from 1 to 100000, got '1e9'"),
    ("0", 100_000, "--n must be an integer from 1 to 100000, got '0'"),
])
def test_check_int_refuses_in_one_line_naming_what_is_allowed(value, maximum, message):
    from tmem_bench.errors import UsageError, check_int

    with pytest.raises(UsageError) as refused:
        check_int("--n", value, maximum=maximum)
    assert str(refused.value) == message


@pytest.mark.parametrize("args, said", [
    (["validity", "a", "b", "--resamples", "1e9"], "--resamples must be an integer from 1 to 100000, got '1e9'"),
    (["validity", "a", "b", "--resamples", "99999999999999999999"], "--resamples must be an integer from 1 to"),
    (["probe", "--calibrate", "--steps", "2.5"], "--steps must be an integer >= 1, got '2.5'"),
])
def test_a_count_on_the_command_line_is_refused_in_one_line(capsys, args, said):
    from tests.helpers import cli, one_line_error

    one_line_error(*cli(args, capsys)[::2], said)
