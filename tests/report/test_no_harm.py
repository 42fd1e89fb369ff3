"""The one no-harm rule: every model reaches the ceiling and a learned gate stays near its initial value."""
import pytest

from tests.report.helpers import RunBuilder
from tmem_bench.report import INCONCLUSIVE, REFUTED, SUPPORTED, check_claim, load_run, no_harm_verdict


def test_no_harm_verdict_on_both_sides_of_both_thresholds():
    def verdict(accuracies, ceiling, gate=None, gate_init=0.5):
        return no_harm_verdict(accuracies, ceiling, gate, gate_init if gate is not None else None, 0.01, 0.05)

    assert verdict([0.995], 1.0, 0.52)["verdict"] == SUPPORTED
    assert verdict([0.985], 1.0, 0.52)["verdict"] == REFUTED  # 1.5 points below the ceiling
    assert verdict([0.985], 0.99, 0.52)["verdict"] == SUPPORTED  # a ceiling below 100% is the target
    assert verdict([0.99], 1.0, 0.5)["verdict"] == SUPPORTED  # exactly 1 point: inclusive
    assert verdict([0.995], 1.0, 0.54)["verdict"] == SUPPORTED
    assert verdict([0.995], 1.0, 0.56)["verdict"] == REFUTED  # gate moved 0.06 up
    assert verdict([0.995], 1.0, 0.44)["verdict"] == REFUTED  # gate moved 0.06 down
    assert verdict([0.995], 1.0)["verdict"] == SUPPORTED  # an ungated model: accuracy alone
    v = verdict([0.985], 1.0, 0.6)
    assert v["verdict"] == REFUTED and v["reaches"] == REFUTED and v["stays"] == REFUTED
    assert "below ceiling - 1 points" in v["reason"] and "+0.100 (outside 0.05)" in v["reason"]
    assert verdict([0.97, 1.0], 1.0, 0.5)["verdict"] == INCONCLUSIVE  # the seeds' interval straddles the target


def test_no_harm_verdict_in_the_report(report, tmp_path):
    [v] = report.no_harm
    assert v["verdict"] == SUPPORTED and v["accuracy"] == pytest.approx(0.998) and v["gate"] == pytest.approx(0.51)
    [nh] = [c for c in report.claims if c.id == "no_harm"]
    text = report.path.read_text()
    assert nh.rule in text.split("### No-harm verdict")[1]  # one rule, printed in both places
    b = RunBuilder(tmp_path)
    for seed in range(2):
        b.cell("no_harm", "base", seed, (), {(): 1.0})
        b.cell("no_harm", "tensor", seed, (), {(): 1.0}, memory_off={(): 0.9}, gates={"layer0": 0.7, "layer1": 0.6})
    data = load_run(tmp_path)
    claim = check_claim(data, "no_harm")
    assert claim.verdict == REFUTED and "gate initial -> final" in claim.evidence[1]
    assert claim.evidence[1]["gate initial -> final"] == "0.500 -> 0.650 (+0.150)"
