"""write_report: report.md and figures/ of a run, regenerated from its stored cell results alone."""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..results import write_atomic
from ..rundir import run_lock
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
    data = load_run(run_dir)
    with run_lock(data.run_dir, say=lambda message: None):
        for stale in data.run_dir.glob(".report-*"):
            shutil.rmtree(stale, ignore_errors=True)
        return _write_locked(data)


def _write_locked(data: RunData) -> Report:
    staging = Path(tempfile.mkdtemp(dir=data.run_dir, prefix=".report-"))
    try:
        figures = build_figures(data, staging / "figures")
        summary = summary_frame(data)
        claims = check_claims(data)
        no_harm_spec = next(spec for spec in load_claims() if spec.rule == "no_harm")
        no_harm = no_harm_verdicts(data, no_harm_spec)
        power_spec = load_power()
        power = power_rows(data, power_spec)
        write_atomic(staging / "report.md", render_markdown(data, figures, summary, claims, no_harm, no_harm_spec,
                                                            power, power_spec))
        _publish(staging, data.run_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Report(data.run_dir / "report.md", figures, claims, no_harm, power, summary, data.problems, data)


def _publish(staging: Path, run_dir: Path) -> None:
    figures, retired = run_dir / "figures", staging / "figures.old"
    if figures.exists():
        os.replace(figures, retired)
    os.replace(staging / "figures", figures)
    os.replace(staging / "report.md", run_dir / "report.md")
