"""Diagnostic power, from synthetic cell results with known values (nothing is trained here)."""
import dataclasses
import json
import tomllib
from pathlib import Path

import pytest

from tests.report.helpers import CHANCE, GATES, RunBuilder, as_planned, build, power_of, trained, write_selection
from tmem_bench.report import INCONCLUSIVE, load_power, load_run
from tmem_bench.report import power as power_module
from tmem_bench.report import power_rows, power_summary, write_report
from tmem_bench.report.stats import BUDGET

CLAIMS_TOML = Path(power_module.__file__).with_name("claims.toml")


# Occlusion: chance 25%, ceiling 100%, so halfway is 62.5%.
CASES = {
    # Nothing learned in 150 steps says nothing about whether the variant discriminates.
    "nothing learned": ({"base": 0.25, "tensor": 0.29}, {"tensor": 0.25}, BUDGET,
                        "tensor at occlusion_len=6 learned nothing in 150 steps (convergence of 2 seeds not "
                        "recorded); nothing learned: best 29.0% (tensor), chance 25.0%"),
    "attention alone": ({"base": 0.90, "tensor": 0.95}, {"tensor": 0.80}, "does not discriminate",
                        "attention alone does it: base 90.0% of ceiling 100.0%; "
                        "tensor with its memory off keeps 80.0%"),
    "attention alone, memory needed": ({"base": 0.90, "tensor": 0.95}, {"tensor": 0.30}, "does not discriminate",
                                       "attention alone does it: base 90.0% of ceiling 100.0%"),
    "attention not blind": ({"base": 0.30, "tensor": 0.90}, {"tensor": 0.25}, "does not discriminate",
                            "attention is not blind: base 30.0% is more than 2 points above chance 25.0%"),
    "too weak": ({"base": 0.25, "tensor": 0.50}, {"tensor": 0.25}, "does not discriminate",
                 "too weak: best 50.0% (tensor) is less than halfway from chance 25.0% to ceiling 100.0%"),
    "no reliance": ({"base": 0.26, "tensor": 0.90}, {"tensor": 0.60}, "does not discriminate",
                    "tensor does not rely on its memory: 60.0% with it off"),
    "discriminates, gated": ({"base": 0.26, "slots": 0.40, "tensor": 0.90}, {"tensor": 0.27}, "discriminates",
                             "base at chance (26.0%), tensor 90.0% of ceiling 100.0%; with its memory off 27.0%"),
    "discriminates, ungated": ({"base": 0.25, "slots": 0.40, "lstm": 0.85}, {}, "discriminates",
                               "base at chance (25.0%), lstm 85.0% of ceiling 100.0%; not gated, no memory-off check"),
    "no reference": ({"tensor": 0.90}, {"tensor": 0.25}, INCONCLUSIVE,
                     "no attention reference (base) in this run at this variant and level"),
    "reference alone": ({"base": 0.25}, {}, INCONCLUSIVE, "no model besides the attention reference (base)"),
}


@pytest.mark.parametrize("case", CASES)
def test_each_verdict_from_the_numbers(tmp_path, case):
    accuracies, memory_off, verdict, reason = CASES[case]
    row = power_of(tmp_path, accuracies, memory_off)
    assert (row["verdict"], row["reason"]) == (verdict, reason)
    assert row["level"] == "occlusion_len=6" and row["seeds"] == 2
    assert row["chance"] == pytest.approx(CHANCE["occlusion"]) and row["ceiling"] == 1.0
    others = {m: a for m, a in accuracies.items() if m != "base"}
    assert row["reference"] == (pytest.approx(accuracies["base"]) if "base" in accuracies else None)
    assert row["best_model"] == (max(others, key=others.get) if others else None)
    best_off = memory_off.get(row["best_model"])
    assert row["memory_off"] == (None if best_off is None else pytest.approx(best_off))


def test_means_are_over_seeds(tmp_path):
    b = RunBuilder(tmp_path)
    for seed, (base, tensor) in enumerate([(0.24, 0.80), (0.28, 0.90)]):
        b.cell("occlusion", "base", seed, (6,), {(6,): base})
        b.cell("occlusion", "tensor", seed, (6,), {(6,): tensor}, memory_off={(6,): 0.25}, gates=GATES)
    [row] = power_rows(load_run(tmp_path))
    assert row["reference"] == pytest.approx(0.26) and row["best"] == pytest.approx(0.85)
    assert row["verdict"] == "discriminates"  # 26% is within 2 points of chance, though seed 1 alone is not


def test_a_task_without_level_axes_is_a_control(tmp_path):
    row = power_of(tmp_path, {"base": 1.0, "tensor": 1.0}, {"tensor": 0.97}, task="no_harm", level=())
    assert row["level"] == "-" and row["verdict"] == "control (not a discriminator)"
    assert row["best"] == 1.0 and row["memory_off"] == pytest.approx(0.97)
    assert power_summary([row]) == {"no_harm": []}


def test_only_in_distribution_rows_count(tmp_path):
    b = RunBuilder(tmp_path)
    for seed in range(2):
        b.cell("occlusion", "base", seed, (0,), {(0,): 0.25, (6,): 0.25})
        # Trained at 0 and also evaluated at 6: the 6 row is out of distribution and must not appear.
        b.cell("occlusion", "tensor", seed, (0,), {(0,): 0.90, (6,): 0.30}, memory_off={(0,): 0.25, (6,): 0.25},
               gates=GATES)
        # Trained at 6, evaluated at 0 too: its level-0 row must not dilute the trained-at-0 one.
        b.cell("occlusion", "lstm", seed, (6,), {(0,): 0.99, (6,): 0.40})
    rows = power_rows(load_run(tmp_path))
    assert [r["level"] for r in rows] == ["occlusion_len=0", "occlusion_len=6"]
    at0, at6 = rows
    assert at0["best_model"] == "tensor" and at0["best"] == pytest.approx(0.90)  # not lstm's 99% out of distribution
    assert at0["verdict"] == "discriminates"
    assert at6["reference"] is None and at6["best_model"] == "lstm" and at6["verdict"] == INCONCLUSIVE


def test_thresholds_come_from_claims_toml(tmp_path, monkeypatch):
    table = tomllib.loads(CLAIMS_TOML.read_text())
    assert dataclasses.asdict(load_power()) == table["power"]
    assert load_power().attention_reference == "base" and load_power().chance_margin == 0.02

    build(tmp_path, {"base": 0.30, "tensor": 0.90}, {"tensor": 0.25})
    data = load_run(tmp_path)
    assert power_rows(data)[0]["verdict"] == "does not discriminate"
    looser = dataclasses.replace(load_power(), chance_margin=0.10)
    monkeypatch.setattr(power_module, "load_power", lambda: looser)
    [row] = power_rows(data)
    assert row["verdict"] == "discriminates" and row["reason"].startswith("base at chance (30.0%)")
    assert "within 10 points of chance" in power_module.power_rule(looser)
    stricter = dataclasses.replace(looser, halfway=0.9)
    [row] = power_rows(data, stricter)
    assert row["reason"] == ("too weak: best 90.0% (tensor) is less than 90% of the way from chance 25.0% "
                             "to ceiling 100.0%")


def test_the_report_has_the_section_and_the_per_task_lines(tmp_path):
    level, off = (20, 0.0), {"tensor": 1 / 32}
    build(tmp_path, {"base": 0.90, "tensor": 0.92}, off, task="coordinate_binding", level=level)
    build(tmp_path, {"base": 1 / 32, "tensor": 0.85}, off, task="coordinate_binding", level=level,
          variant="block_queries=True")
    build(tmp_path, {"base": 1.0, "tensor": 1.0}, {"tensor": 0.97}, task="no_harm", level=())
    report = write_report(tmp_path)
    assert power_summary(report.power) == {"coordinate_binding": ["block_queries=True"], "no_harm": []}
    text = report.path.read_text()
    section = text.split("## Diagnostic power")[1].split("\n## ")[0]
    assert text.index("## Diagnostic power") < text.index("## The paper's claims") < text.index("## Summary")
    assert "within 2 points of chance" in section and "more than 5 points above chance" in section
    assert "- coordinate_binding: discriminates in block_queries=True; not in standard" in section
    assert "- no_harm: control (not a discriminator)" in section
    assert ("| task | variant | level | seeds | base (attention) | best model besides base | its accuracy | its lead over the "
            "next (points) | its memory off | its reach (init, trained) | still learning | chance | ceiling | verdict "
            "| why |") in section
    assert ("| coordinate_binding | block_queries=True | n_writes=20,noise=0.0 | 2 | 3.1% | tensor | 85.0% | - | 3.1% "
            "| - | no | 3.1% | 100.0% | **discriminates** |") in section


def test_a_run_where_no_variant_discriminates_says_so(tmp_path):
    build(tmp_path, {"base": 0.90, "tensor": 0.92}, {"tensor": 0.9})
    text = write_report(tmp_path).path.read_text()
    assert "- occlusion: no variant of this run discriminates" in text


def test_a_leaking_model_is_never_the_one_credited(tmp_path):
    b = RunBuilder(tmp_path)
    for seed in range(2):
        b.cell("occlusion", "base", seed, (6,), {(6,): 0.25})
        b.cell("occlusion", "tensor", seed, (6,), {(6,): 0.95}, memory_off={(6,): 0.25}, gates=GATES, probe="leaking")
        b.cell("occlusion", "lstm", seed, (6,), {(6,): 0.40})
    [row] = power_rows(load_run(tmp_path))
    assert row["best_model"] == "lstm" and row["verdict"] == "does not discriminate" and "too weak" in row["reason"]


def _annotate(run_dir, cell_id, **fields):
    path = Path(run_dir) / "cells" / f"{cell_id}.json"
    result = json.loads(path.read_text())
    result.update(fields)
    path.write_text(json.dumps(result))


def _reach(ratio):
    init, trained = ratio if isinstance(ratio, tuple) else (ratio, ratio)
    return {"init": {"ratio": init}, "trained": {"ratio": trained}}


@pytest.mark.parametrize("ratio, says", [
    (0.0, "tensor: no path from the evidence to the answer"),
    (2e-5, "tensor: a path whose gradient vanishes (reach 2.0e-05 at init, 2.0e-05 trained)"),
    (0.05, "tensor: a path that carries gradient (reach 0.05 at init, 0.05 trained) but was not learned"),
    ((0.05, 3e-8), "tensor: a path whose gradient vanished in training (reach 0.05 at init, 3.0e-08 trained)"),
])
def test_nothing_learned_says_which_reach_case_each_model_is_in(tmp_path, ratio, says):
    b = build(tmp_path, {"base": 0.25, "tensor": 0.26}, {"tensor": 0.25})
    for cid in b.ids:
        _annotate(tmp_path, cid, reach=_reach(0.0 if "base" in cid else ratio))
    [row] = power_rows(load_run(tmp_path))
    # With no path, at chance is tensor's capability, not a budget's; with one, more steps might tell.
    assert row["verdict"] == ("does not discriminate" if ratio == 0.0 else BUDGET)
    assert "nothing learned: best 26.0% (tensor)" in row["reason"] and says in row["reason"]
    assert "base:" not in row["reason"]  # the reference is blind by construction, not diagnosed


def test_a_model_still_learning_at_the_end_is_not_called_incapable(tmp_path):
    """Too weak, or discriminating, while still learning: the budget's, not the variant's."""
    b = build(tmp_path, {"base": 0.25, "tensor": 0.26}, {"tensor": 0.25})
    for cid in b.ids:
        _annotate(tmp_path, cid, **trained("base" in cid or cid.endswith("-0-6")))
    [row] = power_rows(load_run(tmp_path))
    assert row["verdict"] == BUDGET
    assert row["reason"].startswith("tensor at occlusion_len=6 learned nothing in 150 steps (1 of 2 seeds converged)")
    weak = tmp_path / "weak"
    b = build(weak, {"base": 0.25, "tensor": 0.50}, {"tensor": 0.25})
    for cid in b.ids:
        _annotate(weak, cid, **trained("base" in cid))
    [row] = power_rows(load_run(weak))
    assert row["verdict"] == BUDGET
    assert row["reason"] == ("tensor at occlusion_len=6 had not converged in 150 steps (0 of 2 seeds converged); "
                             + CASES["too weak"][3])
    assert row["best_still_learning"] == "2 of 2 seeds"


@pytest.mark.parametrize("base, says", [(0.95, "attention alone does it"), (0.40, "attention is not blind")])
def test_a_reference_still_learning_above_chance_is_a_lower_bound(tmp_path, base, says):
    """base already above chance can only rise further from blind: the verdict it decides stands while
    it is still learning, and while the best model is (that model decides nothing here)."""
    b = build(tmp_path, {"base": base, "tensor": 0.95}, {"tensor": 0.25})
    for cid in b.ids:
        _annotate(tmp_path, cid, **trained(False))
    [row] = power_rows(load_run(tmp_path))
    assert row["verdict"] == "does not discriminate" and row["reason"].startswith(says), row["reason"]


def test_converged_models_keep_the_plain_verdicts(tmp_path):
    b = build(tmp_path, {"base": 0.25, "tensor": 0.50}, {"tensor": 0.25})
    for cid in b.ids:
        _annotate(tmp_path, cid, **trained(True))
    [row] = power_rows(load_run(tmp_path))
    assert row["reason"] == CASES["too weak"][3]


def test_every_model_gets_its_own_case_lr_and_convergence(tmp_path):
    """The per-model table: each model's case by the power thresholds, its lr with the selection's
    edge flag, and convergence counted only over seeds whose history could tell."""
    b = build(tmp_path, {"base": 0.25, "lstm": 0.26, "slots": 0.50, "tensor": 0.90}, {"tensor": 0.25})
    for cid in b.ids:
        model = next(m for m in ("base", "lstm", "slots", "tensor") if m in cid)
        _annotate(tmp_path, cid, reach=_reach({"base": 0.0, "lstm": (0.05, 3e-8)}.get(model, 0.1)),
                  **trained({"slots": False, "base": None}.get(model, True)))
    # tensor's lr was chosen from a grid whose other lr was worse (seed 1 trained at it): at an edge.
    worse = as_planned(tmp_path, "occlusion-standard-tensor-0-6", 0.2, lr=1e-2, keep=True)
    made = [as_planned(tmp_path, f"occlusion-standard-tensor-{seed}-6", 0.9) for seed in (0, 1)]
    write_selection(tmp_path, [made[0][0], worse[0]], (1,), [worse[1], *(result for _, result in made)])
    rows = {r["label"]: r for r in power_module.model_rows(load_run(tmp_path))}
    assert rows["base"]["case"] == "nothing learned: no path from the evidence to the answer"
    assert rows["base"]["convergence_known"] == 0
    assert rows["lstm"]["case"].startswith("nothing learned: a path whose gradient vanished in training")
    assert rows["slots"]["case"] == "too weak; still learning at the end (2 of 2 seeds not converged)"
    assert rows["tensor"]["case"] == "learned" and rows["tensor"]["converged"] == 2
    assert rows["tensor"]["memory_off"] == pytest.approx(0.25) and rows["tensor"]["accuracy"] == pytest.approx(0.9)
    assert rows["tensor"]["lr_note"] == " (edge)" and rows["slots"]["lr_note"] == ""
    text = write_report(tmp_path).path.read_text()
    assert "### Every model at the level it was trained at" in text
    assert "| occlusion | standard | occlusion_len=6 | base |" in text
    assert "| - | 25.0% | 100.0% | nothing learned" in text


def test_the_best_models_lead_over_the_next_with_its_interval(tmp_path):
    """Means over two seeds: tensor 90 and 94, slots 40 and 40: a lead of 52 points over slots."""
    b = RunBuilder(tmp_path)
    for seed, (tensor, slots) in enumerate(((0.90, 0.40), (0.94, 0.40))):
        for model, acc in {"base": 0.25, "slots": slots, "tensor": tensor}.items():
            b.cell("occlusion", model, seed, (6,), {(6,): acc})
    [row] = power_rows(load_run(tmp_path))
    lead = row["lead"]
    assert lead["over"] == "slots" and lead["diff"] == pytest.approx(0.52)
    half = 12.706204736 * 0.02  # Welch: t with slots' constant seeds adding no variance, 1 degree of freedom
    assert lead["low"] == pytest.approx(0.52 - half) and lead["high"] == pytest.approx(0.52 + half)
    assert "+52.0 [+26.6, +77.4] over slots" in write_report(tmp_path).path.read_text()
    alone = tmp_path / "alone"
    build(alone, {"base": 0.25, "tensor": 0.9})
    [row] = power_rows(load_run(alone))
    assert row["lead"] is None
