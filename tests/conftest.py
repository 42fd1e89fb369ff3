import os
import shutil
from uuid import uuid4

import pytest
import torch

if not torch.cuda.is_available():
    # Without a GPU, the fused Triton scan's tests run under Triton's interpreter, which
    # must be chosen before Triton is first imported (tests/tensor_memory/test_triton.py).
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The helper modules the test folders share assert too; pytest rewrites their asserts as a test's.
pytest.register_assert_rewrite("tests.helpers", "tests.profiles", "tests.harness.helpers", "tests.leaderboard.helpers",
                               "tests.contracts.helpers", "tests.report.helpers")

from tests import profiles  # noqa: E402
from tests.helpers import new_board, run_cli, write_one_cell  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _session_cache_folder(tmp_path_factory):
    # The session's fixtures run commands too (measured step timings, validation records): never in
    # the user's cache. Each test then gets its own below.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMEM_BENCH_CACHE", str(tmp_path_factory.getbasetemp() / "tmem-bench-cache" / "session"))
        yield


@pytest.fixture(autouse=True)
def _own_cache_folder(tmp_path_factory, monkeypatch):
    # validate's records and fetched weights: each test's own, never the user's nor another test's
    monkeypatch.setenv("TMEM_BENCH_CACHE", str(tmp_path_factory.getbasetemp() / "tmem-bench-cache" / uuid4().hex))


@pytest.fixture(autouse=True)
def _single_thread_torch():
    # Tests share two cores with each other; one thread each keeps them predictable.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_profile():
    """The tests' small profile text: tiny_profile() is tests.profiles.TINY_PROFILE; with arguments,
    a variant derived from it (tests.profiles.tiny_profile)."""
    return profiles.tiny_profile


# Finished runs that tests in several folders read (each copies one before changing it): trained once.

@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """A folder holding tiny.toml and the finished run of it in run/ (copy it before changing it)."""
    folder = tmp_path_factory.mktemp("finished")
    write_one_cell(folder, steps=2)
    proc = run_cli(["run", "coordinate_binding", "--profile", "tiny.toml", "--out", "run"], folder)
    assert proc.returncode == 0, proc.stderr
    return folder


@pytest.fixture(scope="session")
def submittable(tmp_path_factory):
    """A folder with a finished run (run/, planned from an absolute profile path, so that it can be
    submitted from anywhere) and a leaderboard where it is published as 'First' (published/)."""
    from tmem_bench.cli import main

    folder = tmp_path_factory.mktemp("submittable")
    profile = write_one_cell(folder, steps=2)
    assert main(["run", "coordinate_binding", "--profile", profile, "--out", str(folder / "run"), "--no-report"]) == 0
    board = new_board(folder / "published")
    assert main(["leaderboard", "submit", str(folder / "run"), "--name", "First", "--leaderboard", str(board)]) == 0
    return folder


@pytest.fixture(scope="session")
def grid_run(tmp_path_factory):
    """A folder holding grid.toml (tests.profiles.GRID) and its finished run in run/: one search of two
    lrs at seed 0, and seed 1 at the lr chosen (copy it before changing it: the `run` fixture)."""
    from tmem_bench.cli import main

    folder = tmp_path_factory.mktemp("grid")
    (folder / "grid.toml").write_text(profiles.GRID)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the tests that train its cells again have (_single_thread_torch)
    try:
        assert main(["run", "coordinate_binding", "--profile", str(folder / "grid.toml"), "--out", str(folder / "run"),
                     "--device", "cpu", "--no-report"]) == 0
    finally:
        torch.set_num_threads(threads)
    return folder


@pytest.fixture
def run(grid_run, tmp_path, monkeypatch):
    """A copy of grid_run's run directory (tmp_path/run, beside grid.toml), to change."""
    monkeypatch.setenv("COLUMNS", "400")  # rich would fold the lines the tests look for
    shutil.copytree(grid_run, tmp_path, dirs_exist_ok=True)
    return tmp_path / "run"
