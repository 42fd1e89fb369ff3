"""Every figure of a report, drawn from a synthetic run that holds every registered model (nothing is
trained): nothing cut at the figure's edge, nothing overlapping, legends that name models, a colour
per label (colors.py), chance above every line, the trained level marked, one figure per view."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_hex

from tests.report.helpers import ABLATION, CB_SUPPORT, write_cell
from tmem_bench.registry import BACKBONES, BUILTIN_MODELS, backbone_names
from tmem_bench.report import Style, accuracy_figure, capacity, curve_data, mean_ci, training_view
from tmem_bench.report.colors import BUILTIN_COLORS, label_colors, model_colors
from tmem_bench.report.data import load_run
from tmem_bench.report.figure_parts import _REFERENCES, CHANCE
from tmem_bench.report.figures import CAPACITY_AXIS, PANEL_MODELS, draw_figures, training_figure
from tmem_bench.report.profiles import profile_labels

# A long variant, as the planner names one by its changed options, is what used to overflow.
LONG = "block_queries=True,encoding=cells,n_queries=8"


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
    drawn = dict(draw_figures(data))
    drawn["capacity_coordinate_binding"] = capacity.accuracy_vs_writes(
        data, "coordinate_binding", [g for g in capacity.capacity_groups(data) if g.task == "coordinate_binding"])
    return data, drawn


def test_every_registered_model_has_its_own_stable_colour(monkeypatch):
    assert set(BUILTIN_COLORS) == set(BUILTIN_MODELS)
    monkeypatch.setattr(BACKBONES, "_entry_points", {"my_memory": None, "another": None})
    colors = model_colors()
    assert set(colors) == set(backbone_names()) | set(profile_labels()) and len(set(colors.values())) == len(colors)
    assert {k: colors[k] for k in BUILTIN_COLORS} == BUILTIN_COLORS
    # A plugin's colour is fixed by its own name, not by which other plugins are installed.
    assert label_colors(["my_memory"]) == {"my_memory": colors["my_memory"]}


def test_every_figure_is_drawn(figures):
    _, drawn = figures
    assert {"accuracy_coordinate_binding_from_n_writes5", "accuracy_occlusion_from_occlusion_len2",
            "gates_coordinate_binding", "training_coordinate_binding", "memory_reliance"} <= set(drawn)


def test_the_capacity_figure_is_the_only_per_level_view_of_the_writes(figures):
    """Trained at each W and evaluated there is the capacity figure; the per-level training view drew
    the same points again (docs/runs/capacity had both)."""
    _, drawn = figures
    assert capacity.AXIS == CAPACITY_AXIS
    assert "accuracy_coordinate_binding_trained" not in drawn
    trained_at = {p["x"][0] for p in drawn["capacity_coordinate_binding"][1]["panels"][0]["series"].values()}
    assert trained_at == {5.0}


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
    panels = drawn["accuracy_coordinate_binding_from_n_writes5"][1]["panels"]
    assert [(p["variant"], p["title"]) for p in panels] == [
        ("standard", "standard\nnoise=0.0"), ("standard", "standard\nnoise=0.1"),
        (LONG, "block_queries=True, encoding=cells, n_queries=8\nnoise=0.0"),
        (LONG, "block_queries=True, encoding=cells, n_queries=8\nnoise=0.1")]


def test_one_colour_per_label_in_every_figure(figures):
    data, drawn = figures
    expected = label_colors(sorted(set(data.table["label"])))
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
    assert {model: color for model, (color,) in seen.items()} == expected
    assert all(expected[m] == BUILTIN_COLORS[m] for m in BUILTIN_COLORS)
    assert len({c for (c,) in seen.values()}) == len(seen)  # the ablation's own label too has its own


def test_chance_is_drawn_over_every_model_line(figures):
    """base sits at chance on the memory-forcing variants; its line hid the chance line drawn under it."""
    _, drawn = figures
    for stem in ("accuracy_coordinate_binding_from_n_writes5", "capacity_coordinate_binding"):
        fig, _ = drawn[stem]
        for ax in fig.axes:
            lines = {line.get_label(): line for line in ax.get_lines()}
            models = [line for label, line in lines.items() if label not in _REFERENCES and not label.startswith("_")]
            assert models and all(lines["chance"].get_zorder() > line.get_zorder() for line in models), stem
            assert lines["chance"].get_color() == CHANCE["color"] and lines["chance"].get_linestyle() == "--"


def test_the_trained_level_is_marked(figures):
    _, drawn = figures
    fig, d = drawn["accuracy_coordinate_binding_from_n_writes5"]
    for ax in fig.axes:
        ticks = {t.get_text() for t in ax.get_xticklabels()}
        assert ticks == {"5\ntrained", "10", "20"}
        assert "trained at" in [line.get_label() for line in ax.get_lines()]


def test_training_curves_are_a_grid_and_every_seed_in_its_models_colour(figures):
    """Two panels a row (loss, train accuracy), a row per training level: the 8 panels of the capacity run
    were one row of a 2296 px wide image; seeds after the first were drawn at half opacity, so delta's
    navy read as lstm's grey."""
    data, drawn = figures
    fig, d = drawn["training_coordinate_binding"]
    cells = {(ax.get_subplotspec().rowspan.start, ax.get_subplotspec().colspan.start) for ax in fig.axes}
    assert {c for _, c in cells} == {0, 1} and len(cells) == len(fig.axes)
    # The helper gives every model the same history: each would hide the others, so each has its own row.
    assert all(len(p["models"]) == 1 for p in d["panels"]) and len(fig.axes) == 2 * 4 * len(set(data.table["label"]))
    assert fig.get_size_inches()[0] < 10
    colors = label_colors(sorted(set(data.table["label"])))
    for ax in fig.axes:
        for line in ax.get_lines():
            assert line.get_alpha() in (None, 1.0)
            assert to_hex(line.get_color()) == colors[line.get_label()]


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
    assert no_harm.get_xlabel() == "no levels: one evaluation set"
    # Every panel on one scale, so that the occlusion panel's zero drops are not bars on a +/-0.04 axis.
    assert len({ax.get_ylim() for ax in fig.axes}) == 1 and fig.axes[0].get_ylim()[1] >= 0.1
    assert "no drop at any level" in [t.get_text() for t in occlusion.texts]
    # Ticks name only the axis that varies, by value; the one every level shares is in the title.
    binding = next(ax for ax, p in zip(fig.axes, d["panels"]) if p["title"].startswith("coordinate_binding"))
    assert [t.get_text() for t in binding.get_xticklabels()] == ["5", "20"]
    assert binding.get_xlabel() == "n_writes" and "noise=0.0" in binding.get_title()


def test_a_missing_level_is_a_gap_not_a_line_across(figures):
    _, drawn = figures
    fig, d = drawn["accuracy_coordinate_binding_from_n_writes5"]
    k = next(i for i, p in enumerate(d["panels"]) if p["title"].endswith("noise=0.1") and p["variant"] == "standard")
    assert d["panels"][k]["series"]["lstm"]["x"] == [5.0, 20.0]
    lines = {line.get_label(): line for line in fig.axes[k].get_lines()}
    assert list(lines["lstm"].get_xdata()) == [5.0, 10.0, 20.0]
    y = lines["lstm"].get_ydata()
    assert y[1] != y[1] and y[0] == y[0] and y[2] == y[2]  # NaN at 10: matplotlib breaks the line there


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
            assert (mean, low, high) == mean_ci(CB_SUPPORT[(int(x), model)])
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


def test_gate_and_training_figures_and_tables(report):
    gates = report.figures["gates_no_harm"]["panels"][0]
    assert gates["title"] == "tensor" and gates["initial"] == {"layer0": 0.5, "layer1": 0.5}
    assert gates["lines"]["layer0 seed 0"]["step"] == [0, 50, 100, 150]
    assert gates["lines"]["layer0 seed 0"]["gate"][-1] == pytest.approx(0.52)
    training = [p for p in report.figures["training_occlusion"]["panels"] if "tensor" in p["models"]]
    assert [(p["title"].split(" (")[0], p["metric"]) for p in training] == [
        ("trained at occlusion_len=0", m) for m in ("loss", "train_acc")]
    assert training[1]["lines"]["tensor seed 2"]["train_acc"] == pytest.approx([0.2 / 3 + 0.02, 0.4 / 3 + 0.02, 0.22])
    text = report.path.read_text()
    assert "| tensor | layer0 | 0.500 | 0.700 (18 cells) | 0.900 (12 cells) | 0.550 (3 cells) |" in text
    reliance = report.figures["memory_reliance"]["panels"]
    occl = next(p for p in reliance if p["title"] == "occlusion")
    assert occl["bars"]["tensor"] == pytest.approx([0.95 + 0.01 - 0.9, 0.85 + 0.01 - 0.4])


def test_lines_that_coincide_are_drawn_so_that_both_show(tmp_path):
    """Two models with the same accuracies hid one another (tensor_chunk2 and chunk4), and base sat
    invisibly on the chance line."""
    from tmem_bench.report.overlap import COINCIDENT_NOTE

    run = tmp_path / "same"
    for label, acc in (("base", 0.25), ("tensor", 0.8), ("lstm", 0.8)):  # 0.25: the helper's chance
        for seed in (0, 1):
            write_cell(run, "coordinate_binding", "standard", label, seed, (("n_writes", 5), ("noise", 0.0)),
                       {(("n_writes", w), ("noise", 0.0)): acc for w in (5, 10, 20)})
    data = load_run(run)
    curves = curve_data(training_view(data, "coordinate_binding", {"noise": 0.0}), "n_writes")
    fig, drawn = accuracy_figure([{"title": "t", "curves": curves}], "n_writes", "t", Style(data.table))
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert drawn["panels"][0]["coincident"] == {"base": ["chance"], "tensor": ["lstm"]}  # lstm is drawn first
    assert lines["lstm"].get_linestyle() == "-" and lines["tensor"].get_linestyle() == "--"
    assert lines["tensor"].get_markerfacecolor() == "white"
    assert lines["tensor"].get_markersize() > lines["lstm"].get_markersize()
    assert lines["base"].get_markerfacecolor() == "white" and lines["chance"].get_zorder() > lines["base"].get_zorder()
    assert COINCIDENT_NOTE in fig._suptitle.get_text()


def _history_run(run_dir, curves: dict) -> Path:
    """A run of one cell per (model, seed) whose history is curves[model][seed]: (loss, train accuracy) per step."""
    import json

    for model, seeds in curves.items():
        for seed, points in enumerate(seeds):
            write_cell(run_dir, "occlusion", "standard", model, seed, (("occlusion_len", 2),),
                       {(("occlusion_len", 2),): 0.5})
    for path in (run_dir / "cells").glob("*.json"):
        cell = json.loads(path.read_text())
        points = curves[cell["cell"]["label"]][cell["cell"]["seed"]]
        cell["history"] = [{"step": 50 * (i + 1), "loss": loss, "train_acc": acc, "steps_per_s": 10.0}
                           for i, (loss, acc) in enumerate(points)]
        path.write_text(json.dumps(cell))
    return run_dir


def _pixels(fig, ax, color) -> int:
    """How many pixels inside the panel are within a few levels of `color`."""
    from matplotlib.colors import to_rgb

    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(int)
    x0, y0, x1, y1 = (int(v) for v in ax.bbox.extents)
    height = image.shape[0]
    panel = image[height - y1:height - y0, x0:x1]
    return int((np.abs(panel - np.array(to_rgb(color)) * 255).max(axis=-1) <= 12).sum())


def test_a_model_hidden_under_others_gets_a_panel_of_its_own(tmp_path):
    """study_converge's occlusion curves drew base, lstm and tensor at chance in one panel: base, drawn
    first, showed nowhere. Each model's colour must show in every panel it is drawn in."""
    steps = 20
    rng = np.random.default_rng(0)
    chance = [[(1.386 + rng.normal(0, 0.002), 0.25 + rng.normal(0, 0.005)) for _ in range(steps)] for _ in range(3)]
    learns = [[(1.386 - 0.06 * i * (1 + 0.2 * s), 0.25 + 0.035 * i * (1 + 0.1 * s)) for i in range(steps)]
              for s in range(3)]
    curves = {"base": chance, "slots": learns, "lstm": [list(c) for c in chance], "tensor": [list(c) for c in chance]}
    data = load_run(_history_run(tmp_path / "hidden", curves))
    fig, drawn = training_figure(data, "occlusion", Style(data.table))
    style = Style(data.table)
    for ax, panel in zip(fig.axes, drawn["panels"]):
        for model in panel["models"]:
            assert _pixels(fig, ax, style.of(model)) > 100, (panel["title"], model)
    assert sum("base" in p["models"] for p in drawn["panels"]) == 2  # one row: loss and train accuracy


def test_no_training_panel_holds_more_than_a_few_models(tmp_path):
    """The external run's training curves drew 7 models of 3 seeds, 21 lines, in one panel."""
    models = ["base", "slots", "delta", "linear", "lstm", "ssm", "tensor"]
    curves = {m: [[(1.4 - 0.05 * i * (1 + k + 0.1 * s), min(1.0, 0.25 + 0.03 * i * (1 + k + 0.1 * s)))
                   for i in range(8)] for s in range(3)] for k, m in enumerate(models)}
    data = load_run(_history_run(tmp_path / "many", curves))
    fig, drawn = training_figure(data, "occlusion", Style(data.table))
    for ax, panel in zip(fig.axes, drawn["panels"]):
        assert len(ax.get_lines()) <= 3 * PANEL_MODELS and len(panel["models"]) <= PANEL_MODELS
    assert sorted(m for p in drawn["panels"][::2] for m in p["models"]) == sorted(models)
    assert [p["title"] for p in drawn["panels"][::2]] == ["trained at occlusion_len=2 (1 of 2)",
                                                          "trained at occlusion_len=2 (2 of 2)"]


def test_log_axis_tick_labels_do_not_overlap():
    """paper_protocol's state figure labelled 2x10^4, 3x10^4 and 4x10^4 on top of each other: a log
    axis spanning about a decade labels its minor ticks too."""
    from tmem_bench.report.figure_parts import new_figure, thin_x_tick_labels

    def overlapping(ax) -> bool:
        fig.draw_without_rendering()
        renderer = fig.canvas.get_renderer()
        boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels(which="both")
                 if t.get_visible() and t.get_text() and ax.get_xlim()[0] <= t.get_position()[0] <= ax.get_xlim()[1]]
        return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])

    fig, (ax,) = new_figure(1)
    ax.set_xscale("log")
    ax.plot([2.8e4, 1.1e5], [0.5, 0.5])
    ax.set_xlim(1.4e4, 2.2e5)
    assert overlapping(ax)  # matplotlib's own labels, as the committed figure had them
    thin_x_tick_labels([ax])
    assert not overlapping(ax)
    assert len([t for t in ax.get_xticklabels() if t.get_text()]) >= 3


def test_points_lying_on_each_other_are_drawn_apart():
    """capacity_converge's state figure piled six points near chance at W=40 (state 45 to 100 kB,
    accuracy 3% to 7%): drawn where they lie, no two of them are SPREAD apart."""
    from tmem_bench.report.overlap import SPREAD, spread

    piled = [(0.62, 0.046), (0.70, 0.095), (0.74, 0.057), (0.70, 0.069), (0.79, 0.068), (0.71, 0.065)]
    step = 0.035
    steps = spread(piled, step)
    drawn = [(x + k * step, y) for (x, y), k in zip(piled, steps)]
    for i, a in enumerate(drawn):
        for b in drawn[i + 1:]:
            assert abs(a[0] - b[0]) >= SPREAD or abs(a[1] - b[1]) >= SPREAD
    assert spread([(0.1, 0.1), (0.5, 0.5)], step) == [0, 0]
