"""A leaderboard entry from a run directory: what was planned, what ran, and every number recomputed from cells.

Everything an entry states is a function of its cell files plus the profile text
and overrides it was planned from, so submission and validation call the same
functions here: `submit` (submit.py) writes what they return, `validate` compares
what an entry claims with what they return.
"""
from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import replace
from importlib import resources

from ..errors import UsageError
from ..harness.plan import Overrides, plan_task_searches
from ..harness.profiles import needs_extra
from ..harness.selection import choose
from ..levels import level_key
from ..registry import get_backbone, get_task, task_names
from ..report.stats import mean_ci

SCHEMA_VERSION = 1
RANKED_MIN_SEEDS = 3
# Overrides that choose which cells of a profile run, not how: every other override makes a different profile.
SELECTING_OVERRIDES = ("models", "seeds")


def task_version(task_name: str) -> int:
    """A task class may set `version`; bumping it marks earlier results as made on different data."""
    return int(getattr(get_task(task_name), "version", 1))


def builtin_profile_text(name: str) -> str | None:
    """The built-in profile's text, also where its tasks need an extra that is not installed:
    planning its cells then says what to install."""
    path = resources.files("tmem_bench.profiles").joinpath(f"{name}.toml")
    return path.read_text() if name.isidentifier() and path.is_file() else None


def profile_id(name: str, text: str, overrides: dict, task: str = "all") -> str:
    """The built-in name when the run used that profile unchanged; otherwise the name and a hash of what differs.

    Only what plans the run's cells counts: the shared training settings and the
    sections of the run's task (every task for "all"), so an entry stays comparable
    when another task's section of the profile changes. Two entries are ranked
    against each other only when their profile ids are equal.
    """
    changed = {k: v for k, v in overrides.items() if k not in SELECTING_OVERRIDES and v not in (None, {}, [])}
    settings = _planning(_parse(text), task)
    builtin = builtin_profile_text(name)
    if builtin is not None and settings == _planning(_parse(builtin), task) and not changed:
        return name
    digest = hashlib.sha256(json.dumps([settings, changed], sort_keys=True).encode()).hexdigest()[:8]
    return f"{name}~{digest}"


def _planning(settings: dict, task: str) -> dict:
    """The parts of parsed profile settings that plan a run of `task`."""
    out = {k: v for k, v in settings.items() if k not in ("description", "tasks")}
    tasks = settings.get("tasks", {})
    out["tasks"] = tasks if task == "all" else {task: tasks.get(task)}
    return out


def _parse(text: str) -> dict:
    """A profile's settings: comments and layout of its TOML do not change what it plans."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"the entry's profile is not valid TOML: {e}") from None


def planned_cells(run: dict, profile: dict, results: dict[str, dict] | None = None) -> tuple[list, set, list]:
    """(the cells the run's profile text and overrides plan, every model of the run; the ids of
    those a board shows; the learning-rate searches' records). A search's trials are all planned,
    and its remaining seeds at the lr its trials' validation accuracy chooses (`results`: cell id
    -> result); only the cells at the chosen lr are shown."""
    parsed = _parse(profile["toml"])
    try:
        overrides = Overrides(**run["overrides"])
    except TypeError as e:
        raise UsageError(f"the run's overrides are not ones this suite knows: {e}") from None
    # Cells stop where their own settings say: an entry trained under an earlier early-stopping rule
    # is planned with the rule its cells record, not the one thresholds.toml holds now.
    rules = {json.dumps(r["cell"]["train"]["early_stop"], sort_keys=True) for r in (results or {}).values()
             if isinstance(r["cell"]["train"].get("early_stop"), dict)}
    if len(rules) == 1:
        overrides = replace(overrides, early_stop=json.loads(rules.pop()))
    task = run["task"]
    for name in parsed.get("tasks", {}):
        needs_extra(name)  # else its cells would silently drop out of the plan
    names = [t for t in parsed.get("tasks", {}) if t in task_names()] if task == "all" else [task]
    plans = [plan_task_searches(name, parsed, overrides) for name in names]
    cells = [cell for plan in plans for cell in plan.cells]
    shown, records = {c.id for c in cells}, []
    for search in (s for plan in plans for s in plan.searches):
        record = choose(search, results or {})
        records.append(record)
        if record["chosen_lr"] is None:
            continue
        shown -= {c.id for c in search.trials if c.train["lr"] != record["chosen_lr"]}
        finals = search.finals(record["chosen_lr"])
        cells += search.cells_after(record)  # the finals, and any second selection seed it needed
        shown |= {c.id for c in finals}
    return cells, shown, records


def cell_verdict(result: dict) -> str:
    """The causality verdict of a cell: its probe at initialisation, unless a probe on its trained
    weights (eval or train mode) found a leak."""
    trained = [v.get("verdict") for v in (result.get("causality_trained") or {}).values() if isinstance(v, dict)]
    return "leaking" if "leaking" in trained else result["causality"]["verdict"]


def _selected(rows: list[dict]) -> list[dict]:
    """Per evaluation level, the row a board shows: trained at that level when the entry trained at
    several levels (the per-level view), else the one training level's."""
    train_levels = {r["train_level"] for r in rows}
    if len(train_levels) == 1:
        return rows
    return [r for r in rows if r["train_level"] == r["level"]]


def aggregate(results: list[dict]) -> tuple[list[dict], list[dict]]:
    """(per task, variant, training level and evaluation level: mean accuracy over seeds with its 95%
    interval, by the reports' rule (report/stats.py mean_ci: Student's t below 5 seeds, the percentile
    bootstrap from 5, a point for one seed), and where the cells acted in an environment the normalised
    return over seeds by the same rule; per task and variant: the score, the unweighted mean of the
    shown levels). Entries made under an earlier rule are brought up to it by `leaderboard refresh`."""
    groups: dict[tuple, list] = {}
    for result in results:
        cell = result["cell"]
        for ev in result["eval"]:
            # Levels in the order the profile lists them (n_writes 5, 10, 20, not 10, 20, 5).
            order = [level_key(lv) for lv in cell["eval_levels"]].index(ev["level_key"])
            key = (cell["task"], cell["variant"] != "standard", cell["variant"], level_key(cell["train_level"]),
                   order, ev["level_key"])
            groups.setdefault(key, []).append((cell["seed"], ev))
    rows = []
    for (task, _, variant, train_level, _, level), items in sorted(groups.items()):
        items.sort(key=lambda item: item[0])
        mean, low, high = mean_ci([ev["accuracy"] for _, ev in items])
        # A t interval of few seeds may reach past [0, 1], where a mean of accuracies cannot lie (the
        # reports print it clipped too); clipped here, the stored numbers stay fractions.
        low, high = max(low, 0.0), min(high, 1.0)
        first = items[0][1]
        row = {
            "task": task, "variant": variant, "train_level": train_level, "level": level,
            "level_values": first["level"], "seeds": [s for s, _ in items],
            "mean": mean, "low": low, "high": high,
            "chance": first["chance"], "ceiling": first["ceiling"], "n_eval": first["n"],
        }
        returns = [ev["closed_loop"]["mean_return"] for _, ev in items if ev.get("closed_loop")]
        if returns:  # the cells acted in the task's environment (harness/closed_loop.py)
            if len(returns) != len(items):
                raise UsageError(f"{task} at {level}: some seeds' cells acted in the environment and some did not")
            row["normalised_return"] = _return_ci(returns)
        rows.append(row)
    scores = []
    for task, variant in dict.fromkeys((r["task"], r["variant"]) for r in rows):
        shown = _selected([r for r in rows if r["task"] == task and r["variant"] == variant])
        scores.append({"task": task, "variant": variant, "levels": len(shown),
                       "score": sum(r["mean"] for r in shown) / len(shown)})
    return rows, scores


def _return_ci(returns: list[float]) -> dict:
    """The normalised return over seeds with its interval, by the accuracy's rule; POPGym's returns
    lie in [-1, 1], so a t interval of few seeds is clipped there, as accuracy's is to [0, 1], and so
    is the mean, which an episode's sum of rewards can carry past 1 by a rounding error."""
    return dict(zip(("mean", "low", "high"), (min(max(x, -1.0), 1.0) for x in mean_ci(returns))))


def state_size(model: str, model_options: dict, seq_len: int) -> dict:
    """Bytes the backbone carries at the task's sequence length, and whether it claims a fixed state."""
    backbone = get_backbone(model, **model_options)
    size = backbone.state_size(seq_len) if callable(getattr(backbone, "state_size", None)) else None
    return {"seq_len": seq_len, "bytes": size, "fixed": bool(getattr(backbone, "fixed_state", False))}


def _settings_order(result: dict) -> tuple:
    cell = result["cell"]
    level = tuple(sorted((k, v) for k, v in cell["train_level"].items()))
    return cell["task"], cell["variant"], level, cell["seed"], result["cell_id"]


def settings(results: list[dict]) -> list[dict]:
    """Per task and variant: everything the cells were trained and evaluated with, and the model's size,
    both as at the smallest training level (lowest seed), whatever order the cells come in: a profile
    that trains at several levels gives each its own steps and sequence length."""
    out = {}
    for result in sorted(results, key=_settings_order):
        cell = result["cell"]
        key = (cell["task"], cell["variant"])
        if key in out:
            out[key]["train_levels"] = sorted({*out[key]["train_levels"], level_key(cell["train_level"])})
            continue
        out[key] = {
            "task": cell["task"], "variant": cell["variant"], "task_version": task_version(cell["task"]),
            "task_options": cell["task_options"], "train": cell["train"],
            "train_levels": [level_key(cell["train_level"])],
            "eval_levels": [level_key(level) for level in cell["eval_levels"]],
            "model_options": cell["model_options"], "model_config": result.get("model_config"),
            "n_params": result["n_params"], "n_backbone_params": result["n_backbone_params"],
            "state_size": state_size(cell["model"], cell["model_options"], result["causality"]["seq_len"]),
        }
    return list(out.values())


def derived(results: list[dict]) -> dict:
    """Every field of an entry that is a function of its cells alone."""
    rows, scores = aggregate(results)
    seeds = sorted({r["cell"]["seed"] for r in results})
    verdicts = {cell_verdict(r) for r in results}
    return {
        "seeds": seeds,
        "ranked": len(seeds) >= RANKED_MIN_SEEDS,
        "causality": verdicts.pop() if len(verdicts) == 1 else "mixed",
        "settings": settings(results),
        "results": rows,
        "scores": scores,
        "devices": sorted({r["device"] for r in results}),
        "wall_time_s": sum(r["wall_time_s"] for r in results),
    }
