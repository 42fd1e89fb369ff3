"""The worked plug-ins (examples/kv_memory, examples/recall_task): installed as packages, they are a
model and a task like the suite's own."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "kv_memory"
TASK_EXAMPLE = ROOT / "examples" / "recall_task"


def test_examples_are_small():
    for path in (EXAMPLE / "kv_memory.py", TASK_EXAMPLE / "recall_task.py"):
        assert len(path.read_text().splitlines()) < 100, path


def installed(example: Path, tmp_path: Path):
    """`tmem-bench` with the example installed as a package (in a folder of its own, on PYTHONPATH)."""
    source = tmp_path / example.name
    shutil.copytree(example, source)  # the build writes into its source folder; keep the repository clean
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(site), str(source)], check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}  # two cores shared with other tests
    tool = [sys.executable, "-c", "import sys; from tmem_bench.cli import main; sys.exit(main())"]

    def bench(*args):
        return subprocess.run([*tool, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    return bench


def test_installed_example_is_listed_checked_and_run(tmp_path, tiny_profile):
    bench = installed(EXAMPLE, tmp_path)

    listed = bench("list")
    assert listed.returncode == 0, listed.stderr
    assert "kv_memory" in next(line for line in listed.stdout.splitlines() if line.startswith("models"))

    checked = bench("check", "kv_memory")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "kv_memory: 10 of 10 checks pass" in checked.stdout and "fixed: " in checked.stdout

    (tmp_path / "tiny.toml").write_text(tiny_profile(tasks={"coordinate_binding": {
        "variants": "[{}, { block_queries = true }]"}}))
    run = bench("run", "coordinate_binding", "--models", "kv_memory", "--profile", "tiny.toml", "--steps", "2",
                "--out", "run", "--no-report")
    assert run.returncode == 0, run.stderr
    assert len(list((tmp_path / "run" / "cells").glob("*.json"))) == 2  # both variants


def test_installed_task_example_is_listed_checked_and_run(tmp_path, tiny_profile):
    bench = installed(TASK_EXAMPLE, tmp_path)

    listed = bench("list")
    assert listed.returncode == 0, listed.stderr
    assert "recall  axes: n_items  classes: 16" in listed.stdout

    checked = bench("check", "--task", "recall")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "task recall: 9 of 9 checks pass" in checked.stdout

    # By its entry-point name, in no profile: the task's own variants at the level asked for.
    run = bench("run", "recall", "--models", "base", "--level", "n_items=4", "--steps", "2", "--out", "run",
                "--no-report")
    assert run.returncode == 0, run.stderr
    assert len(list((tmp_path / "run" / "cells").glob("*.json"))) == 2  # standard and memory_forcing

    # By module:attribute, in a profile's [tasks] section that names the task's variant.
    (tmp_path / "tiny.toml").write_text(tiny_profile(tasks={"coordinate_binding": None, '"recall_task:Recall"': {
        "levels": "{ n_items = [4, 8] }", "train_at": "{ n_items = 4 }",
        "variants": '[{}, { variant = "memory_forcing" }]'}}))
    run = bench("run", "recall_task:Recall", "--profile", "tiny.toml", "--out", "run2", "--no-report")
    assert run.returncode == 0, run.stderr
    variants = {json.loads(p.read_text())["cell"]["variant"] for p in (tmp_path / "run2" / "cells").glob("*.json")}
    assert variants == {"standard", "block_query=True"}
