"""The `tmem-bench validity` command: how well the toy suite's rankings of memories predict their
rankings on external tasks (`tmem_bench.report.validity`)."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import UsageError, check_int

# Each resample ranks every model again for each of ~100 pairs of scores: past this the resamples of
# one pair fill gigabytes, and the intervals have long stopped moving.
MAX_RESAMPLES = 100_000


def add_validity_parser(sub, debug) -> None:
    validity = sub.add_parser(
        "validity", parents=[debug],
        help="Kendall's tau and Spearman's rho between toy diagnostic scores and external scores, with "
             "model-resampling intervals and permutation tests; the pair a hypothesis stated first")
    validity.add_argument("runs", nargs="+", metavar="RUN",
                          help="one or more toy runs (e.g. docs/runs/study_converge docs/runs/capacity_converge), "
                               "then the external run (of the external profile), last")
    validity.add_argument("--out", metavar="DIR", help="where validity.md, .csv and .png go (default "
                          "runs/validity-EXTERNAL_RUN's name: a new folder, never a committed table unless named)")
    validity.add_argument("--resamples", default="10000", metavar="N", help="bootstrap resamples of the models (default 10000)")
    validity.add_argument("--hypothesis", metavar="FILE",
                          help="the TOML statement of the confirmatory pair (default docs/external-validity-hypothesis.toml "
                               "of this checkout); where there is none every pair is exploratory")


def cmd_validity(args) -> int:
    from ..report.validity import HYPOTHESIS, summary, write_validity

    if len(args.runs) < 2:
        raise UsageError("validity needs at least one toy run and the external run: tmem-bench validity TOY_RUN... EXTERNAL_RUN")
    *toys, external = args.runs
    resamples = check_int("--resamples", args.resamples, maximum=MAX_RESAMPLES)
    if args.hypothesis and not Path(args.hypothesis).is_file():
        raise UsageError(f"--hypothesis {args.hypothesis} is not a file; give the TOML statement of the confirmatory pair")
    out = Path(args.out) if args.out else Path("runs") / f"validity-{Path(external).resolve().name}"
    writable_folder(out)  # before minutes of resampling, not after
    validity = write_validity(toys, external, out, resamples, Path(args.hypothesis) if args.hypothesis else HYPOTHESIS)
    print("\n".join(summary(validity)))
    print(f"written: {out}/validity.md, validity.csv, validity.png")
    return 0


def writable_folder(out: Path) -> None:
    """A UsageError naming what is wrong when `out` is a file or cannot be created or written; the
    folders made to find out are removed again, so nothing is left behind."""
    created = []
    try:
        for folder in [*reversed(out.parents), out]:
            if folder.exists() and not folder.is_dir():
                where = "" if folder == out else f": {folder}"
                raise UsageError(f"--out {out}{where} is a file; give a folder, new or existing")
            if not folder.is_dir():
                folder.mkdir()
                created.append(folder)
        if not os.access(out, os.W_OK | os.X_OK):
            raise UsageError(f"--out {out} is not writable; give a folder you may write to")
    except OSError as e:
        raise UsageError(f"--out {out}: cannot create {e.filename or out} ({e.strerror}); give a folder you may "
                         f"write to, new or existing") from None
    finally:
        for folder in reversed(created):
            folder.rmdir()
