"""Name -> factory registries for tasks and backbones.

External entries are named `module:attribute` (on the command line or in a
profile) or published under the `tmem_bench.models` entry-point group.
"""
from __future__ import annotations

import importlib
from importlib import metadata
from typing import Callable

from .errors import UsageError


class Registry:
    def __init__(self, kind: str, entry_point_group: str | None = None):
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._entries: dict[str, Callable] = {}
        self._loaded_entry_points = False

    def register(self, name: str):
        def decorator(fn):
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = fn
            return fn

        return decorator

    def _load_entry_points(self):
        if self._loaded_entry_points or self.entry_point_group is None:
            return
        self._loaded_entry_points = True
        for ep in metadata.entry_points(group=self.entry_point_group):
            if ep.name not in self._entries:
                self._entries[ep.name] = ep.load()

    def names(self) -> list[str]:
        self._load_entry_points()
        return sorted(self._entries)

    def get(self, name: str) -> Callable:
        self._load_entry_points()
        if name in self._entries:
            return self._entries[name]
        if ":" in name:
            module, _, attr = name.partition(":")
            try:
                return getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as e:
                raise UsageError(f"cannot load {self.kind} {name!r}: {e}") from None
        raise UsageError(
            f"unknown {self.kind} {name!r}; known: {', '.join(self.names())} (or module:attribute)"
        )

    def __contains__(self, name: str) -> bool:
        self._load_entry_points()
        return name in self._entries


TASKS = Registry("task")
BACKBONES = Registry("model", entry_point_group="tmem_bench.models")


def _load_builtins():
    # Importing the packages runs their @register decorators.
    from . import tasks, baselines, tensor_memory  # noqa: F401


def get_task(name: str, **options):
    _load_builtins()
    return TASKS.get(name)(**options)


def get_backbone(name: str, d_model: int, n_layers: int, n_heads: int, **options):
    _load_builtins()
    return BACKBONES.get(name)(d_model=d_model, n_layers=n_layers, n_heads=n_heads, **options)


def task_names() -> list[str]:
    _load_builtins()
    return TASKS.names()


def backbone_names() -> list[str]:
    _load_builtins()
    return BACKBONES.names()
