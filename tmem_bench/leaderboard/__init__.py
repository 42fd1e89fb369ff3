"""Publish and compare: leaderboard entries made from runs, validated from their own cells, and the board.

Modules: entry (every field of an entry recomputed from cells), submit (entries
from a run, written into the board all or nothing), validate (trust nothing
claimed), board (README.md and the data of the page), page (the self-contained
index.html). The `leaderboard` subcommands are in tmem_bench/cli/leaderboard.py,
so that the command line loads none of this until asked.
"""
from .board import board_data, build, preview, preview_entries, preview_folder
from .entry import RANKED_MIN_SEEDS
from .folder import held
from .submit import make_entries, submit
from .validate import Validation, validate

__all__ = ["RANKED_MIN_SEEDS", "Validation", "board_data", "build", "held", "make_entries", "preview",
           "preview_entries", "preview_folder", "submit", "validate"]
