"""The first board preview on a fresh machine, timed: `tmem-bench leaderboard build --with RUN` on a
copy of the board with an empty cache folder (cold: no validation record, no weights fetched),
then once more with the cache it left (warm). Each is a fresh process, as a user's command is, so
the times include Python's start and the imports.

    python benchmarks/preview_cold.py                        # trains a tiny run first (seconds)
    python benchmarks/preview_cold.py --run runs/kv          # or previews a finished run of yours
    python benchmarks/preview_cold.py --full                 # the whole board re-evaluated (minutes)

Nothing is written into the board, the run or the user's cache: everything goes to a temporary
folder, removed at the end. OMP_NUM_THREADS is kept as given (1 on a shared machine).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "tmem_bench.cli"]
TINY_RUN = ["run", "coordinate_binding", "--models", "base", "--seeds", "1", "--steps", "20", "--no-report"]


def timed(args: list[str], env: dict, cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(CLI + args, capture_output=True, text=True, env=env, cwd=cwd)
    return time.perf_counter() - start, proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--board", type=Path, default=ROOT / "leaderboard", help="the board to copy (default: the clone's)")
    ap.add_argument("--run", type=Path, help="a finished run to preview (default: train a tiny one, 20 steps)")
    ap.add_argument("--full", action="store_true", help="time build --with --full: every published cell re-evaluated")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="preview-cold-") as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "TMEM_BENCH_CACHE": str(tmp / "cache"), "COLUMNS": "80"}
        board = tmp / "leaderboard"
        shutil.copytree(args.board, board)
        run = args.run
        if run is None:
            run = tmp / "run"
            seconds, proc = timed([*TINY_RUN, "--out", str(run)], env, tmp)
            if proc.returncode:
                sys.exit(f"preview_cold: the tiny run failed: {proc.stderr.strip().splitlines()[-1:]}")
            print(f"tiny run ({' '.join(TINY_RUN)}): {seconds:.1f} s")
        command = ["leaderboard", "build", "--leaderboard", str(board), "--with", str(run.resolve()),
                   "--out", str(tmp / "preview"), *(["--full"] if args.full else [])]
        print(f"command: tmem-bench {' '.join(command)}  (TMEM_BENCH_CACHE={env['TMEM_BENCH_CACHE']})")
        for state in ("cold", "warm"):
            seconds, proc = timed(command, env, tmp)
            if proc.returncode not in (0, 1):
                sys.exit(f"preview_cold: the {state} preview failed: {proc.stderr.strip().splitlines()[-1:]}")
            print(f"{state}: {seconds:.1f} s (exit {proc.returncode}); {proc.stdout.strip().splitlines()[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
