"""`tmem-bench run`, `report` and `jobs`: a tiny run end to end, a report after every run unless told
not to, the report command's one-line errors, and what jobs says of a driver."""
import json
import subprocess

from tests.helpers import CLI
from tests.report.helpers import RunBuilder
from tmem_bench.harness.results import write_json


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
