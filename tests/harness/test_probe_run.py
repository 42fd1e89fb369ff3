"""The state probe over a run's cells (`tmem-bench probe`): state_probe.json written with each probed
cell's readout and its calibration on the closest reference state, resumed without probing a cell
again, the same numbers after a kill and a resume as in one go; bad arguments are one line."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from tmem_bench.cli import main
from tmem_bench.contracts.device import hardware, resolve_device
from tmem_bench.diagnostics.state_probe import NO_STATE, PROBED, ReadoutConfig
from tmem_bench.errors import UsageError
from tmem_bench.harness import probe_run as probe_run_module
from tmem_bench.harness.probe_run import CALIBRATION_GOAL, probe_run
from tmem_bench.report.data import usable_probe_accuracy

TINY = ReadoutConfig(width=16, query_width=16, mlp_width=16, bilinear_units=8, bilinear_query=8, bilinear_rank=16,
                     attention_width=16, learned_rows=4, steps=20, validation_size=64, validate_every=10)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("probe") / "run"
    assert main(["run", "coordinate_binding", "--models", "base,lstm", "--steps", "3", "--batch-size", "8",
                 "--level", "n_writes=4", "--seeds", "1", "--out", str(out), "--no-report"]) == 0
    return out


def test_a_run_is_probed_into_state_probe_json_and_resumed(tiny_run, capsys, monkeypatch):
    assert main(["probe", str(tiny_run), "--steps", "20", "--readouts", "gated,rows_linear"]) == 0
    doc = json.loads((tiny_run / "state_probe.json").read_text())
    assert doc["readout_config"]["steps"] == 20 and "20 steps" in doc["readout"]
    by_label = {}
    for row in doc["rows"]:
        by_label.setdefault(row["label"], []).append(row)
    assert {r["status"] for r in by_label["base"]} == {NO_STATE}
    assert all(r["probe_accuracy"] is None and "calibration" not in r for r in by_label["base"])
    assert len(by_label["lstm"]) == 2  # the task's two variants
    for lstm in by_label["lstm"]:
        assert lstm["status"] == PROBED and 0.0 <= lstm["probe_accuracy"] <= 1.0 and lstm["n_writes"] == 4
        assert lstm["readout"] in ("gated", "rows_linear") and set(lstm["readouts"]) == {"gated", "rows_linear"}
        assert lstm["hardware"] == hardware(resolve_device("auto"))  # the command's default device
        # Its calibration: the family on the reference of its format (lstm: a dense vector), at its level.
        calibration = lstm["calibration"]
        assert (calibration["format"], calibration["reference"]) == ("dense", "dense")
        assert calibration["usable"] == (calibration["probe"] / calibration["best"] >= CALIBRATION_GOAL)
        assert calibration["usable"] == (lstm["readout"] in calibration["calibrated"])
    assert len(doc["calibrations"]) == 2
    for key, stored in doc["calibrations"].items():
        assert key.startswith("coordinate_binding[") and key.endswith("@n_writes=4,noise=0.05|dense")
        assert stored["best"] == 1.0 and set(stored["readouts"]) == {"gated", "rows_linear"}
    stored = list(doc["calibrations"].values())
    for lstm in by_label["lstm"]:  # its best member's read, and the chosen one's, of its level's reference
        c = lstm["calibration"]
        assert any(c["readouts"] == s["readouts"] and c["probe"] == max(s["readouts"].values()) for s in stored)
        assert c["chosen_probe"] == c["readouts"][lstm["readout"]]
    out = capsys.readouterr().out
    assert "no state to probe" in out and "calibration" in out and "dense" in out

    def never(*args, **kwargs):
        raise AssertionError("a probed cell was probed again")

    monkeypatch.setattr("tmem_bench.diagnostics.state_probe.probe_model", never)
    config = ReadoutConfig(steps=20, readouts=("gated", "rows_linear"))
    assert probe_run(tiny_run, config=config, say=lambda line: None)["rows"] == doc["rows"]
    with pytest.raises(UsageError, match="other readout settings"):
        probe_run(tiny_run, config=ReadoutConfig(steps=21, readouts=("gated", "rows_linear")))


def test_a_probe_killed_and_resumed_gives_the_numbers_of_one_uninterrupted(tiny_run, tmp_path, monkeypatch):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    for copy in (whole, killed):
        shutil.copytree(tiny_run, copy)
        (copy / "state_probe.json").unlink(missing_ok=True)
    config = TINY
    once = probe_run(whole, labels=["lstm"], config=config, say=lambda line: None)

    real, calls = probe_run_module.probe_cell, []

    def dies_on_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(probe_run_module, "probe_cell", dies_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        probe_run(killed, labels=["lstm"], config=config, say=lambda line: None)
    assert len(json.loads((killed / "state_probe.json").read_text())["rows"]) == 1
    monkeypatch.setattr(probe_run_module, "probe_cell", real)
    resumed = probe_run(killed, labels=["lstm"], config=config, say=lambda line: None)

    def numbers(doc):
        return [{k: v for k, v in r.items() if k != "wall_time_s"} for r in doc["rows"]], doc["calibrations"]

    assert len(once["rows"]) == 2 and numbers(resumed) == numbers(once)


def test_a_probe_file_of_the_earlier_schema_is_refused_not_mixed(tiny_run, tmp_path):
    run = tmp_path / "old"
    shutil.copytree(tiny_run, run)
    (run / "state_probe.json").write_text(json.dumps({"schema": 1, "rows": [], "readout_config": {}}))
    with pytest.raises(UsageError, match="schema 1"):
        probe_run(run, config=TINY)


def test_a_probe_reads_only_the_tasks_asked_and_never_a_cell_left_out(tiny_run, tmp_path):
    run = tmp_path / "some"
    shutil.copytree(tiny_run, run)
    (run / "state_probe.json").unlink(missing_ok=True)
    lstm = sorted(json.loads(p.read_text())["cell_id"] for p in (run / "cells").glob("*.json")
                  if json.loads(p.read_text())["cell"]["label"] == "lstm")
    doc = probe_run(run, labels=["lstm"], config=TINY, say=lambda line: None, tasks=["coordinate_binding"],
                    leave_out={lstm[0]})
    assert [r["cell_id"] for r in doc["rows"]] == [lstm[1]]
    with pytest.raises(UsageError, match="--tasks: no cells of occlusion .* its tasks: coordinate_binding"):
        probe_run(run, config=TINY, tasks=["occlusion"])
    assert probe_run(run, labels=["lstm"], config=TINY, say=lambda line: None, levels=["n_writes=4,noise=0.05"],
                     leave_out={lstm[0]})["rows"] == doc["rows"]
    with pytest.raises(UsageError, match="--train-level: no cells trained at n_writes=5,noise=0.05 .* its levels: "
                                         "n_writes=4,noise=0.05"):
        probe_run(run, config=TINY, levels=["n_writes=5,noise=0.05"])


def test_the_command_skips_the_learning_rate_trials_no_report_reads(tmp_path):
    from tests.report.helpers import RunBuilder, as_planned, write_selection
    from tmem_bench.cli.probe import _check_run

    b = RunBuilder(tmp_path)
    made = [as_planned(tmp_path, b.cell("occlusion", "lstm", 0, (6,), {(6,): acc}), acc, lr)
            for lr, acc in ((1e-3, 0.9), (1e-2, 0.3))]
    write_selection(tmp_path, [cell for cell, _ in made], (), [result for _, result in made])
    assert _check_run(str(tmp_path), None) == {made[1][0].id}  # the trial at the lr not chosen


@pytest.mark.parametrize("args, needle", [
    (["--steps", "0"], "--steps must be an integer >= 1"),
    (["--tasks", "occlusion"], "--tasks: no cells of occlusion"),
    (["--models", "nope"], "--models: no cells of nope"),
    (["--seed-list", "0,x"], "--seed-list '0,x' is malformed"),
    (["--weights", "/nonexistent"], "is not a folder"),
    (["--readouts", "gated,nope"], "readouts nope unknown"),
    (["--calibrate"], "give no RUN_DIR with it"),
])
def test_bad_probe_arguments_are_one_line(tiny_run, capsys, args, needle):
    assert main(["probe", str(tiny_run), *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_asked_where_there_is_none_is_one_line(tiny_run, capsys):
    assert main(["probe", str(tiny_run), "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda: no CUDA device is available here; allowed: auto, cpu" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_run_probed_on_cuda_names_the_gpu_in_each_row(tiny_run, tmp_path):
    run = tmp_path / "cuda"
    shutil.copytree(tiny_run, run)
    (run / "state_probe.json").unlink(missing_ok=True)
    doc = probe_run(run, labels=["lstm"], config=TINY, say=lambda line: None, device=torch.device("cuda"))
    gpu = torch.cuda.get_device_name()
    assert [r["hardware"] for r in doc["rows"]] == [gpu, gpu]
    assert all(r["status"] == PROBED and 0.0 <= r["probe_accuracy"] <= 1.0 for r in doc["rows"])
    assert [c["hardware"] for c in doc["calibrations"].values()] == [gpu, gpu]


@pytest.mark.parametrize("args, needle", [
    ([], "give a RUN_DIR to probe, or --calibrate"),
    (["--calibrate", "--references", "slots,nope"], "--references: unknown nope"),
    (["--calibrate", "--level", "n_writes"], "--level 'n_writes' is malformed"),
    (["--calibrate", "--level", "n_writes=0,noise=0.05"], "n_writes must be an integer >= 1"),
])
def test_bad_calibrate_arguments_are_one_line(capsys, args, needle):
    assert main(["probe", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_calibrate_prints_each_reference_beside_its_best_possible_read(capsys):
    assert main(["probe", "--calibrate", "--references", "slots,constant", "--readouts", "gated,attention",
                 "--steps", "5", "--level", "n_writes=3,noise=0.05"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("coordinate_binding @ n_writes=3,noise=0.05, 5 steps")
    assert out[1].split() == ["reference", "best", "kind", "gated", "attention", "best", "member", "of", "best", "time"]
    slots, constant = out[2].split(), out[3].split()
    assert slots[:3] == ["slots", "1.000", "oracle"] and constant[:3] == ["constant", "0.031", "chance"]
    assert "goal" in out[2] and "goal" not in out[3]  # the goal is the information-complete references'
    assert slots[-2:] in (["goal", "met"], ["below", "goal"]) and constant[-1].endswith("s")


def _row(validation: dict, evaluation: dict) -> dict:
    return {"status": PROBED, "readout": max(validation, key=validation.get), "probe_accuracy": None,
            "readouts": {n: {"validation": validation[n], "evaluation": evaluation[n], "best_step": 100}
                         for n in validation}}


def test_the_number_comes_from_a_calibrated_member_and_the_best_other_read_stands_beside_it():
    # attention is best on the probe's own validation but reads the key-value reference at 12% of
    # its best; rows_linear reads it at 93%: the number is rows_linear's, attention's beside it.
    row = _row({"gated": 0.2, "attention": 0.85, "rows_linear": 0.83}, {"gated": 0.2, "attention": 0.84,
                                                                      "rows_linear": 0.82})
    reference = {"format": "kv", "reference": "kv_mixed", "best": 1.0,
                 "readouts": {"gated": 0.2, "attention": 0.12, "rows_linear": 0.93}}
    settled = probe_run_module.settle(row, reference)
    assert (settled["readout"], settled["probe_accuracy"], settled["probe_validation_accuracy"]) == (
        "rows_linear", 0.82, 0.83)
    c = settled["calibration"]
    assert c["usable"] and c["calibrated"] == ["rows_linear"] and c["chosen_probe"] == 0.93
    assert c["member"] == "rows_linear" and c["ratio"] == pytest.approx(0.93)
    assert settled["uncalibrated"] == {"readout": "attention", "probe_accuracy": 0.84, "ratio": pytest.approx(0.12)}
    # Among several calibrated members the one best on validation, not the one best on the reference.
    two = {**reference, "readouts": {"gated": 0.2, "attention": 0.91, "rows_linear": 0.99}}
    settled = probe_run_module.settle(row, two)
    assert settled["readout"] == "attention" and settled["calibration"]["member"] == "rows_linear"
    assert settled["uncalibrated"]["readout"] == "gated"
    # Every member calibrated: nothing beside the number.
    every = {**reference, "readouts": {"gated": 0.95, "attention": 0.95, "rows_linear": 0.95}}
    assert "uncalibrated" not in probe_run_module.settle(row, every)
    # A task without reference states keeps the family's best and says why.
    none = {"format": "kv", "reference": None, "usable": False, "why": "no reference states for task 'x'"}
    settled = probe_run_module.settle(row, none)
    assert settled["calibration"] == none and settled["readout"] == "attention" and "uncalibrated" not in settled


def test_a_family_with_no_calibrated_member_cannot_tell():
    row = _row({"gated": 0.2, "attention": 0.85, "rows_linear": 0.83}, {"gated": 0.2, "attention": 0.84,
                                                                      "rows_linear": 0.82})
    # rows_linear at 89.9% of the best: just below the goal.
    below = {"format": "kv", "reference": "kv_mixed", "best": 1.0,
             "readouts": {"gated": 0.2, "attention": 0.12, "rows_linear": CALIBRATION_GOAL - 0.001}}
    settled = probe_run_module.settle(row, below)
    c = settled["calibration"]
    assert not c["usable"] and c["calibrated"] == [] and c["member"] == "rows_linear"
    assert settled["readout"] == "attention" and settled["probe_accuracy"] == 0.84  # what the probe found
    assert "uncalibrated" not in settled  # the number itself is the uncalibrated read
    assert usable_probe_accuracy(settled) is None


def test_a_stored_row_is_settled_again_by_the_current_rule_on_resume(tmp_path):
    # A row as the earlier rule stored it: attention's number, usable because rows_linear read the
    # reference. Read back, it carries rows_linear's number and attention's beside it, and nothing
    # is trained (the numbers are the stored ones).
    row = {**_row({"attention": 0.85, "rows_linear": 0.83}, {"attention": 0.84, "rows_linear": 0.82}),
           "probe_accuracy": 0.84, "cell_id": "c1", "label": "linear", "seed": 0,
           "calibration": {"format": "kv", "reference": "kv_mixed", "best": 1.0, "member": "rows_linear",
                           "probe": 0.93, "ratio": 0.93, "usable": True, "chosen_probe": 0.12,
                           "readouts": {"attention": 0.12, "rows_linear": 0.93}}}
    path = tmp_path / "state_probe.json"
    path.write_text(json.dumps(probe_run_module.document([row], TINY)))
    assert usable_probe_accuracy(row) is None  # a report never reads the earlier rule's uncalibrated number
    done, _ = probe_run_module._previous(path, TINY)
    settled = done["c1"]
    assert (settled["readout"], settled["probe_accuracy"]) == ("rows_linear", 0.82)
    assert settled["uncalibrated"]["probe_accuracy"] == 0.84 and usable_probe_accuracy(settled) == 0.82


def test_the_familys_read_is_its_best_member_the_first_of_a_tie():
    # The one rule a probed cell's calibration and `probe --calibrate`'s "best member" column read.
    reads = {"gated": 0.45, "attention": 0.9, "rows_linear": 0.9}
    assert probe_run_module.family_read(reads, ["gated", "attention", "rows_linear"], 0.9) == ("attention", 1.0)
    assert probe_run_module.family_read(reads, ["rows_linear", "attention"], 0.9)[0] == "rows_linear"
    assert probe_run_module.family_read(reads, ["gated"], 0.9) == ("gated", 0.5)


def test_calibrations_are_taken_from_another_runs_file_not_trained_again(tiny_run, tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    for copy in (first, second):
        shutil.copytree(tiny_run, copy)
        (copy / "state_probe.json").unlink(missing_ok=True)
    once = probe_run(first, labels=["lstm"], config=TINY, say=lambda line: None)

    def never(*args, **kwargs):
        raise AssertionError("a calibration was trained again")

    monkeypatch.setattr("tmem_bench.diagnostics.probe_references.calibrate_reference", never)
    taken = probe_run(second, labels=["lstm"], config=TINY, say=lambda line: None,
                      calibrations_from=[first / "state_probe.json"])
    strip = [{k: v for k, v in r.items() if k != "wall_time_s"} for r in once["rows"]]
    assert [{k: v for k, v in r.items() if k != "wall_time_s"} for r in taken["rows"]] == strip
    assert taken["calibrations"] == once["calibrations"]
    with pytest.raises(UsageError, match="--calibrations .* is not a file"):
        probe_run(second, config=TINY, calibrations_from=[tmp_path / "nope.json"])
    third = tmp_path / "third"
    shutil.copytree(second, third)
    (third / "state_probe.json").unlink()
    with pytest.raises(UsageError, match="first/state_probe.json holds a probe with other readout settings "
                                         r"\(.*steps.*\); give a file of this probe's settings, or leave --calibrations"):
        probe_run(third, config=ReadoutConfig(steps=21), calibrations_from=[first / "state_probe.json"])
