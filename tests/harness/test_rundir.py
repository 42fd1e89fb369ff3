"""The run directory and its one owner, RunDir: one writer at a time (a killed writer's lock taken
over), one plan unless appended, a held run directory refused, the report's staging folder removed,
and selection.json (never a bare NaN; a folder in its place is one line)."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import (CLI, cli, last_line_error, one_line_error, rerun, run_cli, selection, temporaries,
                           write_one_cell)
from tmem_bench.report import write_report


def test_a_second_writer_is_refused_and_a_killed_ones_lock_is_taken_over(tmp_path):
    profile = write_one_cell(tmp_path, steps=100000)
    first = subprocess.Popen(CLI + ["run", "coordinate_binding", "--profile", profile, "--out", "run"],
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lock = tmp_path / "run" / ".lock"
    try:
        deadline = time.monotonic() + 120
        while not (lock.exists() and lock.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert json.loads(lock.read_text())["pid"] == first.pid
        second = run_cli(["run", "coordinate_binding", "--profile", profile, "--out", "run"], tmp_path)
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert f"is in use by process {first.pid}" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    (tmp_path / "run" / ".results.csv.stale.tmp").write_text("left by a kill")
    third = run_cli(["run", "coordinate_binding", "--profile", profile, "--out", "run", "--steps", "4", "--append"],
                    tmp_path)
    assert third.returncode == 0, third.stderr
    assert f"taking over the lock of an earlier run that ended without releasing it (pid {first.pid}" in third.stderr
    assert "removed .results.csv.stale.tmp" in third.stderr
    assert not list((tmp_path / "run").glob(".*.tmp"))
    assert lock.read_text() == ""  # released cleanly


def test_another_plan_in_the_same_directory_is_refused_unless_appended(finished_run, tmp_path):
    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    profile = "tiny.toml"
    other = run_cli(["run", "coordinate_binding", "--profile", profile, "--out", "run", "--seed-list", "5,6"], tmp_path)
    assert other.returncode == 2 and "holds another plan" in other.stderr and "seeds" in other.stderr
    assert len(list((tmp_path / "run" / "cells").glob("*.json"))) == 1
    appended = run_cli(["run", "coordinate_binding", "--profile", profile, "--out", "run", "--seed-list", "5,6",
                        "--append"], tmp_path)
    assert appended.returncode == 0, appended.stderr
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert len(manifest["cells"]) == 3 and len(list((tmp_path / "run" / "cells").glob("*.json"))) == 3
    assert "3 readable of 3 planned" in (tmp_path / "run" / "report.md").read_text()


def test_report_refuses_a_run_directory_another_process_holds(finished_run, tmp_path):
    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    hold = ("import sys, time\nfrom tmem_bench.harness.rundir import RunDir\n"
            "with RunDir(sys.argv[1]).lock():\n    print('held', flush=True)\n    time.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, "run"], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = (tmp_path / "run" / "report.md").read_bytes()
        refused = run_cli(["report", "run"], tmp_path)
    finally:
        holder.kill()
        holder.wait()
    last_line_error(refused, f"is in use by process {holder.pid}")
    assert (tmp_path / "run" / "report.md").read_bytes() == before and temporaries(tmp_path / "run") == []


def test_a_report_killed_midway_leaves_a_staging_folder_the_next_report_removes(finished_run, tmp_path, capsys):
    from tmem_bench.cli import main

    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    staging = tmp_path / "run" / ".report-k1lled00"
    (staging / "figures").mkdir(parents=True)
    (staging / "report.md").write_text("half a report")
    assert main(["report", str(tmp_path / "run")]) == 0
    assert not staging.exists() and temporaries(tmp_path / "run") == []


def test_selection_json_as_a_folder_is_one_line_on_resume_and_report(run, capsys):
    (run / "selection.json").unlink()
    (run / "selection.json").mkdir()
    before = {p.name: p.stat().st_mtime_ns for p in (run / "cells").iterdir()}
    one_line_error(*rerun(run, capsys)[::2], "selection.json is a folder")
    assert {p.name: p.stat().st_mtime_ns for p in (run / "cells").iterdir()} == before
    code, _, err = cli(["report", run], capsys)
    one_line_error(code, err, "selection.json is a folder")


def test_selection_json_never_holds_a_bare_nan(run, capsys):
    def strict(text):
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"selection.json holds a bare {name}"))

    [search] = selection(run)["searches"]
    trial = search["trials"][0]["cell_id"]
    path = run / "cells" / f"{trial}.json"
    result = json.loads(path.read_text())
    result["validation"]["loss"] = float("nan")  # a trial whose last weights evaluate to a non-finite loss
    path.write_text(json.dumps(result))
    assert rerun(run, capsys)[0] == 0
    [search] = strict((run / "selection.json").read_text())["searches"]
    assert search["trials"][0]["loss"] is None
    report = write_report(run)
    assert not [p for p in report.problems if "selection.json" in p], report.problems


@pytest.mark.parametrize("name", ["cells/{cell}.json", "manifest.json"])
def test_a_fifo_where_a_run_keeps_a_file_is_named_not_waited_on(finished_run, tmp_path, name):
    """Issue 57: `mkfifo RUN/cells/<id>.json` (or RUN/manifest.json), then `tmem-bench report RUN`,
    blocked in open() until killed; the FIFO is now named as unreadable, in the report and one line."""
    import os

    run = tmp_path / "run"
    shutil.copytree(finished_run / "run", run)
    path = run / name.format(cell=next((run / "cells").glob("*.json")).stem)
    path.unlink()
    os.mkfifo(path)
    proc = run_cli(["report", str(run)], tmp_path)  # a timeout, not a hang, where it blocks
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "1 problem(s) with the run's files" in proc.stderr
    assert f"{path.name} is unreadable" in (run / "report.md").read_text()
    assert "not a regular file" in (run / "report.md").read_text()


def test_the_first_start_survives_a_resume_and_a_manifest_without_one_gains_none(tmp_path):
    """Issue 59: validity judges a hypothesis by the run's first start; a resume rewrites "started"."""
    from tmem_bench.harness.rundir import RunDir

    run = RunDir.create(tmp_path / "run")
    run.begin([], {"started": "2026-01-01T00:00:00+00:00"}, append=False)
    run.begin([], {"started": "2026-02-01T00:00:00+00:00"}, append=False)
    manifest = run.manifest()
    assert (manifest["first_started"], manifest["started"]) == ("2026-01-01T00:00:00+00:00", "2026-02-01T00:00:00+00:00")
    old = RunDir.create(tmp_path / "old")
    (tmp_path / "old/manifest.json").write_text(json.dumps({"started": "2026-01-01T00:00:00+00:00", "cells": []}))
    old.begin([], {"started": "2026-02-01T00:00:00+00:00"}, append=False)
    assert "first_started" not in old.manifest()
