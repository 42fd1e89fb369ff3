"""`tmem-bench probe` on a run it cannot probe as asked (issue 46, item 7): one line and exit 2, never a
traceback, and never exit 0 having probed nothing."""
from __future__ import annotations

import pytest

from tests.helpers import cli, one_line_error
from tmem_bench.cli import main


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("probe-errors") / "run"
    assert main(["run", "coordinate_binding", "--models", "lstm", "--steps", "3", "--batch-size", "8",
                 "--level", "n_writes=4", "--seeds", "1", "--out", str(out), "--no-report"]) == 0
    return out


def test_a_seed_the_run_lacks_is_refused(run, capsys):
    code, _, err = cli(["probe", run, "--seed-list", "99", "--steps", "2"], capsys)
    one_line_error(code, err, "--seed-list: no cells of seed 99", "its seeds: 0")
    assert not (run / "state_probe.json").exists()


def test_a_state_probe_json_that_is_a_folder_is_refused(run, capsys):
    (run / "state_probe.json").mkdir()
    try:
        code, _, err = cli(["probe", run, "--steps", "2"], capsys)
    finally:
        (run / "state_probe.json").rmdir()
    one_line_error(code, err, "state_probe.json is not a file")


def test_truncated_weights_are_one_line(run, capsys):
    weights = next((run / "cells").glob("*.safetensors"))
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    try:
        code, _, err = cli(["probe", run, "--steps", "2"], capsys)
    finally:
        weights.write_bytes(data)
        (run / "state_probe.json").unlink(missing_ok=True)
    # The cells probed before it keep their progress lines; the error is one line, the last.
    assert code == 2 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("tmem-bench: error: ") and f"weights file cells/{weights.name} is unreadable" in last
    assert "cannot be probed" in last
