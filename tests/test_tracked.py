"""What the repository tracks (issue 46): a run directory's `.lock` is the lock of whoever runs it on
their machine, never part of a committed run."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT


def _tracked() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [Path(name) for name in out.decode().split("\0") if name]


def test_no_lock_file_is_committed():
    locks = [path for path in _tracked() if path.name == ".lock"]
    assert locks == [], f"untrack them with git rm --cached: {locks}"
