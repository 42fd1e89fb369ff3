"""The convergence rule and the early-stopping rule: a plateau converges and stops, a falling loss does
not (one falling 10% a check near its end included), and claims.toml's [early_stop] is checked."""
import math
import tomllib

import pytest

from tests.helpers import ROOT
from tmem_bench.diagnostics import convergence as convergence_module
from tmem_bench.diagnostics.convergence import ConvergenceRule, convergence, load_early_stop, should_stop


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


@pytest.mark.parametrize("field, value, says", [
    ("patience", 0, "patience must be a positive integer"),
    ("every", "100", "every must be a positive integer"),
    ("min_improvement", float("nan"), "min_improvement must be a finite number"),
    ("min_improvement", -0.01, "min_improvement must be a finite number"),
    ("learned_margin", "0.05", "learned_margin must be a finite number"),
    ("learned_margin", 1.5, "learned_margin must be a finite number"),
    ("max_late_fraction", 0.02, "must set exactly every, learned_margin, patience, min_improvement"),
])
def test_bad_early_stopping_thresholds_are_refused_in_one_line(monkeypatch, field, value, says):
    table = tomllib.loads((ROOT / "tmem_bench" / "report" / "claims.toml").read_text())
    bad = {**table, "early_stop": {**table["early_stop"], field: value}}
    monkeypatch.setattr(convergence_module, "_thresholds", lambda: bad)
    with pytest.raises(ValueError, match=says):
        load_early_stop()


def test_a_plateau_converges_and_a_falling_curve_does_not():
    rule = ConvergenceRule(last_fraction=0.2, max_late_fraction=0.1, min_late_drop=0.02)
    steps = range(50, 1001, 50)
    plateau = [{"step": s, "loss": max(0.5, 3.0 - s / 100)} for s in steps]
    falling = [{"step": s, "loss": 3.0 - 2.0 * s / 1000} for s in steps]
    flat = [{"step": s, "loss": 1.386} for s in steps]  # never learned: nothing is still falling either
    assert convergence(plateau, 1000, rule)["converged"] is True
    assert convergence(falling, 1000, rule)["converged"] is False
    assert convergence(flat, 1000, rule)["converged"] is True
    assert convergence(falling[:2], 1000, rule)["converged"] is None
