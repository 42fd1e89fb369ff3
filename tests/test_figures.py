"""Every figure of a report, drawn from a synthetic run that holds every registered model (nothing is
trained): nothing cut at the figure's edge, nothing overlapping, legends that name models, a colour
per model taken from the registry."""
from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import pytest
from matplotlib.colors import to_hex

from tmem_bench.registry import BACKBONES, BUILTIN_COLORS, BUILTIN_MODELS, EXTRA_COLORS, backbone_names, model_colors
from tmem_bench.report.data import load_run
from tmem_bench.report.figures import _REFERENCES, draw_figures
from tmem_bench.results import read_cell, write_json

# A long variant, as the planner names one by its changed options, is what used to overflow.
LONG = "block_queries=True,encoding=cells,n_queries=8"
ABLATION = "tensor_grid4"  # a label that names no registered model (a model run with its own options)
GATED = {"tensor", "tensor_local", ABLATION}


def write_cell(run_dir: Path, task, variant, label, seed, train_level, accuracies, memory_off=None):
    model = "tensor" if label == ABLATION else label
    cell_id = hashlib.sha256(json.dumps([task, variant, label, seed, train_level]).encode()).hexdigest()[:16]
    gated = label in GATED
    evals = [{"level": dict(level), "level_key": ",".join(f"{k}={v}" for k, v in level) or "-", "accuracy": acc,
              "accuracy_memory_off": (memory_off or {}).get(level, acc) if gated else None, "loss": 1.0,
              "chance": 0.25, "ceiling": 1.0, "n": 100, "fingerprint": "f" * 64}
             for level, acc in accuracies.items()]
    gates = {"layer0": 0.5, "layer1": 0.5}
    write_json(run_dir / "cells" / f"{cell_id}.json", {
        "schema": 1, "cell_id": cell_id, "status": "finished",
        "cell": {"task": task, "task_options": {}, "variant": variant, "train_level": dict(train_level),
                 "eval_levels": [e["level"] for e in evals], "model": model, "label": label,
                 "model_options": {}, "seed": seed, "train": {"steps": 100}},
        "n_params": 1000, "wall_time_s": 1.0, "steps_per_s": 10.0, "causality": {"verdict": "causal"},
        "gate_init": gates if gated else None, "gates_final": gates if gated else None,
        "history": [{"step": s, "loss": 2.0 - s / 100, "train_acc": s / 200, "steps_per_s": 10.0,
                     **({"gates": {k: 0.5 + s / 1000 for k in gates}} if gated else {})} for s in (50, 100)],
        "eval": evals,
    })
    read_cell(run_dir / "cells" / f"{cell_id}.json")  # the cell schema accepts it


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("every-model")
    labels = backbone_names() + [ABLATION]
    for k, (label, seed) in enumerate(itertools.product(labels, (0, 1))):
        acc = 0.3 + 0.05 * (k % 12)
        for variant in ("standard", LONG):
            for w in (5, 20):
                # Each model trained at each level and evaluated at every level; "lstm" was never
                # evaluated at n_writes=10 with noise 0.1, a gap in its curve.
                levels = [(("n_writes", e), ("noise", n)) for e in (5, 10, 20) for n in (0.0, 0.1)]
                levels = [lv for lv in levels if not (label == "lstm" and lv == (("n_writes", 10), ("noise", 0.1)))]
                write_cell(run_dir, "coordinate_binding", variant, label, seed, (("n_writes", w), ("noise", 0.0)),
                           {lv: acc - 0.01 * lv[0][1] for lv in levels})
        # Memory reliance of zero, as a memory the model ignores gives.
        write_cell(run_dir, "occlusion", "standard", label, seed, (("occlusion_len", 2),),
                   {(("occlusion_len", n),): acc for n in (1, 2, 4)})
        write_cell(run_dir, "no_harm", "standard", label, seed, (), {(): 1.0}, memory_off={(): 1.0})
    return run_dir


@pytest.fixture(scope="module")
def figures(run):
    data = load_run(run)
    assert not data.problems
    return data, dict(draw_figures(data))


def test_every_registered_model_has_its_own_stable_colour(monkeypatch):
    assert set(BUILTIN_COLORS) == set(BUILTIN_MODELS)
    monkeypatch.setattr(BACKBONES, "_entry_points", {"my_memory": None, "another": None})
    colors = model_colors()
    assert set(colors) == set(backbone_names()) and len(set(colors.values())) == len(colors)
    assert colors["another"] == EXTRA_COLORS[0] and colors["my_memory"] == EXTRA_COLORS[1]  # in name order
    assert {k: colors[k] for k in BUILTIN_COLORS} == BUILTIN_COLORS


def test_every_figure_is_drawn(figures):
    _, drawn = figures
    assert {"accuracy_coordinate_binding_trained", "accuracy_coordinate_binding_from_n_writes5",
            "accuracy_occlusion_from_occlusion_len2", "gates_coordinate_binding", "training_coordinate_binding",
            "memory_reliance"} <= set(drawn)


def _inside(inner, outer, slack=1.0) -> bool:
    return (inner.x0 >= outer.x0 - slack and inner.y0 >= outer.y0 - slack and inner.x1 <= outer.x1 + slack
            and inner.y1 <= outer.y1 + slack)


def _overlap(a, b) -> bool:
    return min(a.x1, b.x1) > max(a.x0, b.x0) + 1 and min(a.y1, b.y1) > max(a.y0, b.y0) + 1


def test_no_legend_title_or_label_is_cut_or_overlaps(figures):
    _, drawn = figures
    for stem, (fig, _) in drawn.items():
        fig.draw_without_rendering()  # places the legend's entries as saving would
        renderer = fig.canvas.get_renderer()
        box = fig.bbox
        [legend] = fig.legends
        blocks = {"legend": legend.get_window_extent(renderer), "title": fig._suptitle.get_window_extent(renderer)}
        for i, ax in enumerate(fig.axes):
            blocks[f"panel {i} ({ax.get_title()!r})"] = ax.get_tightbbox(renderer)
        for name, extent in blocks.items():
            assert _inside(extent, box), f"{stem}: {name} reaches beyond the figure {extent} {box}"
        for (a, x), (b, y) in itertools.combinations(blocks.items(), 2):
            assert not _overlap(x, y), f"{stem}: {a} overlaps {b}"
        for text in legend.get_texts():
            assert _inside(text.get_window_extent(renderer), box), f"{stem}: legend entry {text.get_text()} is cut"


def test_legends_name_models_and_titles_name_the_variant(figures):
    data, drawn = figures
    models = set(data.table["label"])
    for stem, (fig, d) in drawn.items():
        labels = [t.get_text() for t in fig.legends[0].get_texts()]
        if stem.startswith("gates_"):
            assert all(label.startswith("layer") or label in _REFERENCES for label in labels), labels
            continue
        assert set(labels) <= models | set(_REFERENCES) and models & set(labels), (stem, labels)
        titles = [fig._suptitle.get_text()] + [ax.get_title() for ax in fig.axes]
        if stem.startswith(("accuracy_coordinate_binding", "training_coordinate_binding")):
            assert any("n_queries=8" in t for t in titles) and not any("n_queries=8" in t for t in labels)
    panels = drawn["accuracy_coordinate_binding_trained"][1]["panels"]
    assert [(p["variant"], p["title"]) for p in panels] == [
        ("standard", "standard\nnoise=0.0"), (LONG, "block_queries=True, encoding=cells, n_queries=8\nnoise=0.0")]


def test_colours_come_from_the_registry(figures):
    data, drawn = figures
    registered = model_colors()
    seen: dict[str, set] = {}
    for stem, (fig, _) in drawn.items():
        if stem.startswith("gates_"):  # coloured by layer
            continue
        for handle, text in zip(fig.legends[0].legend_handles, fig.legends[0].get_texts()):
            if text.get_text() not in _REFERENCES:
                color = handle.get_color() if hasattr(handle, "get_color") else handle.get_facecolor()
                seen.setdefault(text.get_text(), set()).add(to_hex(color))
    assert set(seen) == set(data.table["label"])
    assert all(len(c) == 1 for c in seen.values()), seen  # one colour per model in every figure
    for model, (color,) in seen.items():
        assert color == registered.get(model, color)
    assert len({c for (c,) in seen.values()}) == len(seen)  # the ablation's own label too has its own
    assert seen[ABLATION] == {EXTRA_COLORS[len(registered) - len(BUILTIN_COLORS)]}


def test_no_empty_panel_and_a_zero_drop_is_visible(figures):
    _, drawn = figures
    for stem, (fig, _) in drawn.items():
        for ax in fig.axes:
            assert ax.lines or ax.patches or ax.collections, f"{stem}: panel {ax.get_title()!r} is empty"
    fig, d = drawn["memory_reliance"]
    occlusion = next(ax for ax, p in zip(fig.axes, d["panels"]) if p["title"] == "occlusion")
    assert d["panels"][[p["title"] for p in d["panels"]].index("occlusion")]["bars"]["tensor"] == [0.0] * 3
    # The bars have no height; each still shows as a line of its model's colour, a bar wide, at 0.
    marks = [c for c in occlusion.collections if to_hex(c.get_color()[0]) == model_colors()["tensor"]]
    segments = [s for c in marks for s in c.get_segments()]
    assert len(segments) == 3 and all(s[0][1] == s[1][1] == 0 and s[1][0] > s[0][0] for s in segments)
    no_harm = next(ax for ax, p in zip(fig.axes, d["panels"]) if p["title"] == "no_harm")
    assert [t.get_text() for t in no_harm.get_xticklabels()] == []  # no stray "-" tick


def test_a_missing_level_is_a_gap_not_a_line_across(figures):
    _, drawn = figures
    fig, d = drawn["accuracy_coordinate_binding_from_n_writes5"]
    k = next(i for i, p in enumerate(d["panels"]) if p["title"].endswith("noise=0.1") and p["variant"] == "standard")
    assert d["panels"][k]["series"]["lstm"]["x"] == [5.0, 20.0]
    lines = {line.get_label(): line for line in fig.axes[k].get_lines()}
    assert list(lines["lstm"].get_xdata()) == [5.0, 10.0, 20.0]
    y = lines["lstm"].get_ydata()
    assert y[1] != y[1] and y[0] == y[0] and y[2] == y[2]  # NaN at 10: matplotlib breaks the line there
