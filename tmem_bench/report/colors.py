"""One colour per label, the same in every figure of every report and on the board.

A registered label has a fixed colour: a built-in model its own; a label a built-in profile gives
(tensor_grid4, ...) and an installed plugin's model one placed among all of those (model_colors). Any
other label (a user's ablation, a second entry of one label) starts from a palette colour fixed by its
name, so that it looks the same wherever it is drawn, and moves along the palette only where that
colour is too close to one already in the same figure. Closeness is the CIEDE2000 colour difference
of CIELAB (about 1 is just noticeable): no two labels of one figure are closer than DISTINCT while the
palette has room (tested for 30 labels beside every built-in), and two closer than SIMILAR also differ
in marker (label_markers).
"""
from __future__ import annotations

import zlib
from functools import lru_cache

import numpy as np

from .profiles import profile_labels

# The first ten are matplotlib's tab10 in the order the suite's reports have always used; delta's and
# then ssm's are the qualitative-palette colours farthest from those before them; gru's is the one that
# keeps every built-in and the capacity figure's labels as far apart as before (tests/report/test_colors.py).
BUILTIN_COLORS = {
    "base": "#1f77b4", "base_wide": "#ff7f0e", "slots": "#2ca02c", "local": "#d62728", "linear": "#9467bd",
    "xl": "#8c564b", "registers": "#e377c2", "lstm": "#7f7f7f", "tensor": "#bcbd22", "tensor_local": "#17becf",
    "delta": "#393b79", "ssm": "#8c6d31", "gru": "#66c2a5",
}
DISTINCT = 10.0  # the closest two labels of one figure may be: 30 labels beside the 13 built-ins fit above it
# The near-identical pairs of earlier reports (tab20c's light blue beside tab10's blue and cyan, Dark2's
# green beside tab10's) were 13 to 19 apart.
SIMILAR = 20.0
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
# Where other labels' colours come from (palette()).
_QUALITATIVE = ("tab20", "Dark2", "Set1", "tab20b", "tab20c", "Paired", "Set2", "Accent")
_LIGHTNESS = (40.0, 75.0)  # darker reads as black (and dark hues as each other); lighter is too pale on white
_MIN_CHROMA = 20.0  # greys are left to the reference lines (chance, ceiling)


def lab(colors) -> np.ndarray:
    """CIELAB (D65) of '#rrggbb' colours, one row each."""
    rgb = np.array([[int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)] for c in colors], dtype=float).reshape(-1, 3)
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = linear @ np.array([[0.4124564, 0.3575761, 0.1804375], [0.2126729, 0.7151522, 0.0721750],
                             [0.0193339, 0.1191920, 0.9503041]]).T
    xyz /= (0.95047, 1.0, 1.08883)
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[:, 1] - 16, 500 * (f[:, 0] - f[:, 1]), 200 * (f[:, 1] - f[:, 2])], axis=1)


def delta_e(lab1: np.ndarray, lab2: np.ndarray) -> np.ndarray:
    """CIEDE2000 between CIELAB rows (either side may be one row; it is broadcast), as in Sharma,
    Wu and Dalal (2005), whose reference pairs test it. Not a library's (scikit-image, colour-science):
    a heavy dependency for these twenty lines."""
    (l1, a1, b1), (l2, a2, b2) = np.atleast_2d(lab1).T, np.atleast_2d(lab2).T
    c_mean = (np.hypot(a1, b1) + np.hypot(a2, b2)) / 2
    g = 0.5 * (1 - np.sqrt(c_mean ** 7 / (c_mean ** 7 + 25.0 ** 7)))
    a1, a2 = (1 + g) * a1, (1 + g) * a2
    c1, c2 = np.hypot(a1, b1), np.hypot(a2, b2)
    h1, h2 = np.degrees(np.arctan2(b1, a1)) % 360, np.degrees(np.arctan2(b2, a2)) % 360
    grey = c1 * c2 == 0  # a hue is undefined for a grey
    dh = np.where(grey, 0.0, (h2 - h1 + 180) % 360 - 180)
    d_hue = 2 * np.sqrt(c1 * c2) * np.sin(np.radians(dh) / 2)
    h_mean = np.where(grey, h1 + h2, np.where(np.abs(h1 - h2) > 180, (h1 + h2 + 360) / 2, (h1 + h2) / 2) % 360)
    l_mean, c_mean = (l1 + l2) / 2, (c1 + c2) / 2
    t = (1 - 0.17 * np.cos(np.radians(h_mean - 30)) + 0.24 * np.cos(np.radians(2 * h_mean))
         + 0.32 * np.cos(np.radians(3 * h_mean + 6)) - 0.20 * np.cos(np.radians(4 * h_mean - 63)))
    s_l = 1 + 0.015 * (l_mean - 50) ** 2 / np.sqrt(20 + (l_mean - 50) ** 2)
    s_c, s_h = 1 + 0.045 * c_mean, 1 + 0.015 * c_mean * t
    r_t = (-np.sin(np.radians(60 * np.exp(-(((h_mean - 275) / 25) ** 2))))
           * 2 * np.sqrt(c_mean ** 7 / (c_mean ** 7 + 25.0 ** 7)))
    dl, dc, dhh = (l2 - l1) / s_l, (c2 - c1) / s_c, d_hue / s_h
    return np.sqrt(dl ** 2 + dc ** 2 + dhh ** 2 + r_t * dc * dhh)


@lru_cache(maxsize=1)
def palette() -> tuple[tuple[str, ...], np.ndarray, int]:
    """(colours, their CIELAB, how many lead): first every usable colour at least SIMILAR from every
    built-in's, so that a label starting there looks like no built-in model, in any figure; then
    matplotlib's qualitative palettes, then the rest of xkcd's named colours, for figures with many
    labels. Within each part, each next colour is the one farthest from the built-ins' and those before."""
    from matplotlib import colormaps
    from matplotlib.colors import XKCD_COLORS, to_hex

    def usable(colors) -> list[str]:
        colors = [c for c in dict.fromkeys(colors) if c not in BUILTIN_COLORS.values()]
        values = lab(colors)
        keep = ((values[:, 0] >= _LIGHTNESS[0]) & (values[:, 0] <= _LIGHTNESS[1])
                & (np.hypot(values[:, 1], values[:, 2]) >= _MIN_CHROMA))
        return [c for c, ok in zip(colors, keep) if ok]

    builtins = lab(list(BUILTIN_COLORS.values()))
    qualitative = usable(to_hex(c) for name in _QUALITATIVE for c in colormaps[name].colors)
    xkcd = usable(to_hex(c) for c in XKCD_COLORS.values())
    candidates = qualitative + xkcd
    to_builtin = np.min([delta_e(lab(candidates), b) for b in builtins], axis=0)
    far = [c for c, d in zip(candidates, to_builtin) if d >= SIMILAR]
    ordered: list[str] = []
    for part in (far, qualitative, xkcd):
        left = [c for c in part if c not in ordered]
        values = lab(left)
        nearest = np.min([delta_e(values, v) for v in [*builtins, *lab(ordered)]], axis=0)
        while left:
            pick = int(np.argmax(nearest))
            ordered.append(left.pop(pick))
            picked, values, nearest = values[pick], np.delete(values, pick, axis=0), np.delete(nearest, pick)
            if left:
                nearest = np.minimum(nearest, delta_e(values, picked))
    return tuple(ordered), lab(ordered), len(far)


def model_colors() -> dict[str, str]:
    """A colour per registered label, the same in every figure: the built-in models' own, then, each
    placed (as `label_colors` places a label) among all before it, the labels the built-in profiles
    give (tensor_grid4, ...) and installed plugins' models, each in name order."""
    from ..registry import BACKBONES

    fixed = place(profile_labels(), dict(BUILTIN_COLORS))
    return place(sorted(set(BACKBONES.names()) - set(fixed)), fixed)


def label_colors(labels) -> dict[str, str]:
    """A colour per label of one figure: a registered label's own (model_colors); each other label,
    in name order, placed among the colours of the labels before it."""
    labels = list(dict.fromkeys(labels))
    registered = model_colors()
    out = {label: registered[label] for label in labels if label in registered}
    out = place(sorted(set(labels) - set(out)), out)
    return {label: out[label] for label in labels}


def place(labels: list[str], taken: dict[str, str]) -> dict[str, str]:
    """`taken` with a colour for each label, in order: the first of the palette's leading colours (far
    from every built-in's), from the place its name fixes, at least SIMILAR from every colour taken, else
    the first such colour of the whole palette, else the first at least DISTINCT from them, else the one
    farthest from them."""
    colors, values, n_own = palette()
    out = dict(taken)
    used = list(lab(list(out.values()))) if out else []
    everything = np.arange(len(colors))
    for label in labels:
        start = zlib.crc32(label.encode()) % n_own
        own = np.r_[np.arange(start, n_own), np.arange(start)]
        nearest = np.min([delta_e(values, u) for u in used], axis=0) if used else np.full(len(colors), np.inf)
        for order, floor in ((own, SIMILAR), (everything, SIMILAR), (everything, DISTINCT)):
            hits = order[nearest[order] >= floor]
            if hits.size:
                pick = int(hits[0])
                break
        else:
            pick = int(np.argmax(nearest))
        out[label] = colors[pick]
        used.append(values[pick])
    return out


def label_markers(colors: dict[str, str]) -> dict[str, str]:
    """A marker per label, in the given order: a circle, unless an earlier label's colour is closer
    than SIMILAR, then the first marker none of those uses."""
    values = lab(list(colors.values())) if colors else np.zeros((0, 3))
    markers: list[str] = []
    for i in range(len(values)):
        near = {markers[j] for j in np.flatnonzero(delta_e(values[:i], values[i]) < SIMILAR)} if i else set()
        markers.append(next((m for m in MARKERS if m not in near), MARKERS[i % len(MARKERS)]))
    return dict(zip(colors, markers))
