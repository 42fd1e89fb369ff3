"""Validation trusts nothing an entry claims: every way of tampering is caught, a leaking plug-in is
refused and a forged verdict found, and of two entries of one run the one submitted first stays.
Hostile entries (names that are code, links out of the board, huge files): test_names.py."""
from __future__ import annotations

import importlib
import json
import shutil

import pytest

from tests.helpers import empty_board
from tests.leaderboard.helpers import cells, entry_path, load, tiny_run
from tmem_bench.cli import main
from tmem_bench.files import write_json
from tmem_bench.harness.results import read_cell
from tmem_bench.leaderboard import validate
from tmem_bench.leaderboard.entry import derived
from tmem_bench.registry import module_names


def tamper_accuracy(board):
    entry = load(board)
    entry["results"][0]["mean"] += 0.1
    write_json(entry_path(board) / "entry.json", entry)


def tamper_remove_cell(board):
    cells(board)[0].unlink()


def tamper_fingerprint(board):
    path = cells(board)[0]
    result = read_cell(path)
    result["eval"][0]["fingerprint"] = "0" * 64
    write_json(path, result)


def tamper_drop_seed(board):
    # A careful forger: seed 2's cells removed and every aggregate recomputed to match.
    entry = load(board)
    kept = []
    for path in cells(board):
        result = read_cell(path)
        if result["cell"]["seed"] == 2:
            path.unlink()
        else:
            kept.append(result)
    entry.update(derived(kept), cells=sorted(r["cell_id"] for r in kept))
    write_json(entry_path(board) / "entry.json", entry)


def tamper_leaking(board):
    for path in cells(board):
        result = read_cell(path)
        result["causality"]["verdict"] = "leaking"
        write_json(path, result)


def tamper_rename_cell(board):
    path = cells(board)[0]
    path.rename(path.with_name("0123456789abcdef.json"))


def tamper_cell_settings(board):
    path = cells(board)[0]
    result = read_cell(path)
    result["cell"]["train"]["steps"] = 2000
    write_json(path, result)


def tamper_duplicate(board):
    shutil.copytree(entry_path(board), entry_path(board, "tiny-base-again"))


def tamper_accuracy_range(board):
    path = cells(board)[0]
    result = read_cell(path)
    result["eval"][0]["accuracy"] = 1.5
    write_json(path, result)


def tamper_suite_version(board):
    entry = load(board)
    entry["suite"]["tmem_bench_version"] = "9.0.0"
    write_json(entry_path(board) / "entry.json", entry)


def tamper_task_version(board):
    entry = load(board)
    entry["settings"][0]["task_version"] = 7
    write_json(entry_path(board) / "entry.json", entry)


def tamper_ranked(board):
    entry = load(board)
    entry["profile"]["id"] = "quick"
    write_json(entry_path(board) / "entry.json", entry)


def tamper_schema(board):
    entry = load(board)
    del entry["seeds"]
    write_json(entry_path(board) / "entry.json", entry)


TAMPERING = {
    "an accuracy edited": (tamper_accuracy, "results[0].mean: claims"),
    "a cell removed": (tamper_remove_cell, "is listed but its cell file is missing"),
    "a fingerprint changed": (tamper_fingerprint, "fingerprint: 000000000000... is not the installed suite's"),
    "a seed dropped": (tamper_drop_seed, "cells: missing coordinate_binding base @ n_writes=2,noise=0.05 seed 2"),
    "a leaking model": (tamper_leaking, "causality: the probe found the model 'leaking'"),
    "a renamed cell file": (tamper_rename_cell, "tiny-base: cells/0123456789abcdef.json: "),
    "cell settings edited": (tamper_cell_settings, "the file name is not the hash of the cell's settings"),
    "a duplicate": (tamper_duplicate, "tiny-base-again: cells: duplicate of tiny-base"),
    "an accuracy out of range": (tamper_accuracy_range, "accuracy", "1.5"),
    "an unknown suite version": (tamper_suite_version, "suite.tmem_bench_version: 9.0.0 is not a version"),
    "an unknown task version": (tamper_task_version, "task_version: 7 is not the installed task's version 1"),
    "a profile passed off as quick": (tamper_ranked, "profile.id: claims 'quick'"),
    "a field missing": (tamper_schema, "entry.json: schema: 'seeds' is a required property"),
}


@pytest.mark.parametrize("case", TAMPERING)
def test_validation_rejects_tampering(board, case, capsys):
    tamper, *expected = TAMPERING[case]
    tamper(board)
    result = validate(board)
    assert any(all(e in line for e in expected) for line in result.rejections), result.rejections
    rejected = {line.split(": ")[0] for line in result.rejections}
    assert rejected == {"tiny-base-again" if case == "a duplicate" else "tiny-base"}
    assert all("\n" not in line for line in result.rejections)
    assert "tiny-lstm" in [p.name for p, _ in result.accepted] and not rejected & {p.name for p, _ in result.accepted}
    assert main(["leaderboard", "validate", str(board)]) == 1
    assert expected[0] in capsys.readouterr().err
    assert main(["leaderboard", "build", "--leaderboard", str(board)]) == 1
    assert not (board / "index.html").exists()


def test_a_leaking_plugin_is_refused_and_a_forged_verdict_is_caught(tmp_path, capsys):
    run_dir = tiny_run(tmp_path, "no_harm", "--models", "tests.diagnostics.test_conformance:leaky")
    board = empty_board(tmp_path)
    submit = ["leaderboard", "submit", str(run_dir), "--name", "Leaky", "--leaderboard", str(board)]
    assert main(submit) == 2  # a module:attribute model is refused unless its submitter trusts it
    assert "module:attribute names are not imported here" in capsys.readouterr().err
    submit.append("--allow-module-names")
    assert main(submit) == 2
    assert "only causal models can be submitted" in capsys.readouterr().err
    for path in (run_dir / "cells").glob("*.json"):  # the forger edits the run's verdicts before submitting
        result = read_cell(path)
        for probe in (result["causality"], *result["causality_trained"].values()):
            probe["verdict"] = "causal"
        write_json(path, result)
    assert main(submit) == 0
    assert "module:attribute" in validate(board).rejections[0]  # a plug-in's entry validates where it is trusted
    result = validate(board, allow_module_names=True)
    # Re-evaluation comes first (it bounds each model's size by its weights file) and finds the leak
    # on every cell's trained weights, in both modes.
    assert sum("on the trained weights" in line and "'leaking'" in line
               for line in result.rejections) == 2 * len(load(board, "leaky")["cells"])
    # Where the trained weights pass, the model is still probed afresh, as training built it.
    found = []
    with module_names(True):
        importlib.import_module("tmem_bench.leaderboard.validate")._probe_again(
            [read_cell(p) for p in sorted((board / "entries" / "leaky" / "cells").glob("*.json"))],
            lambda where, reason: found.append(f"{where}: {reason}"))
    assert found == ["model (no_harm standard): the causality probe, run again here, finds the model 'leaking'; "
                     "only causal models are admitted"]


def test_of_two_entries_of_one_run_the_earlier_submitted_stays_and_a_parenthesis_keeps_its_link(submittable,
                                                                                                tmp_path, capsys):
    from tmem_bench.cli import main
    from tmem_bench.leaderboard import validate

    board = tmp_path / "board"
    shutil.copytree(submittable / "published", board)
    later = board / "entries" / "a-later"  # sorts before "first", which was submitted earlier
    shutil.copytree(board / "entries" / "first", later)
    entry = json.loads((later / "entry.json").read_text())
    entry.update(name="A later", submitted="2999-01-01T00:00:00+00:00",
                 url="https://en.wikipedia.org/wiki/Memory_(computing)")
    (later / "entry.json").write_text(json.dumps(entry))
    result = validate(board)
    assert [path.name for path, _ in result.accepted] == ["first"]
    assert len(result.rejections) == 1 and result.rejections[0].startswith("a-later: cells: duplicate of first")

    shutil.rmtree(board / "entries" / "first")
    assert main(["leaderboard", "build", "--leaderboard", str(board)]) == 0
    assert "[A later](https://en.wikipedia.org/wiki/Memory_%28computing%29)" in (board / "README.md").read_text()
