"""A leaderboard entry from a run directory: what was planned, what ran, and every number recomputed from cells.

Everything an entry states is a function of its cell files plus the profile text
and overrides it was planned from, so submission and validation call the same
functions here: `submit` writes what they return, `validate` compares what an
entry claims with what they return.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import tomllib
import unicodedata
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path

from ..errors import UsageError
from ..plan import Overrides, plan_task_searches, profile_names
from ..registry import get_backbone, get_task, task_names
from ..report.stats import CI_LEVEL, bootstrap_ci
from ..levels import level_key
from ..results import current_umask, write_json
from ..rundir import RunDir
from ..selection import choose
from ..train import cpu_model

SCHEMA_VERSION = 1
SCHEMA_FILE = "entry.schema.json"
RANKED_MIN_SEEDS = 3
# Overrides that choose which cells of a profile run, not how: every other override makes a different profile.
SELECTING_OVERRIDES = ("models", "seeds")


def slugify(text: str) -> str:
    """A folder name from an entry's name: accents dropped where a letter has a plain form
    (Ünïcödé -> unicode), letters of other scripts kept (日本語 stays)."""
    plain = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    slug = re.sub(r"[\W_]+", "-", plain.casefold()).strip("-")
    if not slug:
        raise UsageError(f"name {text!r} has no letters or digits to make a directory name from")
    return slug


def find_schema(path: Path) -> Path:
    """entry.schema.json in `path`, in its `leaderboard` folder, or in a folder above it."""
    for folder in [path, *path.resolve().parents]:
        if (folder / SCHEMA_FILE).is_file():
            return folder / SCHEMA_FILE
    raise UsageError(f"no {SCHEMA_FILE} in {path} or any folder above it; run from a clone of tmem-bench "
                     f"(it lives in leaderboard/)")


def task_version(task_name: str) -> int:
    """A task class may set `version`; bumping it marks earlier results as made on different data."""
    return int(getattr(get_task(task_name), "version", 1))


def builtin_profile_text(name: str) -> str | None:
    if name not in profile_names():
        return None
    return resources.files("tmem_bench.profiles").joinpath(f"{name}.toml").read_text()


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
    task = run["task"]
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
        cells += finals
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
    """(per task, variant, training level and evaluation level: mean accuracy over seeds with its
    bootstrap interval; per task and variant: the score, the unweighted mean of the shown levels)."""
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
        mean, low, high = bootstrap_ci([ev["accuracy"] for _, ev in items])
        first = items[0][1]
        rows.append({
            "task": task, "variant": variant, "train_level": train_level, "level": level,
            "level_values": first["level"], "seeds": [s for s, _ in items],
            "mean": mean, "low": low, "high": high,
            "chance": first["chance"], "ceiling": first["ceiling"], "n_eval": first["n"],
        })
    scores = []
    for task, variant in dict.fromkeys((r["task"], r["variant"]) for r in rows):
        shown = _selected([r for r in rows if r["task"] == task and r["variant"] == variant])
        scores.append({"task": task, "variant": variant, "levels": len(shown),
                       "score": sum(r["mean"] for r in shown) / len(shown)})
    return rows, scores


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


def git_commit() -> dict:
    """The commit of the suite's own source tree, when it is a git checkout (an installed wheel is not)."""
    here = Path(__file__).resolve().parents[2]

    def git(*args):
        return subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True, timeout=30)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"commit": None, "dirty": None}
        dirty = bool(git("status", "--porcelain", "--untracked-files=no").stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": head.stdout.strip(), "dirty": dirty}


def read_manifest(run_dir: RunDir) -> dict:
    """The run's manifest, which names the task and overrides it was planned from."""
    manifest = run_dir.manifest() or {}
    settings = manifest.get("settings")
    if not (isinstance(settings, dict) and {"task", "overrides"} <= settings.keys()):
        raise UsageError(f"{run_dir.manifest_path} is missing or not a run manifest (no task and overrides)")
    return manifest


def _profile(setting: str) -> dict:
    if setting.endswith(".toml"):
        path = Path(setting)
        if not path.is_file():
            raise UsageError(f"the run's profile file {setting!r} is not here; submit from where the run was started")
        return {"name": path.stem, "toml": path.read_text()}
    text = builtin_profile_text(setting)
    if text is None:
        raise UsageError(f"the run's profile {setting!r} is not a profile of this suite ({', '.join(profile_names())})")
    return {"name": setting, "toml": text}


def make_entries(run_dir, name: str, model: str | None = None, url: str | None = None,
                 description: str | None = None, weights: bool = True) -> list[tuple[str, dict, list[dict]]]:
    """(slug, entry, cell results) per model of the run, or for `model` (a label) alone; with
    `weights`, every cell must have its weights (an entry ships them)."""
    run_dir = RunDir(run_dir)
    manifest = read_manifest(run_dir)
    run = {"task": manifest["settings"]["task"], "overrides": manifest["settings"]["overrides"]}
    profile = _profile(manifest["settings"].get("profile", "quick"))
    profile["id"] = profile_id(profile["name"], profile["toml"], run["overrides"], run["task"])
    stored, _ = run_dir.load_cells()
    cells, shown, records = planned_cells(run, profile, {r["cell_id"]: r for r in stored})
    labels = list(dict.fromkeys(c.label for c in cells))
    if model is not None and model not in labels:
        raise UsageError(f"--model {model!r} is not a model of this run; its models: {', '.join(labels)}")
    chosen = [model] if model is not None else labels
    out = []
    for label in chosen:
        mine = [c for c in cells if c.label == label]
        results = []
        for cell in mine:
            try:
                results.append(run_dir.read_cell(cell.id))
            except ValueError:
                failed = run_dir.failed_path(cell.id).is_file()
                raise UsageError(f"run {run_dir} is incomplete: {cell.describe()} has no result"
                                 f"{' (it failed: see failed/' + cell.id + '.json)' if failed else ''}; "
                                 f"rerun its command to finish it") from None
            if results[-1].get("status") == "diverged":
                raise UsageError(f"{cell.describe()} diverged at step {results[-1].get('diverged_at_step')} "
                                 f"(non-finite loss); a run with diverged cells cannot be submitted")
            if weights and not run_dir.weights_path(cell.id).is_file():
                raise UsageError(f"{cell.describe()} has no weights (cells/{cell.id}.safetensors); an entry ships "
                                 f"them so that every number can be re-evaluated: rerun the cell with this suite")
        facts = derived([r for r in results if r["cell_id"] in shown])
        if facts["causality"] != "causal":
            raise UsageError(f"model {label!r} is {facts['causality']!r} by the causality probe of its cells; only "
                             f"causal models can be submitted (see `tmem-bench check {mine[0].model}`)")
        entry_name = name if len(chosen) == 1 else f"{name} ({label})"
        entry = {
            "schema_version": SCHEMA_VERSION,
            "name": entry_name, "url": url, "description": description,
            "submitted": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "suite": {"tmem_bench_version": results[0]["tmem_bench_version"],
                      "torch_version": results[0]["torch_version"], "git": git_commit()},
            "run": {**run, "command": manifest.get("command"), "started": manifest.get("started"),
                    "cpu": cpu_model(), "cpu_count": os.cpu_count(), "platform": platform.platform()},
            "profile": profile,
            "model": {"label": label, "name": mine[0].model},
            "ci_level": CI_LEVEL,
            "cells": sorted(c.id for c in mine),
            "selection": [{k: r[k] for k in ("task", "variant", "train_level", "grid", "chosen_lr", "at_edge")}
                          for r in records if r["label"] == label],
            **facts,
        }
        out.append((slugify(entry_name), entry, results))
    return out


def write_entry(entries_dir: Path, slug: str, entry: dict, results: list[dict], run_dir: RunDir) -> Path:
    """entries/<slug>/entry.json, cells/<id>.json and the cells' weights (cells/<id>.safetensors,
    copied from `run_dir`), all or nothing: built aside, then renamed into place."""
    entries_dir = Path(entries_dir)
    final = entries_dir / slug
    if final.exists():
        raise UsageError(f"entry {final} exists already; choose another --name (entries are never overwritten)")
    entries_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=entries_dir, prefix=f".{slug}."))
    try:
        os.chmod(staging, 0o777 & ~current_umask())  # mkdtemp's 0700 would hide the entry from colleagues
        for result in results:
            write_json(staging / "cells" / f"{result['cell_id']}.json", result)
            shutil.copyfile(run_dir.weights_path(result["cell_id"]),
                            staging / "cells" / f"{result['cell_id']}.safetensors")
        write_json(staging / "entry.json", entry)
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def submit(run_dir, name: str, leaderboard_dir="leaderboard", model: str | None = None,
           url: str | None = None, description: str | None = None) -> list[Path]:
    from jsonschema import Draft202012Validator

    board = Path(leaderboard_dir)
    if board.exists() and not board.is_dir():
        raise UsageError(f"--leaderboard {str(board)!r} is a file, not a folder; give the leaderboard folder")
    RunDir.existing(run_dir)
    validator = Draft202012Validator(json.loads(find_schema(board).read_text()),
                                     format_checker=Draft202012Validator.FORMAT_CHECKER)
    made = make_entries(run_dir, name, model, url, description)
    entries_dir = board / "entries"
    for slug, entry, _ in made:
        # Checked here as validate will check it, so that submit never writes an entry validate rejects.
        error = next(iter(sorted(validator.iter_errors(entry), key=lambda e: list(map(str, e.absolute_path)))), None)
        if error is not None:
            raise UsageError(_refusal(error))
    taken = [slug for slug, _, _ in made if (entries_dir / slug).exists()]
    if taken:
        raise UsageError(f"entries {', '.join(taken)} exist already in {entries_dir}; choose another --name")
    for published, cells in published_cells(entries_dir).items():
        for slug, entry, _ in made:
            shared = set(entry["cells"]) & cells
            if shared:
                raise UsageError(f"{len(shared)} of the cells of {slug} are published already in the entry "
                                 f"{published}; a run is submitted once")
    return [write_entry(entries_dir, slug, entry, results, RunDir(run_dir)) for slug, entry, results in made]


def _refusal(error) -> str:
    """A schema error of a new entry as the option the user gave, what is wrong and what is allowed."""
    field = "/".join(map(str, error.absolute_path)) or "entry"
    option = {"name": "--name", "url": "--url", "description": "--description"}.get(field, field)
    if error.validator == "maxLength":
        return f"{option} is {len(error.instance):,} characters long; at most {error.validator_value:,} are allowed"
    if option == "--url" and error.validator == "pattern":
        return f"--url {error.instance!r} is not an http:// or https:// address (with a host, without spaces)"
    return f"{option}: {error.message}"


def published_cells(entries_dir: Path) -> dict[str, set[str]]:
    """Entry folder name -> the cell ids it lists, for every readable entry (validate judges the others)."""
    out = {}
    for path in sorted(Path(entries_dir).glob("*/entry.json")):
        try:
            cells = json.loads(path.read_text()).get("cells")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            continue
        if isinstance(cells, list):
            out[path.parent.name] = {c for c in cells if isinstance(c, str)}
    return out
