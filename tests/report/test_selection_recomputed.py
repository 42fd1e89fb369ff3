"""The learning-rate choices a report shows are made again from the run's cells: a selection.json the
report cannot check is refused, one that disagrees with the cells is warned about, and only the trial
at the lr chosen is shown, beside the selection table."""
from __future__ import annotations

import json

import pytest

from tests.helpers import chosen_cells, cli, one_line_error, rerun, selection
from tests.report.helpers import RunBuilder, as_planned, write_selection
from tmem_bench.files import write_json
from tmem_bench.harness.plan import cell_from_dict
from tmem_bench.report import load_run, write_report


def _other_trial(search: dict) -> dict:
    return next(t for t in search["trials"] if t["lr"] != search["chosen_lr"])


DAMAGE = {
    # Each gave a traceback.
    "search-not-an-object": lambda d: d.update(searches=[1]),
    "trial-without-cell-id": lambda d: d["searches"][0]["trials"][0].pop("cell_id"),
    "chosen-lr-a-string": lambda d: d["searches"][0].update(chosen_lr="fast"),
    "grid-with-a-string": lambda d: d["searches"][0]["grid"].append("x"),
    "search-without-label": lambda d: d["searches"][0].pop("label"),
    # Each gave a report showing a trial that was not chosen, with exit 0 and no warning.
    "chosen-lr-edited": lambda d: d["searches"][0].update(chosen_lr=_other_trial(d["searches"][0])["lr"]),
    "unknown-trial-id": lambda d: _other_trial(d["searches"][0]).update(cell_id="0" * 16),
    "searches-a-string": lambda d: d.update(searches="all"),
    "file-deleted": None,
}


REFUSED = {"search-not-an-object": "selection.json is malformed: searches.0",
           "trial-without-cell-id": "selection.json is malformed: searches.0.trials.0",
           "chosen-lr-a-string": "selection.json is malformed: searches.0.chosen_lr",
           "grid-with-a-string": "selection.json is malformed: searches.0.grid.2",
           "search-without-label": "selection.json is malformed: searches.0",
           "unknown-trial-id": "0000000000000000",
           "searches-a-string": "selection.json is malformed: searches",
           "file-deleted": "selection.json is missing"}


@pytest.mark.parametrize("damage", DAMAGE)
def test_the_report_never_shows_a_trial_the_cells_did_not_choose(run, capsys, damage):
    chosen, written = chosen_cells(run), selection(run)
    if DAMAGE[damage] is None:
        (run / "selection.json").unlink()
    else:
        broken = selection(run)
        DAMAGE[damage](broken)
        (run / "selection.json").write_text(json.dumps(broken))
    code, _, err = cli(["report", run], capsys)
    if damage in REFUSED:
        one_line_error(code, err, REFUSED[damage], "rerun the run's command")
        assert not (run / "report.md").exists()
        # The rerun writes selection.json again from the cells, and trains nothing.
        assert rerun(run, capsys)[0] == 0
        assert selection(run) == written
        code, _, err = cli(["report", run], capsys)
    assert code == 0 and "Traceback" not in err, err
    assert set(load_run(run).table["cell_id"]) == chosen
    [search] = load_run(run).selection
    assert {t["cell_id"] for t in search["trials"] if t["lr"] == search["chosen_lr"]} < chosen
    text = (run / "report.md").read_text()
    if damage == "chosen-lr-edited":
        assert "selection.json disagrees with the cells" in text and "warning" in err


def test_an_intact_selection_gives_a_report_without_selection_problems(run):
    report = write_report(run)
    assert set(report.data.table["cell_id"]) == chosen_cells(run)
    assert not [p for p in report.problems if "selection" in p], report.problems


def test_the_report_shows_only_the_chosen_lr_and_the_selection_table(tmp_path):
    b = RunBuilder(tmp_path)
    made = [as_planned(tmp_path, b.cell("occlusion", "tensor", 0, (6,), {(6,): acc}), acc, lr)
            for lr, acc in ((1e-3, 0.9), (1e-2, 0.3))]
    write_selection(tmp_path, [cell for cell, _ in made], (), [result for _, result in made])
    data = load_run(tmp_path)
    assert set(data.table["cell_id"]) == {made[0][0].id}
    text = write_report(tmp_path).path.read_text()
    assert "## Learning-rate selection" in text
    assert "| tensor | **90.0%** | 30.0% | 0.001 (edge) |" in text


def test_before_the_first_selection_its_trials_are_told_apart_by_the_plan_and_left_out(tmp_path):
    b = RunBuilder(tmp_path)
    trials = [as_planned(tmp_path, b.cell("occlusion", "tensor", 0, (6,), {(6,): acc}), acc, lr)[0]
              for lr, acc in ((1e-3, 0.9), (1e-2, 0.3))]
    # base's two cells share a description too, but differ in more than their lr: not a search
    base, _ = as_planned(tmp_path, b.cell("occlusion", "base", 0, (6,), {(6,): 0.5}), 0.5)
    longer = json.loads((tmp_path / "cells" / f"{base.id}.json").read_text())
    longer["cell"]["train"]["steps"] = 300
    longer["cell_id"] = cell_from_dict(longer["cell"]).id
    write_json(tmp_path / "cells" / f"{longer['cell_id']}.json", longer)
    planned = [(t.id, t.describe()) for t in trials] + [("f" * 16, trials[0].describe())]  # a third lr, unfinished
    planned += [(base.id, base.describe()), (longer["cell_id"], base.describe())]
    write_json(tmp_path / "manifest.json", {"command": ["tmem-bench", "run", "occlusion"], "settings": {},
                                            "cells": [{"id": i, "describe": d} for i, d in planned]})
    data = load_run(tmp_path)
    assert set(data.table["cell_id"]) == {base.id, longer["cell_id"]}
    assert (f"no learning rate chosen yet for the search of {trials[0].describe()} (selection.json is written once "
            "the run's trials are finished): its 2 finished trial(s) are left out") in data.problems
    assert not [p for p in data.problems if "occlusion base" in p and "learning rate" in p]
    # once the selection is written, the file says which cells are trials, as before
    write_selection(tmp_path, trials, (), [json.loads((tmp_path / "cells" / f"{t.id}.json").read_text())
                                           for t in trials])
    assert set(load_run(tmp_path).table["cell_id"]) == {trials[0].id, base.id, longer["cell_id"]}
