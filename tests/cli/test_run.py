"""`tmem-bench run`, `report` and `jobs`: a tiny run end to end (and resumed), a report after every run
unless told not to, the report command's one-line errors, and what jobs says of a driver and of Slurm
jobs without submitit."""
import json
import shutil
import subprocess

import pandas as pd

from tests.helpers import CLI
from tests.report.helpers import RunBuilder
from tmem_bench.files import write_json


def test_tiny_end_to_end_run_writes_a_results_table(tmp_path):
    exe = shutil.which("tmem-bench")
    assert exe, "the tmem-bench command is not installed"
    out = tmp_path / "run"
    args = ["run", "coordinate_binding", "--models", "base", "--steps", "3", "--batch-size", "8",
            "--level", "n_writes=4", "--seed-list", "0,1", "--out", str(out)]
    proc = subprocess.run([exe] + args, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out / "results.csv")
    n_variants = table["variant"].nunique()
    assert sorted(table["seed"]) == [0] * n_variants + [1] * n_variants
    assert set(table["n_writes"]) == {4}
    assert (table["chance"] == 1 / 32).all() and (table["ceiling"] == 1.0).all()
    assert len(list((out / "cells").glob("*.json"))) == 2 * n_variants
    assert (out / "manifest.json").exists()
    assert "resuming" not in proc.stderr
    again = subprocess.run([exe] + args, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    n = 2 * n_variants
    assert again.returncode == 0 and f"resuming: {n} of {n} cells already finished" in again.stderr


def test_report_command(tmp_path, capsys):
    from tmem_bench.cli import main

    b = RunBuilder(tmp_path / "run")
    b.cell("occlusion", "base", 0, (0,), {(0,): 0.9, (6,): 0.5})
    recorded = tmp_path / "run" / "cells" / f"{b.cell('occlusion', 'base', 1, (0,), {(0,): 0.9})}.json"
    write_json(recorded, {**json.loads(recorded.read_text()), "hardware": "Some CPU, AVX2"})
    b.manifest()
    proc = subprocess.run(CLI + ["report", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"report: {tmp_path / 'run' / 'report.md'}" in proc.stdout and "90.0%" in proc.stdout
    assert "- hardware: Some CPU, AVX2 (1 cell); not recorded (1 cell)" in (tmp_path / "run" / "report.md").read_text()
    assert (tmp_path / "run" / "report.md").is_file() and (tmp_path / "run" / "figures").is_dir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    bad_dirs = (("nope", "does not exist"), ("file", "is not a directory"), ("empty", "is not a run directory"))
    for bad, needle in bad_dirs:
        assert main(["report", str(tmp_path / bad)]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_run_writes_the_report_unless_told_not_to(tmp_path, capsys):
    from tmem_bench.cli import main
    from tmem_bench.harness.runner import command_as_typed

    args = ["run", "coordinate_binding", "--models", "base", "--steps", "2", "--batch-size", "4",
            "--level", "n_writes=2", "--out", str(tmp_path / "run")]
    assert main(args + ["--no-report"]) == 0
    assert not (tmp_path / "run" / "report.md").exists()
    assert main(args) == 0  # resumes the finished cell, then reports
    assert (tmp_path / "run" / "report.md").is_file() and "report: " in capsys.readouterr().out
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["command"] == command_as_typed() and "/" not in manifest["command"][0]
    assert manifest["cells"] and all(len(c["id"]) == 16 for c in manifest["cells"])
    assert all(c["describe"].startswith("coordinate_binding") and " base @ n_writes=2," in c["describe"]
               for c in manifest["cells"])


def test_jobs_names_a_driver_only_while_it_runs(finished_run, tmp_path, capsys):
    from tmem_bench.cli import main
    from tmem_bench.harness.rundir import RunDir

    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    pid = json.loads((tmp_path / "run" / "jobs.json").read_text())["driver"]["pid"]
    assert main(["jobs", str(tmp_path / "run")]) == 0
    assert f"serial executor: no driver is running; the last one was process {pid}" in capsys.readouterr().out
    with RunDir(tmp_path / "run").lock():
        assert main(["jobs", str(tmp_path / "run")]) == 0
        assert "the cells run under their driver" in capsys.readouterr().out
        assert main(["jobs", str(tmp_path / "run"), "--cancel"]) == 2


def test_jobs_of_slurm_without_submitit_names_the_extra(tmp_path, monkeypatch, capsys):
    import importlib.util

    from tmem_bench.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "submitit" else real(name, *a))
    (tmp_path / "jobs.json").write_text(json.dumps({"executor": "slurm", "driver": {"pid": 1, "host": "h"},
                                                    "cluster": "slurm", "folder": "slurm", "jobs": []}))
    for cancel in ([], ["--cancel"]):
        assert main(["jobs", str(tmp_path), *cancel]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and 'install it with: pip install "tmem-bench[slurm]"' in err[0]
