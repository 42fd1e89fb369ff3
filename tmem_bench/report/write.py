"""write_report: report.md and figures/ of a run, regenerated from its stored cell results alone."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..results import write_atomic
from .claims import Claim, load_claims
from .data import RunData, load_run
from .figures import build_figures
from .markdown import render_markdown
from .no_harm import no_harm_verdicts
from .rules import check_claims
from .tables import summary_frame


@dataclass
class Report:
    path: Path
    figures: dict[str, dict]  # stem -> the data drawn in that figure
    claims: list[Claim]
    no_harm: list[dict]
    summary: pd.DataFrame
    problems: list[str]
    data: RunData


def write_report(run_dir) -> Report:
    """Regenerate report.md and figures/ of a run from its stored cell results."""
    data = load_run(run_dir)
    figures = build_figures(data, data.run_dir / "figures")
    summary = summary_frame(data)
    claims = check_claims(data)
    no_harm_spec = next(spec for spec in load_claims() if spec.rule == "no_harm")
    no_harm = no_harm_verdicts(data, no_harm_spec)
    path = data.run_dir / "report.md"
    write_atomic(path, render_markdown(data, figures, summary, claims, no_harm, no_harm_spec))
    return Report(path, figures, claims, no_harm, summary, data.problems, data)
