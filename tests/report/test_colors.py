"""One colour per label (report/colors.py): the colour difference it measures with, distinct colours
for many labels in one figure, markers where colours are similar, the same colour in a report and on
the board."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest

from tmem_bench.leaderboard.page import render_page
from tmem_bench.report.colors import (BUILTIN_COLORS, DISTINCT, SIMILAR, delta_e, lab, label_colors, label_markers,
                                      model_colors)
from tmem_bench.report.figure_parts import Style

# The labels of the capacity run (docs/runs/capacity), where base, tensor_grid4 and tensor_local were three
# near-identical blues and slots and tensor_grid8 two greens.
CAPACITY = ["base", "slots", "delta", "linear", "lstm", "ssm", "tensor", "tensor_grid4", "tensor_grid8",
            "tensor_local"]


@pytest.mark.parametrize("lab1, lab2, expected", [
    # Sharma, Wu and Dalal (2005), Table 1: pairs 1, 7, 8, 13, 17, 19 and 25.
    ((50.0, 2.6772, -79.7751), (50.0, 0.0, -82.7485), 2.0425),
    ((50.0, 0.0, 0.0), (50.0, -1.0, 2.0), 2.3669),
    ((50.0, -1.0, 2.0), (50.0, 0.0, 0.0), 2.3669),
    ((50.0, 2.49, -0.001), (50.0, -2.49, 0.0011), 7.2195),
    ((50.0, 2.5, 0.0), (73.0, 25.0, -18.0), 27.1492),
    ((50.0, 2.5, 0.0), (50.0, 0.0, -2.5), 4.3065),
    ((60.2574, -34.0099, 36.2677), (60.4626, -34.1751, 39.4387), 1.2644),
])
def test_delta_e_is_ciede2000(lab1, lab2, expected):
    assert delta_e(np.array(lab1), np.array(lab2))[0] == pytest.approx(expected, abs=1e-4)


def test_lab_of_srgb():
    np.testing.assert_allclose(lab(["#ffffff", "#000000", "#ff0000"]),
                               [[100, 0, 0], [0, 0, 0], [53.24, 80.09, 67.20]], atol=0.02)


def _closest(colors: dict[str, str]) -> float:
    values = lab(list(colors.values()))
    return min(delta_e(values[i], values[j])[0] for i, j in itertools.combinations(range(len(values)), 2))


def _similar_pairs_share_a_marker(colors: dict[str, str]) -> list[tuple[str, str]]:
    markers, values = label_markers(colors), lab(list(colors.values()))
    return [(a, b) for (i, a), (j, b) in itertools.combinations(enumerate(colors), 2)
            if delta_e(values[i], values[j])[0] < SIMILAR and markers[a] == markers[b]]


@pytest.mark.parametrize("builtins", [False, True])
def test_thirty_labels_in_one_figure_have_distinct_colours(builtins):
    labels = [f"memory_{i:02d}" for i in range(30)] + (list(BUILTIN_COLORS) if builtins else [])
    colors = label_colors(labels)
    assert list(colors) == labels
    assert _closest(colors) >= DISTINCT
    assert _similar_pairs_share_a_marker(colors) == []


def test_the_capacity_runs_labels_are_far_apart():
    colors = label_colors(CAPACITY)
    assert _closest(colors) >= SIMILAR
    # What the figures drew before: tensor_grid4 #6baed6 beside tensor_local, tensor_grid8 #1b9e77 beside slots.
    assert delta_e(lab(["#6baed6"]), lab([colors["tensor_local"]]))[0] < SIMILAR
    assert delta_e(lab(["#1b9e77"]), lab([colors["slots"]]))[0] < SIMILAR


def test_built_in_colours_are_fixed_and_apart():
    assert label_colors(["tensor", "base"]) == {"tensor": BUILTIN_COLORS["tensor"], "base": BUILTIN_COLORS["base"]}
    assert {k: model_colors()[k] for k in BUILTIN_COLORS} == BUILTIN_COLORS
    assert _closest(BUILTIN_COLORS) >= 16  # tab10's closest pair (red, brown) is 16.2 apart


def test_the_suites_own_labels_keep_their_colours_in_every_report():
    """tensor_grid8 was red in one report and teal in another: a label a built-in profile gives is
    registered, so the capacity run, the ablations and the board draw it alike."""
    ablations = ["base", "tensor", "tensor_hard", "tensor_separate_heads", "tensor_pointwise", "tensor_grid4",
                 "tensor_grid8", "tensor_chunk2", "tensor_chunk4", "tensor_channels8"]
    for label in ("tensor_grid4", "tensor_grid8"):
        assert label_colors(CAPACITY)[label] == label_colors(ablations)[label] == label_colors([label])[label]
        assert label_colors(CAPACITY)[label] == model_colors()[label]


def test_another_label_keeps_its_colour_where_nothing_near_it_is_drawn():
    alone = label_colors(["my_grid8"])["my_grid8"]
    assert label_colors([*CAPACITY, "my_grid8"])["my_grid8"] == alone
    assert label_colors(["base", "tensor", "my_grid8"])["my_grid8"] == alone
    # and moves only where a label placed before it (in name order) took a colour near its own
    for other in ("another", "zzz", "a6", "a9"):  # a6 and a9 start near it, the others far
        theirs = label_colors([other])[other]
        both = label_colors(["my_grid8", other])
        near = delta_e(lab([theirs]), lab([alone]))[0] < SIMILAR and other < "my_grid8"
        assert (both["my_grid8"] != alone) == near and _closest(both) >= SIMILAR


def test_similar_colours_differ_in_marker():
    markers = label_markers({"a": "#1f77b4", "b": "#2a7fbf", "c": "#d62728"})
    assert markers["a"] == markers["c"] == "o" and markers["b"] != "o"


def _board(rows: list[dict]) -> list[dict]:
    group = {"profile": "p", "task": "coordinate_binding", "variant": "standard", "kind": "standard",
             "kind_title": "t", "levels": ["n_writes=5"], "labels": {"n_writes=5": "n_writes=5"},
             "chance": {"n_writes=5": 0.1}, "ceiling": {"n_writes=5": 1.0}, "chance_note": "c", "rows": rows}
    page = render_page(json.dumps([group]))
    return json.loads(page.split('id="board-data">')[1].split("</script>")[0])[0]["rows"]


def test_a_model_has_the_same_colour_in_a_report_and_on_the_board():
    labels = ["tensor", "tensor_grid4", "base"]
    style = Style(pd.DataFrame({"label": labels}))
    rows = _board([{"slug": f"entry-{m}", "label": m, "model": m.split("_grid")[0], "cells": {}} for m in labels]
                  + [{"slug": "preview-tensor", "label": "tensor", "model": "tensor", "cells": {}}])
    color = {r["slug"]: r["color"] for r in rows}
    for m in labels:
        assert color[f"entry-{m}"] == style.of(m)
    assert color["entry-tensor"] == BUILTIN_COLORS["tensor"]
    # A second entry of one label in the same table (a preview beside the published one) is told apart.
    assert color["preview-tensor"] not in {color[f"entry-{m}"] for m in labels}


def test_no_label_outside_the_built_ins_is_drawn_near_black():
    """The ablations' figures drew tensor_chunk2, tensor_grid8 and tensor_hard in three greens of
    CIELAB lightness 26 to 30, which read as black and as each other."""
    placed = {k: v for k, v in model_colors().items() if k not in BUILTIN_COLORS}
    placed.update(label_colors([f"user_{i}" for i in range(30)]))
    assert min(lab(list(placed.values()))[:, 0]) >= 40
