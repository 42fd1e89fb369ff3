"""The board's writes: a submit of several models is all or nothing, a build never overwrites the
published pages with a preview, and a kill of submit, build or validate at any point leaves the
board as it was or complete, with what the killed command left removed by the next one."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import empty_board
from tests.leaderboard.helpers import tiny_run
from tmem_bench.cli import main

# Every operation a board's command changes the file system with; a kill just before any one of
# them is a kill at any point, as far as what is on disk can tell.
OPERATIONS = ("open", "fsync", "replace", "rename", "mkdir", "sendfile", "unlink", "rmdir")
SLUGS = ["tiny-base", "tiny-lstm"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A finished run of two models and the board that submitting it makes (the reference)."""
    folder = tmp_path_factory.mktemp("writes")
    run_dir = tiny_run(folder)
    reference = empty_board(folder / "reference")
    assert main(submit_args(run_dir, reference)) == 0
    return run_dir, reference


@pytest.fixture
def fast_validation(monkeypatch):
    """validate without re-evaluating weights (test_reeval covers that): these tests are about writes."""
    checks = sys.modules["tmem_bench.leaderboard.validate"]
    monkeypatch.setattr(checks, "reevaluate", lambda result, weights, reject: None)
    monkeypatch.setattr(checks, "_probe_again", lambda results, reject: None)


def submit_args(run_dir: Path, board: Path) -> list[str]:
    return ["leaderboard", "submit", str(run_dir), "--name", "Tiny", "--leaderboard", str(board)]


def killed_at(argv: list[str], at: int | None) -> tuple[bool, int]:
    """Run the command in a forked child that SIGKILLs itself just before its `at`-th file-system
    operation (nothing of its own cleanup runs); (whether it was killed, its operations otherwise)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read)
        real = {name: getattr(os, name) for name in OPERATIONS}
        count = 0

        def counted(name):
            def operation(*args, **kwargs):
                nonlocal count
                count += 1
                if count == at:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real[name](*args, **kwargs)
            return operation

        for name in OPERATIONS:
            setattr(os, name, counted(name))
        code = 99
        with contextlib.redirect_stdout(open(os.devnull, "w")), contextlib.redirect_stderr(open(os.devnull, "w")):
            with contextlib.suppress(BaseException):
                code = main(argv)
        for name, function in real.items():
            setattr(os, name, function)
        os.write(write, json.dumps([code, count]).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        reported = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return True, 0
    code, count = json.loads(reported)
    assert code == 0, f"{argv} exited {code} unkilled"
    return False, count


def files(folder: Path) -> dict[str, bytes]:
    """What the board publishes: every file but hidden ones (temporaries, a cache)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)}


def temporaries(board: Path) -> list[str]:
    """What a writer leaves while it writes: a submit's staging folder, an atomic writer's file."""
    return [str(p.relative_to(board)) for p in board.rglob(".*")
            if p.name.endswith(".tmp") or (p.is_dir() and p.parent.name == "entries")]


def placed(board: Path) -> list[str]:
    entries = board / "entries"
    return sorted(p.name for p in entries.iterdir() if not p.name.startswith(".")) if entries.is_dir() else []


def assert_whole(board: Path, reference: Path, slugs: list[str]) -> None:
    """Each entry there is the reference's, file for file (the submission time aside)."""
    for slug in slugs:
        mine, theirs = files(board / "entries" / slug), files(reference / "entries" / slug)
        assert sorted(mine) == sorted(theirs), slug
        for name in mine:
            if name == "entry.json":
                a, b = json.loads(mine[name]), json.loads(theirs[name])
                assert {**a, "submitted": None} == {**b, "submitted": None}, slug
            else:
                assert mine[name] == theirs[name], f"{slug}/{name}"


def sample(n: int, tail: int, k: int, seed: int) -> list[int]:
    """k operations drawn at random (seeded) and the last `tail`: where a command puts things in place."""
    return sorted({*random.Random(seed).sample(range(1, n + 1), min(k, n)), *range(max(1, n - tail + 1), n + 1)})


def test_a_submit_killed_at_any_point_leaves_the_board_as_before_or_complete(made, tmp_path, fast_validation,
                                                                             capsys):
    run_dir, reference = made
    killed, n = killed_at(submit_args(run_dir, empty_board(tmp_path / "count")), None)
    assert not killed and n > 20
    for i, at in enumerate(sample(n, tail=8, k=8, seed=0)):
        board = empty_board(tmp_path / f"at{at}")
        assert killed_at(submit_args(run_dir, board), at)[0], f"operation {at} of {n} was not reached"
        there = placed(board)
        assert_whole(board, reference, there)
        # Between the kill and the next command a submit may be midway through renaming entries
        # into place; its journal says so, and the next command of the board finishes it.
        pending = [p for p in (board / "entries").glob(".submit-*") if (p / "journal.json").is_file()]
        assert there in ([], SLUGS) or pending, f"killed at {at} of {n}: {there} and no journal"
        if i % 2:
            assert main(["leaderboard", "build", "--leaderboard", str(board)]) == 0
            assert placed(board) in ([], SLUGS) and temporaries(board) == [], f"killed at {at} of {n}"
        assert main(submit_args(run_dir, board)) == 0, capsys.readouterr().err
        assert placed(board) == SLUGS and temporaries(board) == [], f"killed at {at} of {n}"
        assert_whole(board, reference, SLUGS)
    assert main(["leaderboard", "validate", str(board)]) == 0


def test_the_rerun_of_a_submit_killed_between_its_entries_finishes_it(made, tmp_path, capsys):
    """Killed after its first entry is in place (the second rename): the rerun of the same command
    finishes the board instead of refusing the entry that is there."""
    run_dir, reference = made
    board = empty_board(tmp_path / "board")
    _, n = killed_at(submit_args(run_dir, empty_board(tmp_path / "count")), None)
    renames = []
    for at in range(n, 0, -1):  # the last rename of an entry into entries/ is near the end
        trial = empty_board(tmp_path / f"t{at}")
        killed_at(submit_args(run_dir, trial), at)
        if placed(trial) == SLUGS[:1]:
            renames.append(at)
            break
    assert renames, "no kill point leaves one entry of two in place"
    killed_at(submit_args(run_dir, board), renames[0])
    assert placed(board) == SLUGS[:1]
    assert main(submit_args(run_dir, board)) == 0
    assert "finishing a submit that was interrupted" in capsys.readouterr().out
    assert placed(board) == SLUGS and temporaries(board) == []
    assert_whole(board, reference, SLUGS)
    assert main(submit_args(run_dir, board)) == 0, "the same command on the finished board is done, not refused"
    other = ["leaderboard", "submit", str(run_dir), "--name", "Tiny", "--model", "base", "--leaderboard", str(board)]
    assert main(other) == 2 and "published already" in capsys.readouterr().err


def test_what_a_killed_submit_and_build_left_is_removed_by_the_next_command(made, tmp_path, fast_validation):
    run_dir, reference = made
    board = tmp_path / "board"
    shutil.copytree(reference, board)
    staging = board / "entries" / ".submit-k1lled00" / "tiny-base" / "cells"
    staging.mkdir(parents=True)
    shutil.copy(next((reference / "entries" / "tiny-base" / "cells").glob("*.safetensors")), staging)
    (board / ".README.md.k1lled00.tmp").write_text("half a page")
    (board / ".index.html.k1lled00.tmp").write_text("half a page")
    assert main(["leaderboard", "build", "--leaderboard", str(board)]) == 0
    assert temporaries(board) == []
    staging.mkdir(parents=True)
    fresh = empty_board(tmp_path / "fresh")
    assert main(submit_args(run_dir, fresh)) == 0 and temporaries(fresh) == []
    (fresh / "entries" / ".submit-k1lled01").mkdir()
    assert main(submit_args(run_dir, fresh)) == 0 and temporaries(fresh) == []


def test_a_build_killed_at_any_point_leaves_each_page_old_or_new(made, tmp_path, fast_validation):
    _, reference = made
    new = tmp_path / "new"
    shutil.copytree(reference, new)
    assert main(["leaderboard", "build", "--leaderboard", str(new)]) == 0
    old = tmp_path / "old"
    shutil.copytree(reference, old)
    (old / "README.md").write_text("the board before\n")
    (old / "index.html").write_text("<p>the board before</p>\n")
    shutil.copytree(old, tmp_path / "count")
    killed, n = killed_at(["leaderboard", "build", "--leaderboard", str(tmp_path / "count")], None)
    assert not killed and n >= 4
    for at in range(1, n + 1):
        board = tmp_path / f"at{at}"
        shutil.copytree(old, board)
        assert killed_at(["leaderboard", "build", "--leaderboard", str(board)], at)[0]
        for name in ("README.md", "index.html"):
            assert (board / name).read_bytes() in ((old / name).read_bytes(), (new / name).read_bytes()), at
        assert main(["leaderboard", "build", "--leaderboard", str(board)]) == 0
        assert temporaries(board) == [] and files(board) == files(new), f"killed at {at} of {n}"


def test_a_validate_killed_at_random_times_changes_nothing(made, tmp_path):
    _, reference = made
    board = tmp_path / "board"
    shutil.copytree(reference, board)
    before = files(board)
    start = time.monotonic()
    # its only writes are this machine's validation records (cache.py), in the user's cache folder, not the board
    assert killed_at(["leaderboard", "validate", str(board)], None)[0] is False
    took = time.monotonic() - start
    for delay in sorted(random.Random(1).uniform(0, took) for _ in range(3)):
        pid = os.fork()
        if pid == 0:
            with contextlib.redirect_stdout(open(os.devnull, "w")), contextlib.redirect_stderr(open(os.devnull, "w")):
                with contextlib.suppress(BaseException):
                    main(["leaderboard", "validate", str(board)])
            os._exit(0)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        assert files(board) == before and temporaries(board) == []
    assert main(["leaderboard", "validate", str(board)]) == 0


def test_a_second_writer_of_a_board_is_refused(made, tmp_path, capsys):
    run_dir, _ = made
    board = empty_board(tmp_path / "board")
    fd = os.open(board, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert main(submit_args(run_dir, board)) == 2
        assert "is in use by another" in capsys.readouterr().err
        assert main(["leaderboard", "build", "--leaderboard", str(board)]) == 2
    finally:
        os.close(fd)
    assert placed(board) == []


def test_a_preview_is_never_written_over_the_board(made, tmp_path, monkeypatch, capsys):
    run_dir, reference = made
    board = tmp_path / "leaderboard"
    shutil.copytree(reference, board)
    (board / "README.md").write_text("the published board\n")
    (board / "index.html").write_text("<p>the published board</p>\n")
    before = files(board)
    (tmp_path / "link").symlink_to(board)
    monkeypatch.chdir(tmp_path)
    for out in (board, board / ".", tmp_path / "link", board / "entries" / "preview", "leaderboard", "./leaderboard/"):
        code = main(["leaderboard", "build", "--leaderboard", str(board), "--with", str(run_dir), "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1 and "leaderboard folder" in err, (out, err)
    assert files(board) == before


@pytest.mark.parametrize("in_the_way", ["README.md", "index.html", "out is a file"])
def test_a_preview_with_a_folder_in_the_way_is_one_line(made, tmp_path, in_the_way, capsys):
    run_dir, reference = made
    out = tmp_path / "preview"
    if in_the_way == "out is a file":
        out.write_text("a file")
    else:
        (out / in_the_way).mkdir(parents=True)
    code = main(["leaderboard", "build", "--leaderboard", str(reference), "--with", str(run_dir), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "in the way" in err or "is a file" in err


@pytest.fixture
def tmpfs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    point = tmp_path / "fs"
    point.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(point)],
                          capture_output=True, text=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    yield point
    subprocess.run(["umount", "-l", str(point)], check=True)


def test_a_submit_out_of_space_at_any_point_changes_nothing_and_names_the_boards_file(made, tmpfs, capsys):
    run_dir, reference = made
    need = sum(p.stat().st_size for p in (reference / "entries").rglob("*") if p.is_file())
    board = empty_board(tmpfs / "board")
    for fraction in (0.05, 0.3, 0.6, 0.9):
        filler = tmpfs / "filler"
        free = os.statvfs(tmpfs).f_bavail * os.statvfs(tmpfs).f_frsize
        filler.write_bytes(b"\0" * max(0, free - int(fraction * need)))
        assert main(submit_args(run_dir, board)) == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert "No space left on device" in last and str(board / "entries") in last and str(run_dir) not in last, last
        assert placed(board) == [] and temporaries(board) == [], fraction
        filler.unlink()
    assert main(submit_args(run_dir, board)) == 0 and placed(board) == SLUGS
