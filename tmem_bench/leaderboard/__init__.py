"""Publish and compare: leaderboard entries made from runs, validated from their own cells, and the board.

Modules: entry (every field of an entry recomputed from cells), submit (entries
from a run, written into the board all or nothing), validate (trust nothing
claimed), refresh (an entry's derived numbers rebuilt from its cells under the
suite's current rules), board (README.md and the data of the page), page (the self-contained
index.html), preview (a run beside the board), guard (what of an entry may be read), weights and fetch (weights by
hash). The `leaderboard` subcommands are in tmem_bench/cli/leaderboard.py, so that
the command line loads none of this until asked; the names below load their module
on first use, so that `leaderboard fetch` (guard, weights) never imports torch.
"""
import sys
import types
from importlib import import_module

_WHERE = {"board_data": "board", "build": "board", "preview": "preview", "preview_entries": "preview",
          "preview_folder": "preview", "RANKED_MIN_SEEDS": "entry", "held": "folder", "make_entries": "submit",
          "submit": "submit", "refresh": "refresh", "Validation": "validate", "validate": "validate"}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_WHERE[name]}", __name__), name)


class _Package(types.ModuleType):
    """`submit`, `refresh` and `validate` name both a module and its function; importing the module sets
    the package's attribute to the module, so that attribute is never set here and the function is
    what the package gives, as when this file imported them all up front."""

    def __setattr__(self, name, value):
        if name in _WHERE and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
