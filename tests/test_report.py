"""Reports built from synthetic cell results with known values (nothing is trained here)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tmem_bench import load_results
from tmem_bench.harness.results import write_json
from tmem_bench.report import (INCONCLUSIVE, REFUTED, RULES, SUPPORTED, Style, accuracy_figure, bootstrap_ci,
                               bootstrap_diff_ci, check_claim, check_claims, compare, curve_data, generalisation_view,
                               load_claims, load_run, no_harm_verdict, summary_frame, summary_table, training_view,
                               write_report)

CLI = [sys.executable, "-m", "tmem_bench.cli"]
AXES = {"coordinate_binding": ("n_writes", "noise"), "occlusion": ("occlusion_len",),
        "map_building": ("horizon",), "no_harm": ()}
CHANCE = {"coordinate_binding": 1 / 32, "occlusion": 0.25, "map_building": 0.5, "no_harm": 1 / 16}
GATE_INIT = {"layer0": 0.5, "layer1": 0.5}
MARGIN = 0.05  # claims.toml's margin


def options_of(variant: str) -> dict:
    """The task options a variant label stands for (the planner names a variant by its changed options)."""
    if variant == "standard":
        return {}
    return {k: json.loads(v.lower()) for k, v in (part.split("=") for part in variant.split(","))}


class RunBuilder:
    """Writes cell JSONs in the schema of tmem_bench.harness.train.run_cell, with chosen accuracies."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.ids = []

    def cell(self, task, model, seed, train_level, accuracies, variant="standard", memory_off=None, gates=None,
             probe="causal", steps_per_s=None, ceiling=1.0, task_options=None):
        """accuracies: {level tuple: accuracy}; memory_off likewise; gates: final {layer: value};
        task_options: those the variant label stands for unless given."""
        axes = AXES[task]
        cell_id = f"{task}-{variant}-{model}-{seed}-{'_'.join(map(str, train_level))}"
        cell_id = cell_id.replace("=", "").replace(".", "p")
        gated = gates is not None
        steps_per_s = steps_per_s or (2.0 if gated else 20.0)
        evals = []
        for level, acc in accuracies.items():
            level_d = dict(zip(axes, level))
            evals.append({
                "level": level_d, "level_key": ",".join(f"{k}={v}" for k, v in level_d.items()) or "-",
                "accuracy": acc, "accuracy_memory_off": (memory_off or {}).get(level) if gated else None,
                "loss": 1.0, "chance": CHANCE[task], "ceiling": ceiling, "n": 1000, "fingerprint": "f" * 64,
            })
        history = []
        for k, step in enumerate((50, 100, 150)):
            frac = (k + 1) / 3
            history.append({
                "step": step, "loss": 3.0 - frac, "train_acc": 0.2 * frac + 0.01 * seed, "steps_per_s": steps_per_s,
                "gates": {n: GATE_INIT[n] + frac * (gates[n] - GATE_INIT[n]) for n in GATE_INIT} if gated else None,
            })
        result = {
            "schema": 1, "cell_id": cell_id,
            "cell": {"task": task, "task_options": options_of(variant) if task_options is None else task_options,
                     "variant": variant, "train_level": dict(zip(axes, train_level)),
                     "eval_levels": [e["level"] for e in evals], "model": model, "label": model,
                     "model_options": {"d_model": 64, "n_layers": 2, "n_heads": 4}, "seed": seed,
                     "train": {"steps": 150, "batch_size": 64, "lr": 3e-4, "weight_decay": 0.01, "grad_clip": 1.0,
                               "log_every": 50, "eval_size": 256}},
            "tmem_bench_version": "0.1.0", "torch_version": "test", "device": "cpu",
            "n_params": 1000 + 10 * len(model), "n_backbone_params": 900, "wall_time_s": 15.0, "train_time_s": 14.0,
            "steps_per_s": steps_per_s, "causality": {"verdict": probe},
            "gate_init": dict(GATE_INIT) if gated else None, "gates_final": dict(gates) if gated else None,
            "history": history, "eval": evals,
        }
        write_json(self.run_dir / "cells" / f"{cell_id}.json", result)
        self.ids.append(cell_id)
        return cell_id

    def manifest(self, extra=(), described=True):
        """extra: planned cells that were never written, as (id, description); described=False writes
        the bare ids of manifests from before descriptions were stored."""
        planned = [(cid, f"described {cid}") for cid in self.ids] + list(extra)
        write_json(self.run_dir / "manifest.json", {
            "tmem_bench_version": "0.1.0", "torch_version": "test", "command": ["tmem-bench", "run", "all"],
            "device": "cpu", "started": "2026-01-01T00:00:00+00:00", "settings": {},
            "cells": [{"id": cid, "describe": d} for cid, d in planned] if described else [cid for cid, _ in planned],
        })


# Per-seed accuracies of the supporting coordinate-binding run: (W, model) -> three seeds.
CB_SUPPORT = {
    (5, "tensor"): [0.95, 0.93, 0.97], (20, "tensor"): [0.88, 0.86, 0.90], (50, "tensor"): [0.80, 0.78, 0.84],
    (5, "base"): [0.60, 0.58, 0.62], (20, "base"): [0.20, 0.25, 0.15], (50, "base"): [0.08, 0.10, 0.06],
    (5, "slots"): [0.65, 0.60, 0.70], (20, "slots"): [0.30, 0.28, 0.26], (50, "slots"): [0.12, 0.11, 0.13],
}
NOISES = (0.0, 0.05)


def coordinate_binding_per_level(b: RunBuilder, table: dict, variant="standard", offset=0.0, gate_final=0.7):
    """Each model trained at each W (and noise), evaluated where trained: the per-level training sweep."""
    for (w, model), accs in table.items():
        for noise in NOISES:
            for seed, acc in enumerate(accs):
                acc = acc - offset * (noise > 0)
                gated = model == "tensor"
                b.cell("coordinate_binding", model, seed, (w, noise), {(w, noise): acc}, variant=variant,
                       memory_off={(w, noise): CHANCE["coordinate_binding"]} if gated else None,
                       gates={"layer0": gate_final, "layer1": gate_final - 0.1} if gated else None)


def full_run(run_dir: Path) -> RunBuilder:
    b = RunBuilder(run_dir)
    coordinate_binding_per_level(b, CB_SUPPORT)
    # Memory-forcing variant: base at chance, tensor holds.
    forced = {k: ([CHANCE["coordinate_binding"]] * 3 if k[1] != "tensor" else v) for k, v in CB_SUPPORT.items()
              if k[0] != 20}
    coordinate_binding_per_level(b, forced, variant="block_queries=True", gate_final=0.9)
    for seed in range(3):
        # Generalisation view: trained at horizon 32, evaluated at every horizon.
        for model, accs in {"base": (0.80, 0.70, 0.60), "tensor": (0.85, 0.83, 0.82)}.items():
            gated = model == "tensor"
            b.cell("map_building", model, seed, (32,), dict(zip([(16,), (32,), (64,)], np.add(accs, 0.01 * seed))),
                   memory_off={(h,): 0.5 for h in (16, 32, 64)} if gated else None,
                   gates={"layer0": 0.6, "layer1": 0.6} if gated else None, ceiling=0.9)
        for model, accs in {"base": (0.95, 0.60), "tensor": (0.95, 0.85)}.items():
            gated = model == "tensor"
            b.cell("occlusion", model, seed, (0,), dict(zip([(0,), (6,)], np.add(accs, 0.01 * seed))),
                   memory_off={(0,): 0.9, (6,): 0.4} if gated else None,
                   gates={"layer0": 0.55, "layer1": 0.45} if gated else None)
        b.cell("no_harm", "base", seed, (), {(): 1.0})
        b.cell("no_harm", "tensor", seed, (), {(): 0.998}, memory_off={(): 0.97},
               gates={"layer0": 0.52, "layer1": 0.50})
    b.manifest()
    return b


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    full_run(run_dir)
    return write_report(run_dir)


def test_bootstrap_interval_on_known_samples():
    # Resampling [0, 1] gives means 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4: the 2.5% and
    # 97.5% percentiles are exactly 0 and 1.
    assert bootstrap_ci([0.0, 1.0]) == (0.5, 0.0, 1.0)
    # [0, 0, 1]: P(mean <= 2/3) = 26/27 > 0.975 is false (0.963), so the upper end is 1.
    mean, low, high = bootstrap_ci([0.0, 0.0, 1.0])
    assert mean == pytest.approx(1 / 3) and low == 0.0 and high == 1.0
    assert bootstrap_ci([0.7]) == (0.7, 0.7, 0.7)  # one seed: the band collapses
    assert bootstrap_ci([0.4] * 5) == pytest.approx((0.4, 0.4, 0.4))
    sample = np.random.default_rng(1).normal(0.5, 0.1, 400)
    mean, low, high = bootstrap_ci(sample)
    half = 1.96 * sample.std(ddof=1) / np.sqrt(sample.size)  # normal theory for a large sample
    assert (high - low) / 2 == pytest.approx(half, rel=0.1)
    assert low < mean < high and bootstrap_ci(sample) == (mean, low, high)  # seeded: reproducible
    assert bootstrap_diff_ci([0.0, 1.0], [0.25]) == (0.25, -0.25, 0.75)
    assert bootstrap_diff_ci([0.9], [0.1]) == pytest.approx((0.8, 0.8, 0.8))


def test_compare_and_combine_rules():
    assert compare([0.80, 0.82, 0.81], [0.10, 0.12, 0.11], MARGIN)["verdict"] == SUPPORTED
    assert compare([0.50, 0.52, 0.51], [0.50, 0.49, 0.52], MARGIN)["verdict"] == REFUTED
    assert compare([0.2, 0.9, 0.5], [0.45, 0.5, 0.55], MARGIN)["verdict"] == INCONCLUSIVE  # straddles the margin
    assert compare([0.6], [0.5], MARGIN)["verdict"] == SUPPORTED
    assert compare([0.52], [0.5], MARGIN)["verdict"] == REFUTED


def test_accuracy_figure_plots_the_seed_means_and_intervals(report, tmp_path):
    # Each model trained at each W: the capacity figure draws these points (a per-level training view drew
    # them again).
    assert "accuracy_coordinate_binding_trained" not in report.figures
    drawn = report.figures["capacity_coordinate_binding"]
    # A panel per variant and noise; the legend names models, the title the variant.
    assert [p["title"] for p in drawn["panels"]] == [f"coordinate_binding{v} noise={n}"
                                                      for v in ("", " [block_queries=True]") for n in ("0", "0.05")]
    panel = drawn["panels"][0]
    for model in ("base", "slots", "tensor"):
        series = panel["series"][model]
        assert series["x"] == [5.0, 20.0, 50.0]
        for x, mean, low, high in zip(series["x"], series["mean"], series["low"], series["high"]):
            assert (mean, low, high) == bootstrap_ci(CB_SUPPORT[(int(x), model)])
    assert drawn["panels"][2]["series"]["base"]["mean"] == pytest.approx([1 / 32] * 2)
    assert panel["chance"] == pytest.approx([1 / 32] * 3) and panel["ceiling"] == [1.0] * 3

    # The same numbers are what the figure draws.
    data = load_run(report.path.parent)
    curves = curve_data(training_view(data, "coordinate_binding", {"noise": 0.0}), "n_writes")
    fig, _ = accuracy_figure([{"title": "t", "curves": curves}], "n_writes", "t", Style(data.table))
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert list(lines["tensor"].get_ydata()) == pytest.approx([np.mean(CB_SUPPORT[(w, "tensor")]) for w in (5, 20, 50)])
    assert list(lines["chance"].get_ydata()) == pytest.approx([1 / 32] * 3)
    assert list(lines["ceiling"].get_ydata()) == [1.0] * 3

    # Generalisation view: one trained model evaluated at every level, its training level marked.
    gen = report.figures["accuracy_map_building_from_horizon32"]
    assert gen["trained_x"] == 32
    series = gen["panels"][0]["series"]["base"]
    assert series["x"] == [16.0, 32.0, 64.0] and series["mean"] == pytest.approx([0.81, 0.71, 0.61])
    assert gen["panels"][0]["ceiling"]["y"] == [0.9] * 3
    for stem in report.figures:
        for ext in ("png", "svg"):
            assert (report.path.parent / "figures" / f"{stem}.{ext}").stat().st_size > 1000


def test_generalisation_view_of_a_per_level_sweep(tmp_path):
    # The paper profile: a model per (W, noise), each evaluated on the whole grid and beyond it.
    b = RunBuilder(tmp_path)
    grid = [(w, n) for w in (5, 20, 40) for n in NOISES]

    def acc(trained, evaluated):  # falls with W; a noise mismatch costs 0.1; the training W leaves a trace
        return 0.9 - 0.01 * evaluated[0] - 0.1 * (trained[1] != evaluated[1]) + 0.001 * trained[0]

    for trained in [(w, n) for w in (5, 20) for n in NOISES]:
        b.cell("coordinate_binding", "base", 0, trained, {e: acc(trained, e) for e in grid})
    data = load_run(tmp_path)
    rows_ = generalisation_view(data, "coordinate_binding", "n_writes", 5, {"noise": 0.05})
    assert set(rows_["train_level"]) == {"n_writes=5,noise=0.05"}  # the model trained at the panel's noise
    curves = curve_data(rows_, "n_writes")
    assert curves["series"]["base"]["x"] == [5.0, 20.0, 40.0]
    assert curves["series"]["base"]["mean"] == pytest.approx([acc((5, 0.05), (w, 0.05)) for w in (5, 20, 40)])
    trained = curve_data(training_view(data, "coordinate_binding", {"noise": 0.0}), "n_writes")
    assert trained["series"]["base"]["mean"] == pytest.approx([acc((w, 0.0), (w, 0.0)) for w in (5, 20)])


def test_gate_and_training_figures_and_tables(report):
    gates = report.figures["gates_no_harm"]["panels"][0]
    assert gates["title"] == "tensor" and gates["initial"] == {"layer0": 0.5, "layer1": 0.5}
    assert gates["lines"]["layer0 seed 0"]["step"] == [0, 50, 100, 150]
    assert gates["lines"]["layer0 seed 0"]["gate"][-1] == pytest.approx(0.52)
    training = report.figures["training_occlusion"]["panels"]
    assert [(p["title"], p["metric"]) for p in training] == [("trained at occlusion_len=0", m) for m in ("loss", "train_acc")]
    assert training[1]["lines"]["tensor seed 2"]["train_acc"] == pytest.approx([0.2 / 3 + 0.02, 0.4 / 3 + 0.02, 0.22])
    text = report.path.read_text()
    assert "| tensor | layer0 | 0.500 | 0.700 (18 cells) | 0.900 (12 cells) | 0.550 (3 cells) |" in text
    reliance = report.figures["memory_reliance"]["panels"]
    occl = next(p for p in reliance if p["title"] == "occlusion")
    assert occl["bars"]["tensor"] == pytest.approx([0.95 + 0.01 - 0.9, 0.85 + 0.01 - 0.4])


def test_summary_rows_have_ci_cost_and_probe(report):
    s = report.summary
    row = s[(s["task"] == "coordinate_binding") & (s["series"] == "tensor") & (s["level"] == "n_writes=50,noise=0.0")]
    assert len(row) == 1
    row = row.iloc[0]
    assert (row["accuracy"], row["low"], row["high"]) == bootstrap_ci(CB_SUPPORT[(50, "tensor")])
    assert row["memory off"] == pytest.approx(1 / 32) and row["seeds"] == 3
    assert row["steps/s"] == 2.0 and row["wall s"] == 15.0 and row["probe"] == "causal"
    # Summary lists where models were trained (the per-level training view), sorted by level.
    cb = s[(s["task"] == "coordinate_binding") & (s["series"] == "base")]
    assert list(cb["level"]) == [f"n_writes={w},noise={n}" for w in (5, 20, 50) for n in NOISES]


def test_training_loop_speed_comes_from_the_logged_windows():
    from tmem_bench.report.data import _loop_steps_per_s

    result = {"steps_per_s": 1.0, "history": [{"step": 50, "steps_per_s": 10.0}, {"step": 60, "steps_per_s": 5.0}]}
    assert _loop_steps_per_s(result) == pytest.approx(60 / (50 / 10 + 10 / 5))
    assert _loop_steps_per_s({"steps_per_s": 1.5, "history": []}) == 1.5


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


def test_claims_on_supporting_data(report):
    claims = {c.name.split(":")[0]: c for c in report.claims}
    cb = claims["coordinate binding"]
    speed, saturation = claims["caveat"], report.claims[-2]
    assert cb.verdict == SUPPORTED
    rows = [e for e in cb.evidence if e["variant"] == "standard"]
    assert [e["level"] for e in rows] == ["noise=0.0, n_writes=50", "noise=0.05, n_writes=50"]
    assert rows[0]["best baseline"].startswith("slots 12.0%") and rows[0]["tensor memory off"] == "3.1%"
    # Under memory forcing every baseline learned nothing: they cannot show that tensor beats them.
    assert any("block_queries=True" in n and n.endswith("inconclusive (budget)") for n in cb.notes)
    assert claims["map building"].verdict == SUPPORTED  # 0.83 vs 0.61 at horizon 64
    assert claims["occlusion"].verdict == SUPPORTED  # tensor drops 10 points, base 35
    assert claims["no-harm control"].verdict == SUPPORTED
    assert saturation.name.endswith("saturates") and saturation.verdict == SUPPORTED  # 95% -> 80% as W grows
    assert "throughput" in speed.name and speed.verdict == SUPPORTED and "median slowdown 10.0x" in speed.reason
    text = report.path.read_text()
    assert f"### {cb.name}: supported" in text and "tensor 75-91%, attention baselines 7-14%" in text


def test_claims_on_contradicting_data(tmp_path):
    b = RunBuilder(tmp_path)
    # Attention solves the lookup: base holds as writes grow and the tensor is no better.
    contra = {(5, "tensor"): [0.95, 0.94, 0.96], (50, "tensor"): [0.93, 0.92, 0.94],
              (5, "base"): [0.96, 0.97, 0.95], (50, "base"): [0.94, 0.95, 0.93]}
    coordinate_binding_per_level(b, contra)
    for seed in range(3):
        for model, accs in {"base": (0.95, 0.70), "tensor": (0.95, 0.68)}.items():
            b.cell("occlusion", model, seed, (0,), dict(zip([(0,), (6,)], np.add(accs, 0.01 * seed))))
        b.cell("map_building", "base", seed, (64,), {(64,): 0.80 + 0.01 * seed})
        b.cell("map_building", "tensor", seed, (64,), {(64,): [0.70, 0.84, 0.95][seed]})
        b.cell("no_harm", "base", seed, (), {(): 0.90})
    data = load_run(tmp_path)
    cb = check_claim(data, "coordinate_binding")
    assert cb.verdict == REFUTED and "noise=0.0, n_writes=50: not supported" in cb.reason
    assert check_claim(data, "saturation").verdict == REFUTED  # 95% -> 93%: within the margin
    assert check_claim(data, "occlusion").verdict == REFUTED
    assert check_claim(data, "map_building").verdict == INCONCLUSIVE  # tensor's seeds straddle the margin
    nh = check_claim(data, "no_harm")
    assert nh.verdict == INCONCLUSIVE and "no gated model" in nh.reason
    assert nh.evidence[0]["reaches"] == REFUTED


def test_models_at_chance_give_no_verdict(tmp_path):
    b = RunBuilder(tmp_path)
    near_chance = 1 / 32 + 0.01
    coordinate_binding_per_level(b, {(w, m): [near_chance] * 2 for w in (5, 50) for m in ("base", "tensor")})
    data = load_run(tmp_path)
    for claim in (check_claim(data, "coordinate_binding"), check_claim(data, "saturation")):
        assert claim.verdict == "inconclusive (budget)"
        assert claim.reason.startswith("noise=0.0") and "tensor at n_writes=" in claim.reason
        assert ",noise=0.0 learned nothing in 150 steps (convergence of 2 seeds not recorded)" in claim.reason


def test_missing_tasks_models_and_leaks_make_claims_inconclusive(tmp_path):
    b = RunBuilder(tmp_path)
    coordinate_binding_per_level(b, {k: v for k, v in CB_SUPPORT.items() if k[1] != "tensor"})
    b.cell("occlusion", "tensor", 0, (0,), {(0,): 0.9, (6,): 0.9}, probe="leaking")
    b.cell("occlusion", "base", 0, (0,), {(0,): 0.9, (6,): 0.3})
    data = load_run(tmp_path)
    claims = {c.name: c for c in check_claims(data)}
    cb = claims["coordinate binding: memory holds as writes grow"]
    assert cb.verdict == INCONCLUSIVE and cb.reason == "this run has no 'tensor' model on coordinate_binding"
    assert claims["map building: memory wins at long horizons"].reason == "this run has no map_building results"
    occ = claims["occlusion: belief about the hidden ball"]
    assert occ.verdict == INCONCLUSIVE and "leak in tensor (occlusion)" in occ.evidence[0]["verdict"]
    assert data.leaking == {"tensor": ["occlusion"]}


def test_a_leaking_backbone_is_marked_everywhere(tmp_path):
    b = RunBuilder(tmp_path)
    b.cell("occlusion", "lstm", 0, (0,), {(0,): 0.9, (6,): 0.9}, probe="leaking")
    b.cell("map_building", "lstm", 0, (16,), {(16,): 0.7})
    b.cell("map_building", "base", 0, (16,), {(16,): 0.7})
    s = summary_frame(load_run(tmp_path))
    assert set(s[s["label"] == "lstm"]["probe"]) == {"leaking"}
    assert set(s[s["label"] == "base"]["probe"]) == {"causal"}


def test_corrupt_and_missing_cells_are_named_and_the_rest_renders(tmp_path):
    b = RunBuilder(tmp_path)
    for seed in range(2):
        b.cell("map_building", "base", seed, (16,), {(16,): 0.7, (32,): 0.6})
    corrupt = b.cell("map_building", "base", 2, (16,), {(16,): 0.7, (32,): 0.6})
    (tmp_path / "cells" / f"{corrupt}.json").write_text('{"cell_id": "x", "cell": ')  # a half-written file
    incomplete = b.cell("map_building", "base", 3, (16,), {(16,): 0.7})
    result = json.loads((tmp_path / "cells" / f"{incomplete}.json").read_text())
    del result["eval"][0]["accuracy"]
    write_json(tmp_path / "cells" / f"{incomplete}.json", result)
    b.manifest(extra=[("0123456789abcdef", None)], described=False)
    report = write_report(tmp_path)
    assert len(report.problems) == 3
    text = report.path.read_text()
    assert "## Problems" in text
    assert f"{corrupt}.json is unreadable" in text and f"{incomplete}.json is incomplete" in text
    assert "cell 0123456789abcdef is planned in manifest.json but" in text and "is missing" in text
    assert "accuracy_map_building_from_horizon16" in report.figures
    assert report.figures["accuracy_map_building_from_horizon16"]["panels"][0]["series"]["base"]["n_seeds"] == [2, 2]
    assert len(load_results(tmp_path)) == 4  # the one-call table still loads the readable cells


def test_report_is_reproducible(tmp_path):
    b = RunBuilder(tmp_path)
    for seed in range(3):
        b.cell("map_building", "tensor", seed, (16,), {(16,): 0.7 + 0.05 * seed, (32,): 0.6}, memory_off={(16,): 0.5},
               gates={"layer0": 0.6, "layer1": 0.4})
    first = write_report(tmp_path)
    md, svg = first.path.read_text(), (tmp_path / "figures" / "gates_map_building.svg").read_bytes()
    stale = tmp_path / "figures" / "accuracy_map_building_from_horizon99.png"
    stale.write_bytes(b"from an earlier report")
    write_report(tmp_path)
    assert not stale.exists()
    assert first.path.read_text() == md and (tmp_path / "figures" / "gates_map_building.svg").read_bytes() == svg
    assert not list((tmp_path / "figures").glob(".*"))  # no temporary files left behind


def test_console_summary_from_runner_results(tmp_path):
    from rich.console import Console

    b = RunBuilder(tmp_path)
    for seed in range(2):
        b.cell("map_building", "tensor", seed, (16,), {(16,): 0.7 + 0.1 * seed}, memory_off={(16,): 0.5},
               gates={"layer0": 0.6, "layer1": 0.4})
    b.cell("map_building", "tensor", 0, (8,), {(8,): 0.9}, variant="block_queries=True", memory_off={(8,): 0.5},
           gates={"layer0": 0.6, "layer1": 0.4})
    results = [json.loads(p.read_text()) for p in sorted((tmp_path / "cells").glob("*.json"))]
    console = Console(width=200, record=True)
    console.print(summary_table(results))
    text = console.export_text()
    assert "map_building: accuracy" in text and "map_building [block_queries=True]: accuracy" in text
    assert "75.0% [70.0, 80.0]" in text and "50.0%" in text and "90.0%" in text


def test_report_command(tmp_path, capsys):
    from tmem_bench.cli import main

    b = RunBuilder(tmp_path / "run")
    b.cell("occlusion", "base", 0, (0,), {(0,): 0.9, (6,): 0.5})
    recorded = tmp_path / "run" / "cells" / f"{b.cell('occlusion', 'base', 1, (0,), {(0,): 0.9})}.json"
    write_json(recorded, {**json.loads(recorded.read_text()), "hardware": "Some CPU, AVX2"})
    b.manifest()
    proc = subprocess.run(CLI + ["report", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"report: {tmp_path / 'run' / 'report.md'}" in proc.stdout and "90.0%" in proc.stdout
    assert "- hardware: Some CPU, AVX2 (1 cell); not recorded (1 cell)" in (tmp_path / "run" / "report.md").read_text()
    assert (tmp_path / "run" / "report.md").is_file() and (tmp_path / "run" / "figures").is_dir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    bad_dirs = (("nope", "does not exist"), ("file", "is not a directory"), ("empty", "is not a run directory"))
    for bad, needle in bad_dirs:
        assert main(["report", str(tmp_path / bad)]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_run_writes_the_report_unless_told_not_to(tmp_path, capsys):
    from tmem_bench.cli import main
    from tmem_bench.harness.runner import command_as_typed

    args = ["run", "coordinate_binding", "--models", "base", "--steps", "2", "--batch-size", "4",
            "--level", "n_writes=2", "--out", str(tmp_path / "run")]
    assert main(args + ["--no-report"]) == 0
    assert not (tmp_path / "run" / "report.md").exists()
    assert main(args) == 0  # resumes the finished cell, then reports
    assert (tmp_path / "run" / "report.md").is_file() and "report: " in capsys.readouterr().out
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["command"] == command_as_typed() and "/" not in manifest["command"][0]
    assert manifest["cells"] and all(len(c["id"]) == 16 for c in manifest["cells"])
    assert all(c["describe"].startswith("coordinate_binding") and " base @ n_writes=2," in c["describe"]
               for c in manifest["cells"])


def test_a_resized_variant_still_counts_as_the_papers_setting(tmp_path):
    b = RunBuilder(tmp_path)
    for seed in range(3):
        for model, accs in {"base": (0.95, 0.60), "tensor": (0.95, 0.90)}.items():
            b.cell("occlusion", model, seed, (0,), dict(zip([(0,), (6,)], np.add(accs, 0.01 * seed))),
                   variant="n_frames=4")
            b.cell("occlusion", model, seed, (0,), dict(zip([(0,), (6,)], np.add(accs[:1] * 2, 0.01 * seed))),
                   variant="block_hidden=True,hide=end,n_frames=4",
                   task_options={"n_frames": 4, "hide": "end", "block_hidden": True})
    claim = check_claim(load_run(tmp_path), "occlusion")
    assert claim.verdict == SUPPORTED
    assert any("run as the variant n_frames=4" in n for n in claim.notes)
    assert any("block_hidden=True,hide=end,n_frames=4 (not in the paper)" in n for n in claim.notes)


def test_a_variant_is_memory_forcing_by_its_task_options_not_its_label(tmp_path):
    # Occlusion declares its memory-forcing variant as hide = "end" with block_hidden.
    b = RunBuilder(tmp_path)
    for seed in range(3):
        for model, accs in {"base": (0.95, 0.60), "tensor": (0.95, 0.90)}.items():
            b.cell("occlusion", model, seed, (0,), dict(zip([(0,), (6,)], np.add(accs, 0.01 * seed))),
                   variant="hard", task_options={"hide": "end", "block_hidden": True})
            b.cell("occlusion", model, seed, (0,), dict(zip([(0,), (6,)], np.add(accs[:1] * 2, 0.01 * seed))),
                   variant="block_hidden=True", task_options={"hide": "end"})
    claim = check_claim(load_run(tmp_path), "occlusion")
    assert claim.verdict == REFUTED  # from the variant whose options keep the paper's information flow
    assert any("the variant hard (not in the paper) the same rule gives: supported" in n for n in claim.notes)
    assert any("run as the variant block_hidden=True" in n for n in claim.notes)


def test_every_claim_is_data_decided_by_a_known_rule():
    specs = load_claims()
    assert [s.id for s in specs] == ["coordinate_binding", "capacity", "no_harm", "map_building", "occlusion",
                                     "saturation", "throughput"]
    for spec in specs:
        assert spec.rule in RULES and spec.name and spec.statement and spec.paper
        assert "{" not in spec.explained() and "None" not in spec.explained()  # every parameter is filled in
    assert {s.id: s.margin for s in specs}["coordinate_binding"] == MARGIN
    with pytest.raises(KeyError, match="no claim 'nope'"):
        check_claim(None, "nope")


def test_missing_cells_are_named_from_the_manifest_without_building_a_model(tmp_path):
    b = RunBuilder(tmp_path)
    b.cell("occlusion", "base", 0, (0,), {(0,): 0.9, (6,): 0.5})
    b.manifest(extra=[("fedcba9876543210", "occlusion tensor @ occlusion_len=0 seed 0")])
    code = (f"import sys; from tmem_bench.report import write_report; r = write_report({str(tmp_path)!r}); "
            f"print(r.problems); print(sorted(m for m in ('torch', 'tmem_bench.harness.plan') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    problems, imported = proc.stdout.strip().splitlines()
    assert imported == "[]"  # no plan or torch: no model is built to name a cell (the registry gives colours only)
    text = (tmp_path / "report.md").read_text()
    assert "cell fedcba9876543210 (occlusion tensor @ occlusion_len=0 seed 0) is planned in manifest.json" in text
    assert "- cells: 1 readable of 2 planned" in text and str(tmp_path) not in text
