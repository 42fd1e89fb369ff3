"""The paper's stated figures as claims of their own, on synthetic cells (nothing is trained here):
attention's 7-14% at W=50 read by direction. A converged reference far above the range does not
reproduce it, one inside does; one still learning already above the ceiling does not either (more
steps only move it further away), and one still learning below the ceiling cannot tell."""
import json

import pytest

from tests.report.helpers import RunBuilder, trained
from tmem_bench.report import check_claim, load_run
from tmem_bench.report.claims import claim_spec
from tmem_bench.report.figure_rule import read_figure

LEVEL = (50, 0.05)


def attention_run(run_dir, accuracies, converged, variant="standard"):
    """base, base_wide and slots at W=50, each trained there with these per-seed accuracies."""
    b = RunBuilder(run_dir)
    for model in ("base", "base_wide", "slots"):
        for seed, acc in enumerate(accuracies):
            cid = b.cell("coordinate_binding", model, seed, LEVEL, {LEVEL: acc}, variant=variant)
            path = run_dir / "cells" / f"{cid}.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), **trained(converged)}))
    b.manifest()
    return check_claim(load_run(run_dir), "attention_figure")


@pytest.mark.parametrize("accuracies, converged, verdict", [
    ([0.84, 0.85, 0.86], True, "not reproduced"),  # converged, far above 7-14%
    ([0.10, 0.11, 0.09], True, "reproduced"),  # converged, inside it
    ([0.84, 0.85, 0.86], False, "not reproduced (lower bound)"),  # still learning, already above the ceiling
    ([0.10, 0.11, 0.09], False, "inconclusive (budget)"),  # still learning below the ceiling: it may cross it
    ([0.12, 0.16, 0.14], True, "inconclusive"),  # converged, its interval straddles the ceiling
])
def test_the_attention_figure_is_read_by_the_direction_a_point_can_move(tmp_path, accuracies, converged, verdict):
    claim = attention_run(tmp_path, accuracies, converged)
    assert claim.verdict == verdict, claim.reason
    assert claim.reason.startswith("base ") and "at noise=0.05, n_writes=50 (trained and read there)" in claim.reason
    assert "against the paper's 7-14%" in claim.reason
    if converged is False and verdict == "inconclusive (budget)":
        assert "base at n_writes=50,noise=0.05 had not converged" in claim.reason


def test_a_figure_under_memory_forcing_is_given_beside_the_papers_setting(tmp_path):
    attention_run(tmp_path, [0.84, 0.85, 0.86], True)
    b = RunBuilder(tmp_path)
    for seed in range(3):
        b.cell("coordinate_binding", "base", seed, LEVEL, {LEVEL: 1 / 32}, variant="block_queries=True")
    claim = check_claim(load_run(tmp_path), "attention_figure")
    assert claim.verdict == "not reproduced"
    assert claim.notes == ["under the variant block_queries=True (not in the paper) the same rule gives: "
                           "inconclusive (budget)"]  # at chance with no reach measured: the budget's


def test_a_floor_already_passed_by_a_point_still_learning_is_reproduced():
    """A figure that is only a floor (no ceiling): rising can only keep a point past it."""
    from dataclasses import replace

    from tmem_bench.report.budget import Point

    floor = replace(claim_spec("memory_figure"), high=None)
    learning = Point(label="tensor", where="at n_writes=50", steps=(1200,), seeds=3, converged=0, not_converged=3,
                     nothing_learned=False)
    assert read_figure(learning, 0.80, 0.90, floor) == ("supported", True)
    assert read_figure(learning, 0.70, 0.90, floor) == ("inconclusive (budget)", False)
    ranged = claim_spec("memory_figure")  # 75-91%: a ceiling too, which a rising point may still cross
    assert read_figure(learning, 0.80, 0.90, ranged) == ("inconclusive (budget)", False)
    assert read_figure(learning, 0.92, 0.95, ranged) == ("not supported", True)


def test_a_run_without_the_level_a_figure_names_leaves_the_figure_out(tmp_path):
    """Coordinate binding read only up to W=40: the figure at W=50 does not apply, so the report omits it."""
    from tmem_bench.report.markdown import _missing

    b = RunBuilder(tmp_path)
    for seed in range(2):
        for model in ("base", "tensor"):
            b.cell("coordinate_binding", model, seed, (40, 0.05), {(40, 0.05): 0.8})
    b.manifest()
    assert _missing(claim_spec("attention_figure"), load_run(tmp_path)) == ["one of base, base_wide, slots read at "
                                                                            "n_writes=50"]
    attention_run(tmp_path / "at50", [0.8] * 3, True)
    assert _missing(claim_spec("attention_figure"), load_run(tmp_path / "at50")) == []
