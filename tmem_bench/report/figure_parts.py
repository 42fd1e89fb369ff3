"""The parts every figure of a report is made of: a style per model, the chance and ceiling lines,
the panel grid and its legend, the x axis of levels (figures.py, capacity.py)."""
from __future__ import annotations

import math
import textwrap

import numpy as np
import pandas as pd

from .colors import label_colors, label_markers
from .data import model_order


# Drawn over every model's line, dashed: a model at chance (base, by construction, on the memory-forcing
# variants) shows between the dashes and cannot hide it.
CHANCE = {"color": "black", "ls": (0, (4, 2.5)), "lw": 1.1, "zorder": 5}
CEILING = {"color": "black", "ls": ":", "lw": 1.3, "zorder": 5}


def reference_lines(ax, xs, chance, ceiling, horizontal: bool = False) -> None:
    """Chance and ceiling, drawn over the models' lines."""
    for values, style, label in ((chance, CHANCE, "chance"), (ceiling, CEILING, "ceiling")):
        if horizontal:
            ax.axhline(float(np.mean(values)), **style, label=label)
        else:
            ax.plot(xs, values, **style, label=label)


class Style:
    """A colour and a marker per label of a run (colors.py): a registered model's colour is the same
    in every report and on the board, no two labels share a colour or a near-identical one, and two of
    similar colour differ in marker."""

    def __init__(self, table: pd.DataFrame):
        self.colors = label_colors(model_order(table) if not table.empty else [])
        self.markers = label_markers(self.colors)

    def of(self, label: str) -> str:
        return self.colors.get(label.split(" @ ")[0], "black")

    def marker(self, label: str) -> str:
        return self.markers.get(label.split(" @ ")[0], "o")


def spaced(variant: str) -> str:
    """A variant's option text with room to break a line after each option."""
    return variant.replace(",", ", ")


def one_variant(variants) -> str:
    """The figure-title suffix when every panel shows the same variant (the panels then omit it)."""
    variants = list(dict.fromkeys(variants))
    return f" [{spaced(variants[0])}]" if len(variants) == 1 and variants[0] != "standard" else ""


_PAD = 0.12  # inches around each block of the layout
_REFERENCES = ("chance", "ceiling", "trained at", "initial value", "not converged (hollow)")


def new_figure(n_panels: int, ncols: int | None = None, panel_size=(3.4, 2.4)):
    """A grid of panels, each panel_size inches inside its axes; finish_figure sizes the figure around them."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ncols = ncols or min(n_panels, 3)
    nrows = math.ceil(n_panels / ncols)
    fig = Figure(figsize=(panel_size[0] * ncols, panel_size[1] * nrows))
    FigureCanvasAgg(fig)  # measuring text needs a renderer
    fig.subplots_adjust(left=0, right=1, bottom=0, top=1, wspace=0, hspace=0)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[n_panels:]:
        fig.delaxes(ax)
    return fig, axes[:n_panels]


def _fit(text, width: float, renderer) -> None:
    """Re-wrap a text artist, breaking at spaces, until it is at most `width` pixels wide."""
    lines = text.get_text().split("\n")
    for chars in range(max(map(len, lines)), 8, -2):
        if text.get_window_extent(renderer).width <= width:
            return
        text.set_text("\n".join(textwrap.fill(line, chars, break_long_words=False) for line in lines))


def finish_figure(fig, axes, drawn: dict, title: str | None = None):
    """One legend for every panel and the figure's title, then a layout measured from the drawn text:
    each column and row of panels is spaced by what its labels and titles need, the legend's width
    and the title's height are added, so that nothing is cut or overlaps. Returns (figure, data drawn)."""
    renderer = fig.canvas.get_renderer()
    dpi = fig.dpi
    seen = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    seen = dict(sorted(seen.items(), key=lambda kv: kv[0] in _REFERENCES))  # the models first
    legend = fig.legend(list(seen.values()), list(seen), loc="upper left", fontsize=8, frameon=False,
                        borderaxespad=0) if seen else None
    w, h = axes[0].bbox.width / dpi, axes[0].bbox.height / dpi
    for ax in axes:
        _fit(ax.title, ax.bbox.width, renderer)
    cells = [(ax.get_subplotspec().rowspan.start, ax.get_subplotspec().colspan.start) for ax in axes]
    nrows, ncols = max(r for r, _ in cells) + 1, max(c for _, c in cells) + 1
    left, right, top, bottom = [0.0] * ncols, [0.0] * ncols, [0.0] * nrows, [0.0] * nrows
    for ax, (r, c) in zip(axes, cells):
        tight, box = ax.get_tightbbox(renderer), ax.bbox
        left[c] = max(left[c], (box.x0 - tight.x0) / dpi)
        right[c] = max(right[c], (tight.x1 - box.x1) / dpi)
        top[r] = max(top[r], (tight.y1 - box.y1) / dpi)
        bottom[r] = max(bottom[r], (box.y0 - tight.y0) / dpi)
    xs, x = [], _PAD
    for c in range(ncols):
        xs.append(x + left[c])
        x = xs[-1] + w + right[c] + _PAD
    legend_w = legend.get_window_extent(renderer).width / dpi if legend else 0.0
    width = x + legend_w + (_PAD if legend else 0.0)
    suptitle = fig.suptitle(title or drawn["title"], fontsize=11, va="top")
    _fit(suptitle, (width - 2 * _PAD) * dpi, renderer)
    title_h = suptitle.get_window_extent(renderer).height / dpi
    ys, y = [], _PAD + title_h + _PAD
    for r in range(nrows):
        ys.append(y + top[r])
        y = ys[-1] + h + bottom[r] + _PAD
    legend_h = legend.get_window_extent(renderer).height / dpi if legend else 0.0
    height = max(y, ys[0] + legend_h + _PAD)
    fig.set_size_inches(width, height)
    for ax, (r, c) in zip(axes, cells):
        ax.set_position([xs[c] / width, 1 - (ys[r] + h) / height, w / width, h / height])
    if legend:
        legend.set_bbox_to_anchor((x / width, 1 - ys[0] / height), transform=fig.transFigure)
    suptitle.set_y(1 - _PAD / height)
    return fig, drawn


def set_x_axis(ax, xs: list[float], x_axis: str, trained_x=None):
    """Ticks at the levels; the level the models were trained at is named on its tick and shaded."""
    xs = sorted(set(xs))
    if xs and xs[0] > 0 and xs[-1] / xs[0] >= 8:
        ax.set_xscale("log")
    trained = None if trained_x is None else float(trained_x)
    ax.set_xticks(xs, [f"{x:g}" + ("\ntrained" if x == trained else "") for x in xs])
    ax.minorticks_off()
    ax.set_xlabel(x_axis)
    if trained is not None:
        ax.axvline(trained, color="0.85", lw=8, zorder=0, label="trained at")


def thin_x_tick_labels(axes) -> None:
    """Keep, on each panel's x axis, only the tick labels that overlap no label kept before them, the
    major ticks' first: a log axis spanning about a decade labels its minor ticks too, and at a panel's
    width 2x10^4, 3x10^4 and 4x10^4 ran into each other."""
    from matplotlib.ticker import NullFormatter

    axes = list(axes)
    if not axes:
        return
    axes[0].figure.draw_without_rendering()  # lays the ticks out and sets their labels
    renderer = axes[0].figure.canvas.get_renderer()
    for ax in axes:
        lo, hi = sorted(ax.get_xlim())
        kept = []
        for locs, ticks in ((ax.xaxis.get_majorticklocs(), ax.xaxis.get_major_ticks),
                            (ax.xaxis.get_minorticklocs(), ax.xaxis.get_minor_ticks)):
            for loc, tick in zip(locs, ticks(len(locs))):
                box = tick.label1.get_window_extent(renderer)
                if lo <= loc <= hi and tick.label1.get_text() and not any(box.overlaps(b) for *_, b in kept):
                    kept.append((loc, tick.label1.get_text(), box.expanded(1.15, 1.0)))
        kept.sort(key=lambda k: k[0])
        ax.set_xticks([k[0] for k in kept], [k[1] for k in kept])
        ax.xaxis.set_minor_formatter(NullFormatter())
