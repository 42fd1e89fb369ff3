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

from .errors import UsageError, check_int
from .registry import BACKBONES, get_task, task_names
from .task import MAX_TRAIN_SEED, level_key

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


VARIANT_KEYS = ("levels", "train_at", "train")


def plan_task(task_name: str, profile: dict, overrides: Overrides) -> list[Cell]:
    """Cells of one task. A profile section may list `variants`: tables of task
    options that may also override the section's `levels`, `train_at` and `train`."""
    section = profile.get("tasks", {}).get(task_name)
    if section is None:
        raise UsageError(f"task {task_name!r} is not in this profile; it has: {', '.join(profile.get('tasks', {}))}")
    get_task(task_name)  # an unknown task fails here, before its settings are read
    models = _model_entries(section["models"] if overrides.models is None else overrides.models)
    size = dict(section.get("model", {}))
    for key in MODEL_SIZE_KEYS:
        size[key] = check_int(key, size.get(key))
    for name, _, options in models:
        check_model(name, {**size, **options})

    cells = []
    for variant in section.get("variants", [{}]):
        task_options = {k: v for k, v in variant.items() if k not in VARIANT_KEYS}
        try:
            task = get_task(task_name, **task_options)
        except TypeError as e:
            raise UsageError(f"task {task_name!r}: {e}") from None
        merged = {
            "train": {**profile.get("train", {}), **section.get("train", {}), **variant.get("train", {})},
            "levels": {**section.get("levels", {}), **variant.get("levels", {})},
            "train_at": {**section.get("train_at", {}), **variant.get("train_at", {})},
        }
        train, seeds = _train_settings(merged["train"], overrides)
        eval_levels, train_levels = _levels(task, merged["levels"], merged["train_at"], overrides)
        name = _variant_name(task_name, task.options())
        for (model, label, options), level, seed in itertools.product(models, train_levels, seeds):
            cells.append(Cell(
                task=task_name, task_options=task.options(), variant=name,
                train_level=level, eval_levels=eval_levels,
                model=model, label=label, model_options={**size, **options},
                seed=seed, train=dict(train),
            ))
    return cells


def _train_settings(train: dict, overrides: Overrides) -> tuple[dict, list[int]]:
    missing = [k for k in TRAIN_KEYS if k not in train]
    if missing:
        raise UsageError(f"profile lacks training settings {missing}")
    if overrides.steps is not None:
        train["steps"] = overrides.steps
    if overrides.batch_size is not None:
        train["batch_size"] = overrides.batch_size
    for key in ("steps", "batch_size", "log_every", "eval_size"):
        train[key] = check_int(key, train[key])
    seeds = overrides.seeds if overrides.seeds is not None else train.get("seeds", [0])
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < MAX_TRAIN_SEED:
            raise UsageError(f"seed must be an integer in [0, {MAX_TRAIN_SEED}), got {seed!r}")
    return {k: train[k] for k in TRAIN_KEYS}, list(seeds)


def _levels(task, levels: dict, train_at: dict, overrides: Overrides) -> tuple[tuple, list]:
    """(evaluation levels: the grid of `levels`, training levels: `train_at` on its axes, the grid elsewhere)."""
    levels, train_at = dict(levels), dict(train_at)
    for axis, values in overrides.levels.items():
        if axis not in task.axes:
            raise UsageError(f"task {task.name!r} has no axis {axis!r}; its axes: {', '.join(task.axes) or 'none'}")
        levels[axis] = values
        train_at.pop(axis, None)  # an axis the user sets is trained at each of its values
    if overrides.train_at == "each":
        train_at = {}
    elif overrides.train_at:
        train_at.update({a: v for a, v in overrides.train_at.items()})
    if set(levels) != set(task.axes):
        raise UsageError(f"profile levels for {task.name!r} must cover axes {list(task.axes)}, got {sorted(levels)}")
    for axis in train_at:
        if axis not in task.axes:
            raise UsageError(f"train_at names {axis!r}, not an axis of {task.name!r} ({', '.join(task.axes) or 'none'})")
    eval_levels = tuple(
        task.validate_level(dict(zip(task.axes, combo)))
        for combo in itertools.product(*(levels[a] for a in task.axes))
    )
    train_values = [[train_at[a]] if a in train_at else levels[a] for a in task.axes]
    train_levels = [task.validate_level(dict(zip(task.axes, combo))) for combo in itertools.product(*train_values)]
    return eval_levels, train_levels


def check_model(name: str, model_options: dict) -> None:
    """Build the backbone once so a bad name or option fails before anything runs."""
    factory = BACKBONES.get(name)  # an unknown name fails here with the list of known ones
    try:
        factory(**model_options)
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
