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


# The claims file is being rewritten with its verdict rules (issue 46 leaves its five mentions of the
# paper's summary to that work); reports under docs/runs/ are generated, and say what they said then.
def test_nothing_cites_a_paper_md_the_repository_does_not_have():
    """The summary of the paper lives outside the repository: code, profiles and pages cite the paper
    itself (title and arXiv number) or docs/models.md."""
    assert not (ROOT / "PAPER.md").exists()
    citing = []
    for path in _tracked():
        if path.parts[:2] == ("docs", "runs") or path.suffix not in (
                ".py", ".toml", ".md", ".html", ".txt", ".cfg"):
            continue
        if "PAPER.md" in (ROOT / path).read_text(errors="replace") and path != Path(__file__).relative_to(ROOT):
            citing.append(str(path))
    assert citing == []
