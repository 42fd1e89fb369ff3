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
