"""index.html: one self-contained page. The board's data sits in a JSON script tag and inline
JavaScript draws the tables, filters and figures, so the page needs no network and opens from disk.
The page itself, with its style and script, is the Jinja template page.html."""
from __future__ import annotations

import json
from functools import lru_cache

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from ..report.colors import label_colors, place
from ..report.stats import BOOTSTRAP_FROM

# Which interval a level shows, as the reports' "How to read" says it (report/stats.py mean_ci);
# board.py adds which kind the board's own seed counts give.
INTERVAL_RULE = (f"its 95% interval of the mean: Student's t below {BOOTSTRAP_FROM} seeds, the percentile "
                 f"bootstrap from {BOOTSTRAP_FROM}, a point for one seed")


@lru_cache(maxsize=1)
def _template():
    # autoescape: whatever reaches the page as text is escaped; keep_trailing_newline: the page ends
    # with one, as every file the suite writes.
    env = Environment(loader=PackageLoader(__package__, "."), autoescape=True, keep_trailing_newline=True,
                      undefined=StrictUndefined)
    return env.get_template("page.html")


def with_colors(groups: list[dict]) -> list[dict]:
    """Each row's colour: its model label's, as every report draws it (report/colors.py), so that a
    registered model looks the same in a report and on the board. A label twice in one table (a preview
    beside the published entry) is told apart by its entry."""
    for group in groups:
        keys: list[str] = []
        for row in group["rows"]:
            label = row.get("label") or row["model"]
            keys.append(label if label not in keys else f"{label} ({row['slug']})")
        colors = label_colors(dict.fromkeys(row.get("label") or row["model"] for row in group["rows"]))
        colors = place([key for key in keys if key not in colors], colors)
        for row, key in zip(group["rows"], keys):
            row["color"] = colors[key]
    return groups


def render_page(data_json: str, banner: str | None = None, intervals: str = INTERVAL_RULE) -> str:
    """The page; with `banner` (a preview's), titled a preview and opening with the banner;
    `intervals` completes "a level shows the mean over seeds and ..." (board.interval_note)."""
    groups = with_colors(json.loads(data_json))
    data_json = json.dumps(groups, sort_keys=True)
    # Inside a script element HTML escapes are read as they are, so the JSON goes in unescaped but for
    # "<", written as \u003c so that no entry text can close the tag. Not Jinja's tojson, which also
    # rewrites every "'" and would change the committed page's bytes.
    data = Markup(data_json.replace("<", "\\u003c"))
    external = any(group.get("kind") == "external" for group in groups)
    return _template().render(data=data, banner=banner, intervals=intervals, external=external)
