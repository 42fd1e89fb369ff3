"""The state probe over a run's cells (`tmem-bench probe`): state_probe.json written and resumed without
probing a cell again; bad arguments are one line."""
from __future__ import annotations

import json

import pytest

from tmem_bench.cli import main
from tmem_bench.diagnostics.state_probe import NO_STATE, PROBED, ReadoutConfig
from tmem_bench.errors import UsageError
from tmem_bench.harness.probe_run import probe_run


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("probe") / "run"
    assert main(["run", "coordinate_binding", "--models", "base,lstm", "--steps", "3", "--batch-size", "8",
                 "--level", "n_writes=4", "--seeds", "1", "--out", str(out), "--no-report"]) == 0
    return out


def test_a_run_is_probed_into_state_probe_json_and_resumed(tiny_run, capsys, monkeypatch):
    assert main(["probe", str(tiny_run), "--steps", "20"]) == 0
    doc = json.loads((tiny_run / "state_probe.json").read_text())
    assert doc["readout_config"]["steps"] == 20 and "20 steps" in doc["readout"]
    by_label = {}
    for row in doc["rows"]:
        by_label.setdefault(row["label"], []).append(row)
    assert {r["status"] for r in by_label["base"]} == {NO_STATE}
    assert all(r["probe_accuracy"] is None for r in by_label["base"])
    assert {r["status"] for r in by_label["lstm"]} == {PROBED}
    assert all(0.0 <= r["probe_accuracy"] <= 1.0 and r["n_writes"] == 4 for r in by_label["lstm"])
    assert "no state to probe" in capsys.readouterr().out

    def never(*args, **kwargs):
        raise AssertionError("a probed cell was probed again")

    monkeypatch.setattr("tmem_bench.diagnostics.state_probe.probe_model", never)
    assert probe_run(tiny_run, config=ReadoutConfig(steps=20), say=lambda line: None)["rows"] == doc["rows"]
    with pytest.raises(UsageError, match="other readout settings"):
        probe_run(tiny_run, config=ReadoutConfig(steps=21))


@pytest.mark.parametrize("args, needle", [
    (["--steps", "0"], "--steps must be an integer >= 1"),
    (["--models", "nope"], "--models: no cells of nope"),
    (["--seed-list", "0,x"], "--seed-list '0,x' is malformed"),
    (["--weights", "/nonexistent"], "is not a folder"),
])
def test_bad_probe_arguments_are_one_line(tiny_run, capsys, args, needle):
    assert main(["probe", str(tiny_run), *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
