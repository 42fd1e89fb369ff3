"""The `tmem-bench` command: its parser, and each subcommand handed to the module that runs it."""
from __future__ import annotations

import argparse
import sys
import traceback

from ..errors import UsageError, positive, storage_error
from ..harness.executors import add_flags
from ..registry import module_names
from ..version import __version__
from .args import DEVICES
from .catalogue import cmd_check, cmd_list
from .leaderboard import add_leaderboard_parser, cmd_leaderboard
from .probe import add_probe_parser, cmd_probe
from .run import cmd_jobs, cmd_report, cmd_run
from .validity import add_validity_parser, cmd_validity


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line, exit 2, no usage dump: the same shape as every other bad-input error.
        print(f"tmem-bench: error: {message}", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tmem-bench", description="Diagnostic toy tasks for memory in sequence models.")
    parser.add_argument("--debug", action="store_true", help="on an error, also print the full traceback")
    parser.add_argument("-V", "--version", action="version", version=f"tmem-bench {__version__}")
    # Also accepted after the subcommand; SUPPRESS keeps a subcommand from resetting it to False.
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", parents=[debug],
                         help="train and evaluate every cell of a task (or 'all') under a profile")
    run.add_argument("task", help="a task name (see `tmem-bench list`) or 'all'")
    run.add_argument("--profile", default="quick", help="profile name or path to a TOML file (default: quick)")
    run.add_argument("--models", help="comma-separated model names, module:attribute or labels of the profile's model tables (which keep their options), replacing the profile's lists")
    run.add_argument("--level", action="append", default=[], metavar="AXIS=V1,V2",
                     help="levels of a sweep axis (repeatable); a model is then trained at each of them")
    run.add_argument("--train-at", metavar="each|AXIS=V", help="train one model per level ('each') or at one level")
    run.add_argument("--seeds", metavar="N", help="a count of seeds: N runs seeds 0 to N-1")
    run.add_argument("--seed-list", metavar="S1,S2,...", help="the seeds themselves, e.g. 3,4 or 5 (instead of --seeds)")
    run.add_argument("--steps", type=positive, help="training steps per cell")
    run.add_argument("--batch-size", type=positive, help="training batch size")
    run.add_argument("--selection-only", action="store_true",
                     help="train only the learning-rate trials and second selection seeds, write selection.json, stop")
    run.add_argument("--device", default="auto", choices=DEVICES, help="auto picks CUDA when available")
    run.add_argument("--tf32", action="store_true",
                     help="CUDA: matrix products in TF32 (faster, less precise; recorded in each cell, so its "
                          "numbers are not compared with float32 ones as the same cell)")
    run.add_argument("--out", help="run directory (default runs/TASK-PROFILE); rerunning resumes it")
    run.add_argument("--no-report", action="store_true", help="skip writing report.md and figures/ at the end")
    run.add_argument("--append", action="store_true",
                     help="add this plan's cells to a run directory that holds a different plan")
    run.add_argument("--keep-weightless", action="store_true",
                     help="keep finished cells whose weights file is absent (a run committed without its "
                          "*.safetensors, cloned) instead of training them again")
    run.add_argument("--dry-run", action="store_true",
                     help="print the plan and an estimate of its wall time on this machine and executor, from a "
                          "few training steps per shape measured once per machine and kept in the user's cache; "
                          "nothing is trained")
    add_flags(run)  # --executor and the flags each engine declares
    run.add_argument("--retries", type=int, default=1, metavar="N",
                     help="tries after a cell's first failure before it is recorded in failed/ (default 1)")

    jobs = sub.add_parser("jobs", parents=[debug], help="the jobs running a run's cells; --cancel stops them")
    jobs.add_argument("run_dir", metavar="RUN_DIR", help="a run directory started with --executor slurm (or any)")
    jobs.add_argument("--cancel", action="store_true", help="cancel the run's jobs still queued or running")

    rep = sub.add_parser("report", parents=[debug],
                         help="write report.md and figures/ of a run from its stored cell results")
    rep.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (holds manifest.json and cells/)")

    lst = sub.add_parser("list", help="tasks with their sweep axes and levels, models, profiles")
    lst.add_argument("--params", action="store_true", help="also print each model's parameter count per task")

    chk = sub.add_parser("check", parents=[debug],
                         help="conformance checks a backbone (or with --task, a task) must pass "
                              "(exit 0: all pass, 1: one fails)")
    chk.add_argument("model", metavar="MODEL", nargs="?", help="a registered model name or module:attribute")
    chk.add_argument("--task", metavar="TASK",
                     help="check this task (a registered name or module:attribute) instead of a model")
    chk.add_argument("--d-model", type=positive, default=16, help="model width the checks build (default 16)")
    chk.add_argument("--n-layers", type=positive, default=2, help="layers (default 2)")
    chk.add_argument("--n-heads", type=positive, default=2, help="heads (default 2)")
    chk.add_argument("--seq-len", type=positive, default=16, help="sequence length fed to the model (default 16)")
    chk.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                     help="an option passed to the model's factory (repeatable), e.g. --option kernel=eager; "
                          "with --task, to every variant of the task, e.g. --option n_frames=4")

    add_leaderboard_parser(sub, debug, _Parser)
    add_probe_parser(sub, debug)
    add_validity_parser(sub, debug)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        commands = {"run": cmd_run, "list": cmd_list, "report": cmd_report, "check": cmd_check,
                    "leaderboard": cmd_leaderboard, "jobs": cmd_jobs, "probe": cmd_probe,
                    "validity": cmd_validity}
        # A user's own commands may name their own modules; the leaderboard's names come from
        # entries, and it trusts them only under --allow-module-names.
        with module_names(args.command != "leaderboard"):
            return commands[args.command](args)
    except UsageError as e:
        if args.debug:
            traceback.print_exception(e)
        print(f"tmem-bench: error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        message = storage_error(e)
        if message is None:
            raise
        if args.debug:
            traceback.print_exception(e)
        print(f"tmem-bench: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tmem-bench: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
