"""Profiles (TOML) plus command-line overrides -> a validated list of Cells.

A Cell is everything one training run depends on; its id is a hash of exactly
those settings, so a finished cell is recognised when a run is started again.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import json
from dataclasses import asdict, dataclass, field, replace

from ..contracts.task import MAX_TRAIN_SEED, SEED_BITS, level_key
from ..diagnostics.convergence import load_early_stop
from ..errors import UsageError, check_int
from ..levels import describe_cell
from ..registry import TASKS, get_task, task_names
from .plan_checks import check_model
from .profiles import entry_labels, load_profile, needs_extra, profile_names

TRAIN_KEYS = ("steps", "batch_size", "lr", "weight_decay", "grad_clip", "log_every", "eval_size")
# Settings beside those every cell records: seeds, early stopping and training over a mix of levels
# (each recorded only where it is on, so a run without them keeps the cell ids it always had) and a
# second selection seed (a search's, not a cell's).
SETTING_KEYS = (*TRAIN_KEYS, "seeds", "early_stop", "mixed_levels", "selection_second_seed")
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
        return describe_cell(self.task, self.variant, self.label, level_key(self.train_level), self.seed)

    def task_object(self):
        """The cell's task, made with its options (made once per process: registry.get_task)."""
        return get_task(self.task, **self.task_options)


@dataclass(frozen=True)
class LRSearch:
    """One (task, variant, training level, model) whose learning rate is chosen on validation data:
    the first seed is trained at every lr of the grid (the trials), the others at the chosen lr.
    With a `second_seed`, the best two lrs, where they are within the selection margin, are
    trained at it too and chosen between on the mean (selection.py); it is the first remaining
    seed, so at the lr chosen that cell is also a final one."""
    trials: tuple[Cell, ...]
    seeds: tuple[int, ...]
    second_seed: int | None = None

    @property
    def grid(self) -> tuple[float, ...]:
        return tuple(c.train["lr"] for c in self.trials)

    def finals(self, lr: float) -> list[Cell]:
        """The remaining seeds at `lr`, one of the grid's values."""
        return self.at_seeds(lr, self.seeds)

    def at_seeds(self, lr: float, seeds) -> list[Cell]:
        trial = next(c for c in self.trials if c.train["lr"] == lr)
        return [replace(trial, seed=seed) for seed in seeds]

    def second_trials(self, lrs) -> list[Cell]:
        """The second selection seed at each of `lrs`."""
        return [cell for lr in lrs for cell in self.at_seeds(lr, [self.second_seed])]

    def cells_after(self, record: dict) -> list[Cell]:
        """The cells a selection record (selection.choose) trains beyond the trials: the second
        seed at the lrs it needed it at, then, once an lr is chosen, the remaining seeds there."""
        second = self.second_trials(record.get("second_seed_lrs") or [])
        rest = self.finals(record["chosen_lr"]) if record["chosen_lr"] is not None else []
        return list({c.id: c for c in second + rest}.values())


@dataclass(frozen=True)
class Plan:
    """Cells known before anything is trained (fixed cells, and every search's trials) and the
    learning-rate searches whose remaining cells depend on the trials' validation accuracy."""
    cells: list[Cell]
    searches: list[LRSearch] = field(default_factory=list)

    def n_cells(self) -> int:
        return len(self.cells) + sum(len(s.seeds) for s in self.searches)


@dataclass
class Overrides:
    models: list[str] | None = None
    levels: dict[str, list] = field(default_factory=dict)
    train_at: dict | str | None = None  # "each" trains one model per level
    seeds: list[int] | None = None
    steps: int | None = None
    batch_size: int | None = None
    # Only the learning-rate searches' trials (and second selection seeds): no fixed cells, no
    # remaining seeds. None, not False, when unset: an override that is set changes a profile's id.
    selection_only: bool | None = None
    # The early-stopping rule to record in the cells, where it comes from cells already trained (a
    # board re-planning an entry made under an earlier rule); None: thresholds.toml's [early_stop].
    early_stop: dict | None = None
    # CUDA's matrix products in TF32 (--tf32); recorded in each cell, and so in its id, only when set.
    tf32: bool | None = None


def _listed_models(listed: list, names: list[str] | None, labels: set[str]) -> list:
    """A model list as the profile writes it, or as `--models` replaces it: a name that labels a
    model table of the profile picks that table from the lists that have it (and nothing from
    those that do not), so a variant keeps its options; any other name is a model, run in every list."""
    if names is None:
        return listed
    tables = {entry["label"]: entry for entry in listed if isinstance(entry, dict) and "label" in entry}
    return [tables[name] if name in labels else name for name in names if name not in labels or name in tables]


def _model_entries(entries: list) -> list[tuple[str, str, dict, dict]]:
    """Profile model entries ("name" or {name, label, train, **options}) -> (name, label, options,
    training settings of this model, e.g. the lr a selection chose for it)."""
    out = []
    for entry in entries:
        if isinstance(entry, str):
            out.append((entry, entry, {}, {}))
        elif isinstance(entry, dict) and "name" in entry:
            options = {k: v for k, v in entry.items() if k not in ("name", "label", "train")}
            out.append((entry["name"], entry.get("label", entry["name"]), options, entry.get("train", {})))
        else:
            raise UsageError(f"model entry {entry!r} must be a name or a table with a 'name'")
    labels = [label for _, label, _, _ in out]
    if len(set(labels)) != len(labels):
        raise UsageError(f"model labels must be unique, got {labels}")
    return out


def _variant_name(standard, task) -> str:
    """The options `task` changes from the `standard` one's, or "standard"."""
    defaults = standard.options()
    changed = {k: v for k, v in task.options().items() if defaults.get(k) != v}
    return ",".join(f"{k}={v}" for k, v in sorted(changed.items())) or "standard"


VARIANT_KEYS = ("levels", "train_at", "train", "models", "at", "variant")
# What a task its profile does not name is trained with: the suite's reference pair at the quick
# profile's size, at every level of the task's own grid, in every variant it names.
DEFAULT_SECTION = {"models": ["base", "tensor"], "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "dropout": 0.1}}


def task_section(task_name: str, standard, profile: dict) -> dict:
    """The profile's section of a task, or one made from the task's own levels and variants."""
    section = profile.get("tasks", {}).get(task_name)
    if section is not None:
        return section
    return {**DEFAULT_SECTION, "levels": {axis: list(values) for axis, values in standard.levels.items()},
            "variants": [dict(options) for options in standard.variants.values()]}


def variant_options(task_name: str, standard, variant: dict) -> dict:
    """A profile variant's task options: those of the task's variant it names, then its own."""
    options = {k: v for k, v in variant.items() if k not in VARIANT_KEYS}
    if "variant" not in variant:
        return options
    named = standard.variants
    if variant["variant"] not in named:
        raise UsageError(f"task {task_name!r} has no variant {variant['variant']!r}; it has: {', '.join(named)}")
    return {**named[variant["variant"]], **options}


def plan_task(task_name: str, profile: dict, overrides: Overrides) -> list[Cell]:
    """The cells of one task known before training (see plan_task_searches)."""
    return plan_task_searches(task_name, profile, overrides).cells


def plan_task_searches(task_name: str, profile: dict, overrides: Overrides) -> Plan:
    """Cells of one task. A profile section may list `variants`: tables of task
    options that may also override the section's `levels`, `train_at`, `train`,
    `models` and `at` (`--models` replaces every variant's list, see _listed_models). `at` is a list of
    tables, each naming values of some axes and training settings (steps, seeds, ...)
    for the training levels that have those values. A list of learning rates (`lr`)
    is a grid searched on validation data per model and training level."""
    standard = get_task(task_name)  # an unknown task fails here with the list of known ones
    section = task_section(task_name, standard, profile)
    size = dict(section.get("model", {}))
    for key in MODEL_SIZE_KEYS:
        size[key] = check_int(key, size.get(key))
    variants = section.get("variants", [{}])
    labels = entry_labels(profile)
    model_lists = [_model_entries(_listed_models(variant.get("models", section["models"]), overrides.models, labels))
                   for variant in variants]
    for name, _, options in {(n, label, json.dumps(o, sort_keys=True)): (n, label, o)
                             for models in model_lists for n, label, o, _ in models}.values():
        check_model(name, {**size, **options})

    variant_task_options = [variant_options(task_name, standard, variant) for variant in variants]
    cells, searches = [], []
    for variant, models, task_options in zip(variants, model_lists, variant_task_options):
        merged = {
            "train": {**profile.get("train", {}), **section.get("train", {}), **variant.get("train", {})},
            "levels": {**section.get("levels", {}), **variant.get("levels", {})},
            "train_at": {**section.get("train_at", {}), **variant.get("train_at", {})},
        }
        # What the variant asks for, as written (each model's settings at each training level), then checked.
        eval_grid, train_grid = _levels(standard, merged["levels"], merged["train_at"], overrides)
        at = variant.get("at", section.get("at", []))
        runs = []
        for entry, (i, level) in itertools.product(models, enumerate(train_grid)):
            settings = {**merged["train"]}
            for table in at:
                if all(level[axis] == value for axis, value in table.items() if axis in standard.axes):
                    settings.update({k: v for k, v in table.items() if k not in standard.axes})
            settings = {**settings, **entry[3]}
            runs.append((entry, i, settings, *_train_settings(settings, overrides)))
        task, eval_levels, train_levels = _checked(task_name, task_options, eval_grid, train_grid, runs)
        _at_entries(task, at, train_levels)
        name = _variant_name(standard, task)
        for (model, label, options, _), i, settings, train, seeds in runs:
            level = train_levels[i]

            def cell(lr, seed):
                return Cell(task=task_name, task_options=task.options(), variant=name,
                            train_level=level, eval_levels=eval_levels,
                            model=model, label=label, model_options={**size, **options},
                            seed=seed, train={**train, "lr": lr})
            grid = train["lr"]
            second = _second_seed(seeds) if len(grid) > 1 and settings.get("selection_second_seed") else None
            _check_seeds_apart(task, seeds + ([second] if second is not None else []), (level, *eval_levels))
            if len(grid) == 1:
                if not overrides.selection_only:
                    cells.extend(cell(grid[0], seed) for seed in seeds)
                continue
            search = LRSearch(trials=tuple(cell(lr, seeds[0]) for lr in grid),
                              seeds=() if overrides.selection_only else tuple(seeds[1:]), second_seed=second)
            cells.extend(search.trials)
            searches.append(search)
    return Plan(cells, searches)


def _second_seed(seeds: list[int]) -> int:
    """The second selection seed: the first of the remaining seeds (its cell at the chosen lr is a
    final one anyway), or, where there is none, the one after the selection seed."""
    if len(seeds) > 1:
        return seeds[1]
    if seeds[0] + 1 >= MAX_TRAIN_SEED:
        raise UsageError(f"seed {seeds[0]} leaves no second selection seed below {MAX_TRAIN_SEED}; "
                         "list a second seed, or drop selection_second_seed")
    return seeds[0] + 1


def _check_seeds_apart(task, seeds: list[int], levels) -> None:
    for level in levels:
        if task.eval_seed(level) % SEED_BITS in seeds:
            raise UsageError(f"seed {task.eval_seed(level) % SEED_BITS} would draw the evaluation set of "
                             f"{task.name} at {level_key(level)} as training data; choose another seed")


def _at_entries(task, entries: list[dict], train_levels: list[dict]) -> list[dict]:
    """`at` tables checked: each names only axes of the task and training settings, and matches
    at least one training level."""
    for entry in entries:
        axes = {k: v for k, v in entry.items() if k not in SETTING_KEYS}
        unknown = [k for k in axes if k not in task.axes]
        if unknown:
            raise UsageError(f"at {entry!r}: {unknown[0]!r} is neither an axis of {task.name!r} "
                             f"({', '.join(task.axes) or 'none'}) nor a training setting ({', '.join(SETTING_KEYS)})")
        if not any(all(level[a] == v for a, v in axes.items()) for level in train_levels):
            raise UsageError(f"at {entry!r} matches no training level of {task.name!r}; "
                             f"trained at: {'; '.join(level_key(lv) for lv in train_levels)}")
    return entries


def _checked(task_name: str, options: dict, eval_grid: list[dict], train_grid: list[dict], runs: list) -> tuple:
    """The task made with a variant's options checks, in one step, what the variant asks of it: its levels
    (their values cast to the task's types), each run's integer settings and its `mixed_levels = { axis =
    "n_writes", low = 1 }` (each batch drawn at a level of `axis` from `low` to the level trained at, the
    usual cure for training from scratch at many writes; validation stays at the level trained at)."""
    try:
        task = get_task(task_name, **options)
    except TypeError as e:
        raise UsageError(f"task {task_name!r}: {e}") from None
    eval_levels = tuple(task.validate_level(level) for level in eval_grid)
    train_levels = [task.validate_level(level) for level in train_grid]
    for _, i, settings, train, _ in runs:
        train.update({key: check_int(key, train[key]) for key in ("steps", "batch_size", "log_every", "eval_size")})
        spec = settings.get("mixed_levels")
        if spec is None:
            continue
        if not isinstance(spec, dict) or set(spec) != {"axis", "low"}:
            raise UsageError(f"mixed_levels must be a table {{ axis = AXIS, low = N }}, got {spec!r}")
        axis = spec["axis"]
        if axis not in task.axes:
            raise UsageError(f"mixed_levels: {task.name!r} has no axis {axis!r}; its axes: {', '.join(task.axes) or 'none'}")
        top = train_levels[i][axis]
        if isinstance(top, bool) or not isinstance(top, int):
            raise UsageError(f"mixed_levels: axis {axis!r} of {task.name!r} is not integer-valued (trained at {top!r})")
        low = check_int("mixed_levels low", spec["low"])
        if not 1 <= low <= top:
            raise UsageError(f"mixed_levels: low must be between 1 and the level trained at ({axis}={top}), got {low}")
        train["mixed_levels"] = {"axis": axis, "low": low}
    return task, eval_levels, train_levels


def _no_repeats(what: str, values) -> None:
    repeated = sorted({v for v in values if list(values).count(v) > 1})
    if repeated:
        raise UsageError(f"{what} list {', '.join(map(str, repeated))} more than once; each would train the same cell again")


def _train_settings(train: dict, overrides: Overrides) -> tuple[dict, list[int]]:
    missing = [k for k in TRAIN_KEYS if k not in train]
    if missing:
        raise UsageError(f"profile lacks training settings {missing}")
    if overrides.steps is not None:
        train["steps"] = overrides.steps
    if overrides.batch_size is not None:
        train["batch_size"] = overrides.batch_size
    grid = train["lr"] if isinstance(train["lr"], list) else [train["lr"]]
    _no_repeats("lr", grid)
    train["lr"] = grid
    seeds = overrides.seeds if overrides.seeds is not None else train.get("seeds", [0])
    _no_repeats("seeds", seeds)
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < MAX_TRAIN_SEED:
            raise UsageError(f"seed must be an integer in [0, {MAX_TRAIN_SEED}), got {seed!r}")
    recorded = {k: train[k] for k in TRAIN_KEYS}
    if train.get("early_stop"):
        # The rule travels with the cell (and so into its id): the cell stops where its own
        # settings say, whatever thresholds.toml says when it is read again.
        recorded["early_stop"] = overrides.early_stop or asdict(load_early_stop())
    if overrides.tf32:
        recorded["tf32"] = True
    return recorded, list(seeds)


def _levels(task, levels: dict, train_at: dict, overrides: Overrides) -> tuple[list, list]:
    """(evaluation levels: the grid of `levels`, training levels: `train_at` on its axes, the grid elsewhere)."""
    levels, train_at = dict(levels), dict(train_at)
    for axis, values in overrides.levels.items():
        _no_repeats(f"levels of {axis}", values)
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
    train_values = [[train_at[a]] if a in train_at else levels[a] for a in task.axes]
    return ([dict(zip(task.axes, combo)) for combo in itertools.product(*(levels[a] for a in task.axes))],
            [dict(zip(task.axes, combo)) for combo in itertools.product(*train_values)])


def make_plan(task: str, profile_name: str, overrides: Overrides | None = None) -> list[Cell]:
    """The cells known before training (every cell, for a profile without a learning-rate grid)."""
    return plan_run(task, profile_name, overrides).cells


def plan_run(task: str, profile_name: str, overrides: Overrides | None = None) -> Plan:
    overrides = overrides or Overrides()
    profile = load_profile(profile_name)
    known = task_names()
    for name in profile["tasks"]:
        if name not in TASKS and ":" not in name:
            needs_extra(name)
            raise UsageError(f"profile {profile_name!r} names unknown task {name!r}; known: {', '.join(known)} "
                             "(or module:attribute)")
        TASKS.get(name)  # a plug-in task that cannot be loaded is named here
    if task == "all":
        names = list(profile["tasks"])
    elif task in TASKS or ":" in task:
        names = [task]
    else:
        needs_extra(task)
        raise UsageError(f"unknown task {task!r}; known: {', '.join(known)}, all (or module:attribute)")
    plans = [plan_task_searches(name, profile, overrides) for name in names]
    plan = Plan([c for p in plans for c in p.cells], [s for p in plans for s in p.searches])
    if overrides.selection_only and not plan.searches:
        raise UsageError(f"--selection-only: profile {profile_name!r} has no learning-rate grid for {task!r}, "
                         "so there is no selection to run")
    return plan


def cell_from_dict(d: dict) -> Cell:
    return replace(Cell(**d), eval_levels=tuple(d["eval_levels"]))


@functools.cache
def profile_state_lengths() -> tuple[int, ...]:
    """STATE_LENGTHS and the longest sequence (in tokens) any level of a built-in profile makes."""
    import torch

    from ..diagnostics.conformance import STATE_LENGTHS

    longest, seen = 1, set()
    for name in profile_names():
        profile = load_profile(name)
        for task_name in profile["tasks"]:
            for cell in plan_task(task_name, profile, Overrides()):
                task = cell.task_object()
                adapter = task.make_adapter(8)
                for level in (cell.train_level, *cell.eval_levels):
                    key = (task_name, json.dumps(cell.task_options, sort_keys=True), json.dumps(level, sort_keys=True))
                    if key not in seen:
                        seen.add(key)
                        one = task.sample(level, 1, torch.Generator().manual_seed(0))
                        longest = max(longest, adapter(one).shape[1])
    return tuple(sorted({*STATE_LENGTHS, longest}))
