"""The atomic writer (tmem_bench/files.py)."""
import os

import pytest

from tmem_bench.files import write_atomic


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_the_atomic_writer_honours_the_umask(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        write_atomic(tmp_path / "file", "text")
    finally:
        os.umask(previous)
    assert (tmp_path / "file").stat().st_mode & 0o777 == mode
