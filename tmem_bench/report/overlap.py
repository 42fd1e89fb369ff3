"""Lines of a figure that lie on each other, and how the later one is drawn so that both show."""
from __future__ import annotations

import math

# Lines that coincide (every point within COINCIDE of a line drawn before it, as a fraction of the
# panel's range) would hide each other: the later one is dashed, its dashes shifted, with hollow markers
# a size larger, so that both show.
COINCIDE = 0.005
COINCIDENT_NOTE = "dashed, hollow markers: a line lying on another"


def coinciding(xs, ys, earlier: list[tuple[str, list, list]], span: float) -> list[str]:
    """The names of the lines in `earlier` ((name, xs, ys)) that (xs, ys) lies on, at every x both have."""
    out = []
    mine = {x: y for x, y in zip(xs, ys) if y is not None and not math.isnan(y)}
    for name, other_xs, other_ys in earlier:
        shared = [(mine[x], y) for x, y in zip(other_xs, other_ys)
                  if x in mine and y is not None and not math.isnan(y)]
        if shared and all(abs(a - b) <= COINCIDE * span for a, b in shared):
            out.append(name)
    return out


def coincident_style(k: int, on_chance: bool) -> dict:
    """Matplotlib keywords for a line lying on `k` earlier lines and maybe on chance: dashes shifted by
    k, hollow markers a size larger per line beneath. The chance line stays drawn over every model
    (its dashes show a model at chance between them); such a model gets hollow rings around them."""
    style = {"mfc": "white", "mew": 1.5, "ms": 7.0} if on_chance else {}
    if k:
        style.update(ls=(3 * k, (5, 3)), mfc="white", mew=1.2, ms=max(style.get("ms", 0.0), 4.5 + 2.5 * k),
                     zorder=min(2 + k, 4.5))
    return style


# Points of one panel closer than SPREAD (as a fraction of the panel's width and of its height) would
# hide each other: the later one is drawn a step to the side, where it lies near no other point.
SPREAD = 0.03
SPREAD_NOTE = "points lying on each other drawn side by side"


def spread(positions: list[tuple[float, float]], step: float) -> list[int]:
    """For points at (x, y), as fractions of the panel, in drawing order: how many steps (of `step`, a
    fraction of the width) sideways each is drawn. 0 for a point near no other; else the first of
    0, 1, -1, 2, -2, ... that puts it near no point already drawn and no point still to be drawn."""
    def near(a, b):
        return abs(a[0] - b[0]) < SPREAD and abs(a[1] - b[1]) < SPREAD

    drawn: list[tuple[float, float]] = []
    steps: list[int] = []
    for i, (x, y) in enumerate(positions):
        later = positions[i + 1:]
        k = next(s for k in range(len(positions) + 1) for s in (k, -k)
                 if not any(near((x + s * step, y), other) for other in drawn + later))
        steps.append(k)
        drawn.append((x + k * step, y))
    return steps
