"""Profiles (TOML) plus command-line overrides -> a validated list of Cells.

A Cell is everything one training run depends on; its id is a hash of exactly
those settings, so a finished cell is recognised when a run is started again.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import tomllib
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path

from .errors import UsageError
from .registry import get_backbone, get_task, task_names
from .tasks.base import MAX_TRAIN_SEED, level_key

TRAIN_KEYS = ("steps", "batch_size", "lr", "weight_decay", "grad_clip", "log_every", "eval_size")
MODEL_SIZE_KEYS = ("d_model", "n_layers", "n_heads")


@dataclass(frozen=True)
class Cell:
    task: str
    task_options: dict
    variant: str
    train_level: dict
    eval_levels: tuple
    model: str
    label: str
    model_options: dict
    seed: int
    train: dict

    @property
    def id(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True, default=list)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def describe(self) -> str:
        variant = "" if self.variant == "standard" else f" [{self.variant}]"
        return f"{self.task}{variant} {self.label} @ {level_key(self.train_level)} seed {self.seed}"


@dataclass
class Overrides:
    models: list[str] | None = None
    levels: dict[str, list] = field(default_factory=dict)
    train_at: dict | str | None = None  # "each" trains one model per level
    seeds: list[int] | None = None
    steps: int | None = None
    batch_size: int | None = None


def profile_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("tmem_bench.profiles").iterdir() if p.name.endswith(".toml"))


def load_profile(name: str) -> dict:
    """A built-in profile by name, or a path to a TOML file."""
    if name.endswith(".toml"):
        path = Path(name)
        if not path.is_file():
            raise UsageError(f"profile file {name!r} does not exist")
        text = path.read_text()
    elif name in profile_names():
        text = resources.files("tmem_bench.profiles").joinpath(f"{name}.toml").read_text()
    else:
        raise UsageError(f"unknown profile {name!r}; known: {', '.join(profile_names())} (or a path to a .toml file)")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"profile {name!r} is not valid TOML: {e}") from None


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{name} must be a positive integer, got {value!r}")
    return value


def _model_entries(entries: list) -> list[tuple[str, str, dict]]:
    """Profile model entries ("name" or {name, label, **options}) -> (name, label, options)."""
    out = []
    for entry in entries:
        if isinstance(entry, str):
            out.append((entry, entry, {}))
        elif isinstance(entry, dict) and "name" in entry:
            options = {k: v for k, v in entry.items() if k not in ("name", "label")}
            out.append((entry["name"], entry.get("label", entry["name"]), options))
        else:
            raise UsageError(f"model entry {entry!r} must be a name or a table with a 'name'")
    labels = [label for _, label, _ in out]
    if len(set(labels)) != len(labels):
        raise UsageError(f"model labels must be unique, got {labels}")
    return out


def _variant_name(task_name: str, options: dict) -> str:
    defaults = get_task(task_name).options()
    changed = {k: v for k, v in options.items() if defaults.get(k) != v}
    return ",".join(f"{k}={v}" for k, v in sorted(changed.items())) or "standard"


def plan_task(task_name: str, profile: dict, overrides: Overrides) -> list[Cell]:
    section = profile.get("tasks", {}).get(task_name)
    if section is None:
        raise UsageError(f"task {task_name!r} is not in this profile; it has: {', '.join(profile.get('tasks', {}))}")
    train = {**profile.get("train", {}), **section.get("train", {})}
    missing = [k for k in TRAIN_KEYS if k not in train]
    if missing:
        raise UsageError(f"profile lacks training settings {missing}")
    if overrides.steps is not None:
        train["steps"] = overrides.steps
    if overrides.batch_size is not None:
        train["batch_size"] = overrides.batch_size
    for key in ("steps", "batch_size", "log_every", "eval_size"):
        _positive_int(key, train[key])
    seeds = overrides.seeds if overrides.seeds is not None else train.pop("seeds", [0])
    train.pop("seeds", None)
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < MAX_TRAIN_SEED:
            raise UsageError(f"seed must be an integer in [0, {MAX_TRAIN_SEED}), got {seed!r}")
    train = {k: train[k] for k in TRAIN_KEYS}

    variants = section.get("variants", [{}])
    task = get_task(task_name)  # validates the name even when the profile has no variants
    levels = dict(section.get("levels", {}))
    train_at = dict(section.get("train_at", {}))
    for axis, values in overrides.levels.items():
        if axis not in task.axes:
            raise UsageError(f"task {task_name!r} has no axis {axis!r}; its axes: {', '.join(task.axes) or 'none'}")
        levels[axis] = values
        train_at.pop(axis, None)  # an axis the user sets is trained at each of its values
    if overrides.train_at == "each":
        train_at = {}
    elif overrides.train_at:
        train_at.update(overrides.train_at)
    if set(levels) != set(task.axes):
        raise UsageError(f"profile levels for {task_name!r} must cover axes {list(task.axes)}, got {sorted(levels)}")
    for axis in train_at:
        if axis not in task.axes:
            raise UsageError(f"train_at names {axis!r}, not an axis of {task_name!r} ({', '.join(task.axes) or 'none'})")

    eval_levels = tuple(
        task.validate_level(dict(zip(task.axes, combo)))
        for combo in itertools.product(*(levels[a] for a in task.axes))
    )
    train_values = [[train_at[a]] if a in train_at else levels[a] for a in task.axes]
    train_levels = [task.validate_level(dict(zip(task.axes, combo))) for combo in itertools.product(*train_values)]

    size = {k: v for k, v in section.get("model", {}).items()}
    for key in MODEL_SIZE_KEYS:
        _positive_int(key, size.get(key))
    models = _model_entries(section["models"] if overrides.models is None else overrides.models)

    cells = []
    for task_options in variants:
        task = get_task(task_name, **task_options)
        variant = _variant_name(task_name, task.options())
        for (name, label, options), level, seed in itertools.product(models, train_levels, seeds):
            model_options = {**size, **options}
            cells.append(Cell(
                task=task_name, task_options=task.options(), variant=variant,
                train_level=level, eval_levels=eval_levels,
                model=name, label=label, model_options=model_options,
                seed=seed, train=dict(train),
            ))
    for name, label, options in models:
        check_model(name, {**size, **options})
    return cells


def check_model(name: str, model_options: dict) -> None:
    """Build the backbone once so a bad name or option fails before anything runs."""
    try:
        get_backbone(name, **model_options)
    except UsageError:
        raise
    except (TypeError, ValueError) as e:
        raise UsageError(f"model {name!r}: {e}") from None


def make_plan(task: str, profile_name: str, overrides: Overrides | None = None) -> list[Cell]:
    overrides = overrides or Overrides()
    profile = load_profile(profile_name)
    known = task_names()
    if task == "all":
        names = [t for t in profile.get("tasks", {}) if t in known]
    elif task in known:
        names = [task]
    else:
        raise UsageError(f"unknown task {task!r}; known: {', '.join(known)}, all")
    return [cell for name in names for cell in plan_task(name, profile, overrides)]


def cell_from_dict(d: dict) -> Cell:
    return replace(Cell(**d), eval_levels=tuple(d["eval_levels"]))
