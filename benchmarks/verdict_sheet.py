"""The README's verdict sheet, rebuilt from the committed reports: each claim's verdict in each
protocol column, exactly as the report of that column's run gives it, so that no verdict on the sheet
is composed by hand (tests/project/test_sheet.py holds README.md to it):

    python benchmarks/verdict_sheet.py            # prints the table

A column reads one run's report.md: "headline" is a claim's verdict in the paper's setting ("### NAME:
VERDICT"), "forcing" the verdict its report gives under a memory-forcing variant ("under the variant
... the same rule gives: VERDICT"). A claim whose rule asks for another protocol reads another run
(capacity and saturation, each model trained at each W: capacity_converge under forcing). A claim a
report does not check is "-".
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verdict_diff import verdicts  # noqa: E402 - beside this script, not a package

ROOT = Path(__file__).resolve().parents[1]
# (column, run, which verdict of its report); the paper's protocol trains each model at the level it is
# read at, extrapolation trains at one level and reads the others, memory forcing blocks the evidence,
# the authors' budget is the paper's protocol at their steps and batch (base and tensor at W=50 only).
COLUMNS = (("paper's protocol", "paper_protocol", "headline"), ("extrapolation", "paper_claims", "headline"),
           ("memory forcing", "study_retrain", "forcing"), ("authors' budget, W=50", "paper_gpu_cpu_w50", "headline"))
# Claims whose rule needs every model trained at each W read that run in the memory-forcing column.
TRAINED_AT_EACH_W = {"memory forcing": ("capacity_converge", None)}
CLAIMS_AT_EACH_W = ("capacity: memory holds as writes grow, trained at each W", "caveat: a fixed-size state saturates")
CAPACITY_HEADLINE = "capacity: memory holds as writes grow, trained at each W"  # its report has no paper variant


def _claim_names(text: str) -> list[str]:
    return [m[1] for m in re.finditer(r"^### (.+?): [^:]+$", text, re.M)
            if m[1] in {k.removeprefix("claim: ") for k in verdicts(text)}]


def cell(root: Path, run: str, kind: str, claim: str) -> str:
    """The verdict `run`'s report gives `claim` ("headline" or "forcing"), linked to the report; "-" where
    it gives none."""
    path = root / "docs" / "runs" / run / "report.md"
    found = verdicts(path.read_text())
    if kind == "headline":
        verdict = found.get(f"claim: {claim}")
    else:
        forced = sorted({v for k, v in found.items() if k.startswith(f"claim: {claim} [")})
        verdict = "; ".join(forced) or None
    return "-" if verdict is None else f"{verdict} ([{run}](docs/runs/{run}/report.md))"


def sheet(root: Path = ROOT) -> str:
    """The sheet as a markdown table: a row per claim of paper_protocol's report, in its order."""
    names = _claim_names((root / "docs" / "runs" / "paper_protocol" / "report.md").read_text())
    lines = ["| claim | " + " | ".join(c for c, _, _ in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for name in names:
        cells = []
        for column, run, kind in COLUMNS:
            if name in CLAIMS_AT_EACH_W and column in TRAINED_AT_EACH_W:
                run = TRAINED_AT_EACH_W[column][0]
                # capacity's report there holds the forcing variant alone, so its headline is that variant's
                kind = "headline" if name == CAPACITY_HEADLINE else kind
            cells.append(cell(root, run, kind, name))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(sheet())
