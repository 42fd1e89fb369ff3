"""The convergence rule and the early-stopping rule, one rule: a plateau converges and stops, a falling
loss does not (one falling 10% a check near its end included, in early stopping and in the report
alike), and thresholds.toml is checked key by key in one line."""
import json
import math
import tomllib

import pytest

from tests.helpers import ROOT
from tests.report.helpers import RunBuilder, as_planned, trained, write_selection
from tmem_bench.diagnostics.convergence import convergence, load_early_stop, should_stop, stopped_too_early
from tmem_bench.harness.results import read_cell, rows
from tmem_bench.report import load_run, write_report
from tmem_bench.report.budget import point
from tmem_bench.thresholds import checked


RULE = load_early_stop()


def checks(losses, accuracy=0.9, every=100):
    return [{"step": i * every, "loss": loss, "accuracy": accuracy} for i, loss in enumerate(losses)]


def first_stop(history, chance=1 / 32):
    """The step at which the rule stops a run whose checks are `history`, or None."""
    return next((h["step"] for i, h in enumerate(history) if should_stop(history[:i + 1], chance, RULE)), None)


def test_the_rule_stops_a_plateaued_loss_and_not_a_falling_one():
    plateau = checks([3.4, 2.0, 1.0, 0.6, 0.5] + [0.5 + 0.001 * (i % 2) for i in range(15)])
    stop = first_stop(plateau)
    assert stop is not None and 500 <= stop <= 1000, stop
    falling = checks([3.4 * math.exp(-i / 10) for i in range(21)])
    assert first_stop(falling) is None
    # Flat at chance is where a plateau may still end: trained to the cap, never stopped.
    at_chance = checks([3.47] * 21, accuracy=1 / 32)
    assert first_stop(at_chance) is None


def test_a_loss_falling_ten_percent_a_check_is_not_flat_and_a_flat_one_stops_after_its_patience():
    """Issue 43's case: 0.457 -> 0.412 is a fall of 0.045 nats, which the old rule (2% of the whole fall
    from ln 32) called flat. Patience on an absolute improvement does not, however long it goes on."""
    falling = checks([3.47, 1.2, 0.6] + [0.457 * 0.9 ** i for i in range(12)])
    assert first_stop(falling) is None
    flat = checks([3.47, 1.2, 0.6, 0.45, 0.40] + [0.40 + 0.002 * (i % 2) for i in range(8)])
    # The best loss before a window of `patience` checks is 0.40 at check 4; no check after it improves.
    assert first_stop(flat) == (4 + RULE.patience) * 100


TABLE = tomllib.loads((ROOT / "tmem_bench" / "thresholds.toml").read_text())


@pytest.mark.parametrize("table, field, value, says", [
    ("early_stop", "patience", 0, "[early_stop] patience must be a positive integer, got 0"),
    ("early_stop", "every", "100", "[early_stop] every must be a positive integer, got '100'"),
    ("early_stop", "every", 1.5, "[early_stop] every must be a positive integer, got 1.5"),
    ("early_stop", "min_improvement", float("nan"), "[early_stop] min_improvement must be a finite number of at least 0"),
    ("early_stop", "min_improvement", -0.01, "[early_stop] min_improvement must be a finite number of at least 0"),
    ("early_stop", "learned_margin", "x", "[early_stop] learned_margin must be a finite number in [0, 1), got 'x'"),
    ("early_stop", "learned_margin", 1.5, "learned_margin must be a finite number in [0, 1), got 1.5"),
    ("early_stop", "learned_margin", True, "learned_margin must be a finite number in [0, 1), got True"),
    ("early_stop", "max_late_fraction", -1, "[early_stop] has no key 'max_late_fraction'; it must set exactly every, "
                                            "learned_margin, patience, min_improvement"),
    ("selection", "second_seed_margin", -0.1, "[selection] second_seed_margin must be a finite number in [0, 1), got -0.1"),
])
def test_each_bad_threshold_is_refused_in_one_line_naming_it(table, field, value, says):
    bad = {**TABLE, table: {**TABLE[table], field: value}}
    with pytest.raises(ValueError) as e:
        checked(bad)
    assert "\n" not in str(e.value) and str(e.value).startswith("thresholds.toml ") and says in str(e.value)


def test_an_unknown_table_or_a_missing_key_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"thresholds.toml has no table \[convergence\]; its tables: early_stop, selection"):
        checked({**TABLE, "convergence": {"last_fraction": 0.2}})
    with pytest.raises(ValueError, match=r"thresholds.toml \[selection\] lacks a key; it must set exactly second_seed_margin"):
        checked({**TABLE, "selection": {}})
    assert checked(TABLE) == TABLE


def test_a_ten_percent_fall_a_check_at_the_cap_is_still_learning_in_early_stopping_and_the_report(tmp_path):
    """One rule, read twice: early stopping never stops a loss falling 10% a check, and the report
    reads the same cell, trained to its cap, as still learning; a plateau stops and is converged."""
    b = RunBuilder(tmp_path)
    falling_id = b.cell("coordinate_binding", "base", 0, (50, 0.05), {(50, 0.05): 0.85})
    plateau_id = b.cell("coordinate_binding", "tensor", 0, (50, 0.05), {(50, 0.05): 0.85})
    b.manifest()
    for cid, converged in ((falling_id, False), (plateau_id, True)):
        path = tmp_path / "cells" / f"{cid}.json"
        result = {**read_cell(path), **trained(converged)}
        path.write_text(json.dumps(result))
        checks_ = result["validation_checks"]
        assert any(should_stop(checks_[:i + 1], 1 / 32, RULE) for i in range(len(checks_))) is converged
        assert rows(result)[0]["converged"] is converged
    falling = [c["loss"] for c in trained(False)["validation_checks"]]
    assert all(abs(b_ / a - 0.9) < 1e-9 for a, b_ in zip(falling, falling[1:]))  # 10% a check, to the cap
    table = load_run(tmp_path).table
    assert point(table[table["label"] == "base"]).lower_bound  # still learning: a lower bound
    assert not point(table[table["label"] == "tensor"]).limited


def test_a_plateau_converges_and_a_falling_curve_does_not():
    """On the train loss where a cell made no validation checks: read at every `every` steps."""
    steps = range(50, 1001, 50)
    plateau = [{"step": s, "loss": max(0.5, 3.0 - s / 100)} for s in steps]
    falling = [{"step": s, "loss": 3.0 - 2.0 * s / 1000} for s in steps]
    flat = [{"step": s, "loss": 1.386} for s in steps]  # never learned: nothing is still falling either
    assert convergence(plateau, None)["converged"] is True
    assert convergence(falling, None)["converged"] is False
    assert convergence(flat, None) == {"converged": True, "on": "train_loss", "rule": vars(RULE)}
    assert convergence(falling[:6], None)["converged"] is None  # steps 100, 200, 300: too few to tell


def test_a_cell_stopped_where_the_current_rule_would_train_on_is_named_in_the_report(tmp_path):
    """A cell early stopping stopped ("converged") while its loss was still falling 10% a check was
    stopped by another rule: the report names it, with its step; one stopped on a plateau, or run to
    its cap, is not named."""
    b = RunBuilder(tmp_path)
    ids = {label: b.cell("coordinate_binding", label, 0, (50, 0.05), {(50, 0.05): 0.85})
           for label in ("base", "tensor", "slots")}
    b.manifest()
    for label, converged, stopped in (("base", False, "converged"), ("tensor", True, "converged"),
                                      ("slots", False, "cap")):
        path = tmp_path / "cells" / f"{ids[label]}.json"
        result = {**read_cell(path), **trained(converged), "stopped": stopped}
        path.write_text(json.dumps(result))
        assert stopped_too_early(result) is (label == "base")
    text = write_report(tmp_path).path.read_text()
    section = text.split("## Stopped by a retired rule\n")[1].split("\n## ")[0]
    named = [line for line in section.splitlines() if line.startswith("- ")]
    assert len(named) == 1 and named[0].startswith("- coordinate_binding base seed 0") and "of " in named[0]
    assert "1 cell read in this report" in section and "learning-rate trials" not in section


def test_a_trial_at_an_lr_not_chosen_that_a_retired_rule_stopped_is_named_apart(tmp_path):
    """The selection read it, the report's tables do not: it is named as a learning-rate trial."""
    b = RunBuilder(tmp_path)
    made = [as_planned(tmp_path, b.cell("occlusion", "tensor", 0, (6,), {(6,): acc}), acc, lr)
            for lr, acc in ((1e-3, 0.9), (1e-2, 0.3))]
    write_selection(tmp_path, [cell for cell, _ in made], (), [result for _, result in made])
    path = tmp_path / "cells" / f"{made[1][0].id}.json"
    path.write_text(json.dumps({**read_cell(path), **trained(False), "stopped": "converged"}))
    section = write_report(tmp_path).path.read_text().split("## Stopped by a retired rule\n")[1].split("\n## ")[0]
    assert "1 learning-rate trial at an lr not chosen" in section and "read in this report" not in section
    assert "- occlusion tensor seed 0 lr 0.01 at" in section
