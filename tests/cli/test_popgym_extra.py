"""Without the popgym extra, POPGym's tasks and the external profile are absent, and naming them is
one line that says what to install (run in a process where `import popgym` fails, installed or not)."""
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT

# A process in which popgym cannot be imported, whether or not this environment has it.
WITHOUT = ("import sys; sys.modules['popgym'] = None; from tmem_bench.cli import main; "
           "sys.exit(main(sys.argv[1:]))")


def without_popgym(*args):
    return subprocess.run([sys.executable, "-c", WITHOUT, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env={**os.environ, "COLUMNS": "400"})


@pytest.mark.parametrize("args", [
    ["run", "popgym_count_recall", "--dry-run"],
    ["run", "all", "--profile", "external", "--dry-run"],
    ["check", "--task", "popgym_repeat_first"],
])
def test_naming_a_popgym_task_without_the_extra_is_one_line_saying_what_to_install(args):
    out = without_popgym(*args)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "needs the popgym extra: pip install -e \".[popgym]\"" in lines[0], lines[0]


def test_submitting_the_external_run_without_the_extra_says_what_to_install(tmp_path):
    shutil.copy(ROOT / "leaderboard" / "entry.schema.json", tmp_path)
    out = without_popgym("leaderboard", "submit", "docs/runs/external", "--name", "x", "--leaderboard", str(tmp_path))
    assert out.returncode == 2 and "needs the popgym extra" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry.schema.json"]


def test_list_without_the_extra_leaves_the_popgym_tasks_and_the_external_profile_out_with_a_hint():
    out = without_popgym("list")
    assert out.returncode == 0, out.stderr
    assert "popgym_repeat_first" not in out.stdout and "external:" not in out.stdout
    hints = [line for line in out.stdout.splitlines() if "popgym extra" in line]
    assert hints == ['  (4 popgym tasks need the popgym extra: pip install -e ".[popgym]")'], out.stdout


def test_list_with_the_extra_shows_the_popgym_tasks_and_the_external_profile():
    pytest.importorskip("popgym")
    from tmem_bench.registry import TASKS

    out = subprocess.run([sys.executable, "-m", "tmem_bench.cli", "list"], capture_output=True, text=True, cwd=ROOT,
                         timeout=300, env={**os.environ, "COLUMNS": "400"})
    assert out.returncode == 0, out.stderr
    assert not TASKS.missing_extras and "tasks need the popgym extra" not in out.stdout
    for name in ("popgym_repeat_first", "popgym_repeat_previous", "popgym_autoencode", "popgym_count_recall",
                 "external:"):
        assert name in out.stdout
