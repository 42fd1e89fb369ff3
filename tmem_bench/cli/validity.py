"""The `tmem-bench validity` command: how well the toy suite's rankings of memories predict their
rankings on external tasks (`tmem_bench.report.validity`)."""
from __future__ import annotations

from pathlib import Path

from ..errors import UsageError, check_int


def add_validity_parser(sub, debug) -> None:
    validity = sub.add_parser(
        "validity", parents=[debug],
        help="Kendall's tau between toy diagnostic scores and external scores, with seed-bootstrap intervals")
    validity.add_argument("runs", nargs="+", metavar="RUN",
                          help="one or more toy runs (e.g. docs/runs/study_converge docs/runs/capacity_converge), "
                               "then the external run (of the external profile), last")
    validity.add_argument("--out", metavar="DIR", help="where validity.md, .csv and .png go (default EXTERNAL_RUN/validity)")
    validity.add_argument("--resamples", default="2000", metavar="N", help="bootstrap resamples (default 2000)")


def cmd_validity(args) -> int:
    from ..report.validity import tau_text, write_validity

    if len(args.runs) < 2:
        raise UsageError("validity needs at least one toy run and the external run: tmem-bench validity TOY_RUN... EXTERNAL_RUN")
    *toys, external = args.runs
    out = Path(args.out) if args.out else Path(external) / "validity"
    table = write_validity(toys, external, out, check_int("--resamples", args.resamples))
    width = max(len(t) for t in table["toy"])
    for _, row in table.iterrows():
        print(f"{row['toy']:<{width}}  {row['external']:<40}  tau {tau_text(row)}  ({row['n_models']} models)")
    print(f"written: {out}/validity.md, validity.csv, validity.png")
    return 0
