"""Reports of a run, regenerated from its stored cell results alone.

`write_report(run_dir)` reads runs/<run>/cells/*.json (and manifest.json for the
planned cells) and writes report.md plus figures/ (PNG and SVG): accuracy against
each task's sweep axis (the per-level training view and the generalisation view),
gate values, memory reliance, training curves, summary tables, and the paper's
toy claims (claims.toml) checked by explicit decision rules. Every number comes
from the cell files; unreadable or missing cells are named in the report and
everything else still renders.

Modules: data (loading, labels), views (which rows a curve reads), stats
(bootstrap), figures, tables, claims (the claims as data), rules (the generic
decision rules), no_harm (the one no-harm rule), power (does a variant tell a memory
from no memory), markdown (report.md), write.
"""
from .claims import Claim, ClaimSpec, PowerSpec, load_claims, load_power
from .data import RunData, load_run, run_data
from .figure_parts import Style
from .figures import accuracy_figure, build_figures, save_figure
from .no_harm import no_harm_verdict, no_harm_verdicts
from .power import power_rows, power_rule, power_summary, power_verdict
from .rules import RULES, check_claim, check_claims
from .stats import (INCONCLUSIVE, REFUTED, SUPPORTED, bootstrap_ci, bootstrap_diff_ci, combine, compare, diff_ci,
                    mean_ci)
from .tables import final_gate_table, summary_frame, summary_markdown, summary_rich
from .views import curve_data, generalisation_view, sweep_axis, training_view
from .write import Report, write_report

__all__ = [
    "Claim", "ClaimSpec", "INCONCLUSIVE", "PowerSpec", "REFUTED", "RULES", "Report", "RunData", "SUPPORTED", "Style",
    "accuracy_figure", "bootstrap_ci", "bootstrap_diff_ci", "build_figures", "check_claim", "check_claims",
    "combine", "compare", "curve_data", "diff_ci", "mean_ci", "final_gate_table", "generalisation_view", "load_claims", "load_power",
    "load_run", "no_harm_verdict", "no_harm_verdicts", "power_rows", "power_rule", "power_summary", "power_verdict",
    "run_data", "save_figure", "summary_frame", "summary_markdown", "summary_rich", "sweep_axis",
    "training_view", "write_report",
]
