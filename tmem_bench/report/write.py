"""write_report: report.md and figures/ of a run, regenerated from its stored cell results alone."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..files import write_atomic
from ..harness.rundir import RunDir
from .capacity import build_capacity_figures
from .claims import Claim, load_claims, load_power
from .data import RunData, load_run
from .figures import build_figures
from .markdown import render_markdown
from .no_harm import no_harm_verdicts
from .power import power_rows
from .rules import check_claims
from .tables import summary_frame


@dataclass
class Report:
    path: Path
    figures: dict[str, dict]  # stem -> the data drawn in that figure
    claims: list[Claim]
    no_harm: list[dict]
    power: list[dict]  # diagnostic power per task, variant and level (power.power_rows)
    summary: pd.DataFrame
    problems: list[str]
    data: RunData


def write_report(run_dir) -> Report:
    """Regenerate report.md and figures/ of a run from its stored cell results.

    Both are made in a staging folder and then moved into place, so a failure leaves the
    previous report and its figures as they were, never new figures beside an old report.
    The run directory's lock is held meanwhile, so a report is never written beside a running
    run, and staging folders of a report killed midway are removed under it."""
    run_dir = RunDir.existing(run_dir)
    run_dir.check_layout()
    data = load_run(run_dir)
    with data.dir.lock(say=lambda message: None):
        data.dir.remove_stale()
        return _write_locked(data)


def _write_locked(data: RunData) -> Report:
    with data.dir.report_staging() as staging:
        figures = build_figures(data, staging / "figures")
        figures.update(build_capacity_figures(data, staging / "figures"))
        summary = summary_frame(data)
        claims = check_claims(data)
        no_harm_spec = next(spec for spec in load_claims() if spec.rule == "no_harm")
        no_harm = no_harm_verdicts(data, no_harm_spec)
        power_spec = load_power()
        power = power_rows(data, power_spec)
        write_atomic(staging / "report.md", render_markdown(data, figures, summary, claims, no_harm, no_harm_spec,
                                                            power, power_spec))
        data.dir.publish_report(staging)
    return Report(data.dir.report_path, figures, claims, no_harm, power, summary, data.problems, data)
