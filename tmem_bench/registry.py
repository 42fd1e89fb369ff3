"""Tasks and backbones by name.

Built-ins are listed in one catalogue below as `module:attribute` and imported
only when first asked for, so no implementation imports this module and this
module imports none of them up front. External entries are named
`module:attribute` (on the command line or in a profile) or published under the
`tmem_bench.tasks` and `tmem_bench.models` entry-point groups: tasks and models alike.
Importing a module runs its code, so `module:attribute` names are refused unless a
caller trusts them with `module_names(True)`: the CLI does for the commands a user
types (their own command line, profile and run directories), the leaderboard only
under `--allow-module-names`, and nothing else does, so a name that comes from
someone else (a leaderboard entry) reaches no import by any other path.
"""
from __future__ import annotations

import contextlib
import contextvars
import importlib
import importlib.util
import inspect
from importlib import metadata
from typing import Callable

from .errors import UsageError

# In the order reports show them; plug-in tasks follow in name order.
BUILTIN_TASKS = {
    "coordinate_binding": "tmem_bench.tasks.coordinate_binding:CoordinateBinding",
    "occlusion": "tmem_bench.tasks.occlusion:Occlusion",
    "map_building": "tmem_bench.tasks.map_building:MapBuilding",
    "no_harm": "tmem_bench.tasks.no_harm:NoHarm",
}
# Built-in tasks that need an optional extra: registered only where its package can be imported, so
# that everything that goes over every task (the tests, `check --task`) runs without it;
# `tmem-bench list` names them with the command that adds them. extra -> (package, tasks).
OPTIONAL_TASKS = {
    "popgym": ("popgym", {
        "popgym_repeat_first": "tmem_bench.tasks.popgym:RepeatFirst",
        "popgym_repeat_previous": "tmem_bench.tasks.popgym:RepeatPrevious",
        "popgym_autoencode": "tmem_bench.tasks.popgym:Autoencode",
        "popgym_count_recall": "tmem_bench.tasks.popgym:CountRecall",
    }),
}
BUILTIN_MODELS = {
    "base": "tmem_bench.baselines.transformer:base",
    "local": "tmem_bench.baselines.transformer:local",
    "base_wide": "tmem_bench.baselines.wide:base_wide",
    "linear": "tmem_bench.baselines.linear:linear",
    "lstm": "tmem_bench.baselines.lstm:lstm",
    "gru": "tmem_bench.baselines.lstm:gru",
    "delta": "tmem_bench.baselines.delta:delta",
    "ssm": "tmem_bench.baselines.ssm:ssm",
    "registers": "tmem_bench.baselines.registers:registers",
    "slots": "tmem_bench.baselines.slots:slots",
    "xl": "tmem_bench.baselines.xl:xl",
    "tensor": "tmem_bench.tensor_memory:tensor",
    "tensor_local": "tmem_bench.tensor_memory:tensor_local",
}


def load_attribute(spec: str, kind: str) -> Callable:
    """The object named by `module:attribute`, or a UsageError saying why it cannot be loaded."""
    module, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise UsageError(f"cannot load {kind} {spec!r}: {e}") from e
    except Exception as e:  # the module's own code failed on import; `--debug` shows where
        raise UsageError(f"cannot load {kind} {spec!r}: importing {module} raised {type(e).__name__}: {e}") from e


_MODULE_NAMES = contextvars.ContextVar("module_names", default=False)


@contextlib.contextmanager
def module_names(allowed: bool):
    """While inside, `module:attribute` names are imported only when `allowed`; registered
    built-ins and installed entry points always are."""
    token = _MODULE_NAMES.set(allowed)
    try:
        yield
    finally:
        _MODULE_NAMES.reset(token)


def module_names_allowed() -> bool:
    """Whether `module:attribute` names are imported here; a job carries it to the process that runs it."""
    return _MODULE_NAMES.get()


class Registry:
    def __init__(self, kind: str, builtins: dict[str, str], entry_point_group: str | None = None,
                 optional: dict[str, tuple[str, dict[str, str]]] | None = None):
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._specs = dict(builtins)  # name -> "module:attribute", imported on first use
        self._entry_points: dict[str, metadata.EntryPoint] | None = None
        self.missing_extras: dict[str, list[str]] = {}  # extra -> names it would add, where not installed
        self._packages: dict[str, str] = {}  # extra -> the package it installs
        for extra, (package, specs) in (optional or {}).items():
            self._packages[extra] = package
            if importlib.util.find_spec(package) is not None:
                self._specs.update(specs)
            else:
                self.missing_extras[extra] = list(specs)

    def _plugins(self) -> dict[str, metadata.EntryPoint]:
        if self._entry_points is None:
            found = metadata.entry_points(group=self.entry_point_group) if self.entry_point_group else ()
            self._entry_points = {ep.name: ep for ep in found if ep.name not in self._specs}
        return self._entry_points

    def names(self) -> list[str]:
        return sorted([*self._specs, *self._plugins()])

    def plugin_names(self) -> list[str]:
        return sorted(self._plugins())

    def get(self, name: str) -> Callable:
        if name in self._specs:
            return load_attribute(self._specs[name], self.kind)
        if name in self._plugins():
            point = self._plugins()[name]
            try:
                return point.load()
            except Exception as e:  # one broken plug-in must not break every command; `--debug` shows where
                raise UsageError(f"cannot load {self.kind} {name!r} (entry point {point.value}): "
                                 f"{type(e).__name__}: {e}") from e
        if ":" in name and _MODULE_NAMES.get():
            return load_attribute(name, self.kind)
        extra = self.extra_of(name)
        if extra is not None:
            raise UsageError(f"{self.kind} {name!r} needs the {extra} extra: pip install -e \".[{extra}]\" "
                             f"(from a clone) or pip install {self._packages[extra]}")
        raise UsageError(self.unknown(name))

    def extra_of(self, name) -> str | None:
        """The optional extra, not installed here, that would add `name`; None for any other name."""
        return next((extra for extra, names in self.missing_extras.items() if name in names), None)

    def unknown(self, name: str) -> str:
        """Why `name` names nothing here, and what it may name."""
        if ":" in name and not _MODULE_NAMES.get():
            return (f"{self.kind} {name!r} is neither built in nor an installed entry point, and module:attribute "
                    f"names are not imported here (importing runs the module's code); known: {', '.join(self.names())}")
        return f"unknown {self.kind} {name!r}; known: {', '.join(self.names())} (or module:attribute)"

    def declared(self, name: str) -> list[str] | None:
        """The option names the factory of `name` declares, read from its signature without calling
        it; None when it takes **options (it refuses unknown ones itself) or has no signature."""
        factory = self.get(name)
        try:
            params = inspect.signature(factory).parameters.values()
        except (TypeError, ValueError):
            return None
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return None
        return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]

    def __contains__(self, name: str) -> bool:
        return name in self._specs or name in self._plugins()


TASKS = Registry("task", BUILTIN_TASKS, entry_point_group="tmem_bench.tasks", optional=OPTIONAL_TASKS)
BACKBONES = Registry("model", BUILTIN_MODELS, entry_point_group="tmem_bench.models")


_MADE: dict[tuple, tuple] = {}  # (name, options) -> (factory, task)


def get_task(name: str, **options):
    """Task `name` made with `options`, once per process: a task keeps nothing that training changes,
    so every cell with the same options shares it. The name is looked up again on every call, so a
    `module:attribute` task made where such names were trusted is still refused where they are not."""
    factory = TASKS.get(name)
    key = (name, repr(sorted(options.items())))
    if key not in _MADE or _MADE[key][0] is not factory:
        try:
            _MADE[key] = factory, factory(**options)
        except (TypeError, UsageError):  # an option the task refuses: its caller names the option
            raise
        except Exception as e:  # the task's own code failed; `--debug` shows where
            raise UsageError(f"task {name!r}: its constructor raised {type(e).__name__}: {e}") from e
    return _MADE[key][1]


def get_backbone(name: str, d_model: int, n_layers: int, n_heads: int, **options):
    return BACKBONES.get(name)(d_model=d_model, n_layers=n_layers, n_heads=n_heads, **options)


def task_names() -> list[str]:
    return TASKS.names()


def backbone_names() -> list[str]:
    return BACKBONES.names()


def variant_forces_memory(task: str, variant: str, options: dict) -> bool:
    """Whether a cell's variant (its task's name, the variant's name and its options, as the cell
    records them) is memory-forcing, as its registered task declares (`Task.forces_memory`): what
    the report, the validity table and the board all ask. The standard variant, the task's defaults,
    never is (`tmem-bench check --task` holds a task to it), so it loads no task; a task that cannot
    be loaded here (a plug-in not installed, an extra missing) is read as standard."""
    if variant == "standard":
        return False
    try:
        return TASKS.get(task).forces_memory(options)
    except UsageError:
        return False
