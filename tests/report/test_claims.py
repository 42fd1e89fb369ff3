"""The paper's claims as data (claims.toml): each decided by a known rule, every parameter filled in."""
import pytest

from tests.report.helpers import MARGIN
from tmem_bench.report import RULES, check_claim, load_claims


def test_every_claim_is_data_decided_by_a_known_rule():
    specs = load_claims()
    assert [s.id for s in specs] == ["coordinate_binding", "attention_figure", "memory_figure", "capacity", "no_harm", "map_building", "occlusion",
                                     "saturation", "throughput"]
    for spec in specs:
        assert spec.rule in RULES and spec.name and spec.statement and spec.paper
        assert "{" not in spec.explained() and "None" not in spec.explained()  # every parameter is filled in
    assert {s.id: s.margin for s in specs}["coordinate_binding"] == MARGIN
    with pytest.raises(KeyError, match="no claim 'nope'"):
        check_claim(None, "nope")
