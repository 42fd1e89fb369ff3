"""Validation that trusts nothing an entry claims.

Every aggregate is rebuilt from the entry's own cell files, every evaluation
set is regenerated with the installed suite and fingerprinted again, the cells
the entry's profile plans are compared with the cells it holds, each cell file's
name with the hash of its settings, and the causality probe is run again on the
model. Each rejection is one line: `<entry>: <field>: <reason>`.

An entry is someone else's: before anything is planned or built, every task and model it
names must be built in or installed (names.py), and nothing is read through a link or from
outside the entry's own folder, nor more of a file than an entry's file can need.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from ..diagnostics.causality import causality_probe
from ..errors import MissingExtra, UsageError
from ..harness.plan import cell_from_dict
from ..harness.results import read_cell
from ..levels import level_key
from ..registry import get_task, module_names
from ..version import __version__
from .cache import Recheck, ValidationCache, cell_count, describe
from .entry import RANKED_MIN_SEEDS, cell_verdict, derived, planned_cells, profile_id, task_version
from .guard import entry_dirs, find_schema, not_readable
from .names import missing_extra, refused_names
from .reeval import reevaluate

TOLERANCE = 1e-9  # the recomputation is the same arithmetic; this only absorbs JSON float round trips


@dataclass
class Validation:
    accepted: list[tuple[Path, dict]] = field(default_factory=list)
    rejections: list[str] = field(default_factory=list)  # one line per reason, several per entry
    rechecked: dict[str, dict] = field(default_factory=dict)  # slug -> what was recomputed (cache.Recheck)
    rejected: list[str] = field(default_factory=list)  # the slugs of the rejected entries
    # One line per entry that names a task of an optional extra not installed here: neither valid nor
    # rejected, since the fault is this machine's (MissingExtra).
    unchecked: list[str] = field(default_factory=list)


def known_suite_version(version: str) -> bool:
    """A version this suite can read: the same major.minor (the cell format) and not newer than itself."""
    try:
        claimed = tuple(int(x) for x in version.split("."))
        installed = tuple(int(x) for x in __version__.split(".")[:3])
    except ValueError:
        return False
    return claimed[:2] == installed[:2] and claimed <= installed


def difference(claimed, actual, where: str = "") -> str | None:
    """Where and how two JSON values differ (numbers within TOLERANCE are equal), or None."""
    if isinstance(claimed, bool) or isinstance(actual, bool):
        same = claimed is actual
    elif isinstance(claimed, (int, float)) and isinstance(actual, (int, float)):
        same = abs(claimed - actual) <= TOLERANCE
    elif isinstance(claimed, dict) and isinstance(actual, dict):
        for key in sorted(set(claimed) | set(actual), key=str):
            found = difference(claimed.get(key), actual.get(key), f"{where}.{key}")
            if found:
                return found
        return None
    elif isinstance(claimed, list) and isinstance(actual, list):
        if len(claimed) != len(actual):
            return f"{where}: {len(claimed)} items claimed, {len(actual)} recomputed from the cells"
        for i, (c, a) in enumerate(zip(claimed, actual)):
            found = difference(c, a, f"{where}[{i}]")
            if found:
                return found
        return None
    else:
        same = claimed == actual
    return None if same else f"{where}: claims {claimed!r}, the cells give {actual!r}"


class _EvalSets:
    """Evaluation sets regenerated with the installed suite, once per task, options, level and size."""

    def __init__(self):
        self._cache = {}

    def facts(self, cell: dict, level: dict) -> dict:
        options = json.dumps(cell["task_options"], sort_keys=True)
        key = (cell["task"], options, level_key(level), cell["train"]["eval_size"])
        if key not in self._cache:
            task = get_task(cell["task"], **cell["task_options"])
            batch, fp = task.eval_set(level, cell["train"]["eval_size"])
            self._cache[key] = {"fingerprint": fp, "chance": task.chance(level), "ceiling": task.ceiling(level, batch),
                                "n": batch["target"].numel()}
        return self._cache[key]


def _check_cell(result: dict, entry: dict, eval_sets: _EvalSets, reject) -> None:
    cell = result["cell"]
    where = f"cells/{result['cell_id']}.json"
    if (cell["label"], cell["model"]) != (entry["model"]["label"], entry["model"]["name"]):
        reject(f"{where}: model", f"{cell['label']} ({cell['model']}) is not the entry's model "
                                  f"{entry['model']['label']} ({entry['model']['name']})")
    if result.get("tmem_bench_version") != entry["suite"]["tmem_bench_version"]:
        reject(f"{where}: tmem_bench_version",
               f"{result.get('tmem_bench_version')!r} differs from the entry's suite version")
    verdict = cell_verdict(result)
    if verdict != "causal":
        reject(f"{where}: causality", f"the probe found the model {verdict!r}; only causal models are admitted")
    if result.get("status", "finished") != "finished":
        reject(f"{where}: status", f"{result.get('status')!r} (at step {result.get('diverged_at_step')}); "
                                   "only cells whose training finished are admitted")
    if [ev["level"] for ev in result["eval"]] != list(cell["eval_levels"]):
        reject(f"{where}: eval", "the evaluated levels are not the cell's eval_levels")
        return
    for ev in result["eval"]:
        field_ = f"{where}: eval[{ev['level_key']}]"
        if ev["level_key"] != level_key(ev["level"]):
            reject(f"{field_}.level_key", f"{ev['level_key']!r} does not name the level {ev['level']}")
        for name in ("accuracy", "chance", "ceiling"):
            value = ev.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                reject(f"{field_}.{name}", f"{value!r} is out of range [0, 1]")
        facts = eval_sets.facts(cell, ev["level"])
        if ev["fingerprint"] != facts["fingerprint"]:
            reject(f"{field_}.fingerprint", f"{ev['fingerprint'][:12]}... is not the installed suite's evaluation set "
                                            f"({facts['fingerprint'][:12]}...)")
        for name, actual in (("chance", facts["chance"]), ("ceiling", facts["ceiling"]), ("n", facts["n"])):
            if difference(ev.get(name), actual):
                reject(f"{field_}.{name}", f"claims {ev.get(name)!r}, the evaluation set gives {actual!r}")


def _probe_again(results: list[dict], reject) -> None:
    """The causality probe, rerun on the model of each task and variant exactly as training ran it."""
    import torch

    from ..harness.train import build_model

    done = set()
    for result in sorted(results, key=lambda r: r["cell"]["seed"]):
        cell = cell_from_dict(result["cell"])
        if (cell.task, cell.variant) in done:
            continue
        done.add((cell.task, cell.variant))
        model = build_model(cell)
        task = cell.task_object()
        batch = task.sample(cell.train_level, 1, torch.Generator().manual_seed(cell.seed))
        seq_len = model.adapter(batch).shape[1]
        probe = causality_probe(model.backbone, cell.model_options["d_model"], seq_len,
                                blocked=model.adapter.blocked(batch), seed=cell.seed)
        if probe["verdict"] != "causal":
            reject(f"model ({cell.task} {cell.variant})", f"the causality probe, run again here, finds the model "
                                                          f"{probe['verdict']!r}; only causal models are admitted")


def validate_entry(entry_dir: Path, validator, eval_sets: _EvalSets, allow_module_names: bool = False,
                   recheck: Recheck | None = None) -> tuple[dict | None, list[str]]:
    slug = entry_dir.name
    lines: list[str] = []

    def reject(where: str, reason: str) -> None:
        lines.append(f"{slug}: {where}: {reason}")

    for where, path in (("entry folder", entry_dir), ("cells", entry_dir / "cells")):
        if path.is_symlink():
            reject(where, "is a symbolic link; an entry is a folder of the board, and nothing outside it is read")
            return None, lines
    refused = not_readable(entry_dir / "entry.json", entry_dir)
    if refused:
        reject("entry.json", refused)
        return None, lines
    try:
        entry = json.loads((entry_dir / "entry.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        reject("entry.json", f"unreadable ({type(e).__name__}: {e})")
        return None, lines
    for error in sorted(validator.iter_errors(entry), key=lambda e: list(map(str, e.absolute_path))):
        reject("/".join(map(str, error.absolute_path)) or "entry.json", f"schema: {error.message}")
    if lines:
        return None, lines
    if not known_suite_version(entry["suite"]["tmem_bench_version"]):
        reject("suite.tmem_bench_version", f"{entry['suite']['tmem_bench_version']} is not a version this suite "
                                           f"({__version__}) knows")
        return None, lines

    results = {}
    for path in sorted((entry_dir / "cells").glob("*.json")):
        refused = not_readable(path, entry_dir)
        if refused:
            reject(f"cells/{path.name}", refused)
            continue
        try:
            result = read_cell(path)
            recomputed = cell_from_dict(result["cell"]).id
        except ValueError as e:
            reject(f"cells/{path.name}", str(e))
            continue
        except (KeyError, TypeError) as e:
            reject(f"cells/{path.name}", f"not a complete cell result ({type(e).__name__}: {e})")
            continue
        if path.stem != result["cell_id"] or recomputed != result["cell_id"]:
            reject(f"cells/{path.name}", f"the file name is not the hash of the cell's settings ({recomputed})")
            continue
        results[result["cell_id"]] = result
    if sorted(results) != sorted(entry["cells"]) and not lines:
        for missing in sorted(set(entry["cells"]) - set(results)):
            reject("cells", f"{missing} is listed but its cell file is missing")
        for extra in sorted(set(results) - set(entry["cells"])):
            reject("cells", f"cells/{extra}.json is not listed in the entry")
    extra = missing_extra(entry, results)
    if extra is not None and not lines:
        raise MissingExtra(extra)
    for where, reason in refused_names(entry, results, allow_module_names):
        reject(where, reason)
    if lines:
        return None, lines  # nothing is planned or built from a name or file that was refused

    try:
        planned, shown, records = planned_cells(entry["run"], entry["profile"], results)
        planned = [c for c in planned if c.label == entry["model"]["label"]]
    except UsageError as e:
        reject("profile", f"cannot plan the entry's cells with the installed suite: {e}")
        return None, lines
    selection = [{k: r[k] for k in ("task", "variant", "train_level", "grid", "chosen_lr", "at_edge",
                                    "second_seed_lrs") if k in r}
                 for r in records if r["label"] == entry["model"]["label"]]
    found = difference(entry.get("selection", []), selection, "selection")
    if found:
        reject("selection", found.partition(": ")[2] + " (the lrs its trials' validation accuracy chooses)")
    for cell in planned:
        if cell.id not in entry["cells"]:
            reject("cells", f"missing {cell.describe()} (planned by the entry's profile and overrides)")
    planned_ids = {c.id for c in planned}
    for cell_id in sorted(set(entry["cells"]) - planned_ids):
        reject("cells", f"{cell_id} is not a cell the entry's profile and overrides plan")
    actual_id = profile_id(entry["profile"]["name"], entry["profile"]["toml"], entry["run"]["overrides"],
                           entry["run"]["task"])
    if entry["profile"]["id"] != actual_id:
        reject("profile.id", f"claims {entry['profile']['id']!r}; its profile text and overrides make {actual_id!r}")

    for result in results.values():
        try:
            _check_cell(result, entry, eval_sets, reject)
        except (KeyError, TypeError, ValueError) as e:
            reject(f"cells/{result['cell_id']}.json", f"incomplete ({type(e).__name__}: {e})")
    for setting in entry["settings"]:
        installed = task_version(setting["task"])
        if setting["task_version"] != installed:
            reject(f"settings ({setting['task']} {setting['variant']}).task_version",
                   f"{setting['task_version']} is not the installed task's version {installed}")
    if lines:
        return None, lines

    actual = derived([r for r in results.values() if r["cell_id"] in shown])
    for key, value in actual.items():
        found = difference(entry[key], value, key)
        if found:
            # Right cells with numbers made under an earlier rule (issue 43's intervals) read the same.
            where, _, reason = found.partition(": ")
            reject(where, f"{reason}; if the cells are right, `tmem-bench leaderboard refresh {slug}` rebuilds "
                          f"the entry's numbers from them")
    if entry["causality"] != "causal":
        reject("causality", f"verdict {entry['causality']!r}; only causal models are admitted")
    if entry["ranked"] and len(entry["seeds"]) < RANKED_MIN_SEEDS:
        reject("ranked", f"a ranked entry needs at least {RANKED_MIN_SEEDS} seeds, it has {len(entry['seeds'])}")
    if not lines:
        # Re-evaluation first: it builds each model only where its weights file bounds its size, so a
        # cell naming an impossible size is refused before the probe builds anything from it.
        (recheck or Recheck(0)).run(entry_dir, entry, results, reject, reevaluate)
    if not lines:
        _probe_again(list(results.values()), reject)
    return (None if lines else entry), lines


def _duplicates(accepted: list[tuple[Path, dict]]) -> tuple[list[tuple[Path, dict]], list[str]]:
    """Of two entries sharing cells (the same experiment) or a name, the one submitted first stays and
    the later is rejected, whatever their folders' names."""
    kept, lines = [], []
    for path, entry in sorted(accepted, key=lambda item: (_submitted(item[1]), item[0].name)):
        cells = set(entry["cells"])
        clash = None
        for other_path, other in kept:
            shared = cells & set(other["cells"])
            if shared:
                clash = f"duplicate of {other_path.name}: {len(shared)} of its cells are the same cells"
            elif entry["name"].casefold() == other["name"].casefold():
                clash = f"duplicate of {other_path.name}: the same name {entry['name']!r}"
            if clash:
                break
        if clash:
            lines.append(f"{path.name}: {'cells' if 'cells' in clash else 'name'}: {clash}")
        else:
            kept.append((path, entry))
    return kept, lines


def _submitted(entry: dict) -> datetime:
    try:
        when = datetime.fromisoformat(entry["submitted"])
    except ValueError:
        return datetime.max.replace(tzinfo=timezone.utc)  # an unreadable date never outranks a readable one
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def validate(path="leaderboard", allow_module_names: bool = False, full: bool = False,
             progress: bool = False, on_entry: Callable[[str, str, list[str]], None] | None = None) -> Validation:
    """Every entry under `path`, accepted or rejected in one line per reason, or unchecked where it
    needs an extra not installed here. `allow_module_names` trusts the entries' module:attribute names
    (which import and run the code they name): for one's own entries, never for a board's submitted
    ones. An entry validated on this machine before, unchanged in everything its verdict depends on, is
    not validated again unless `full` (cache.py); `progress` shows the re-evaluation's progress on
    stderr; `on_entry(slug, "valid" | "rejected" | "unchecked", lines)` is told each verdict as soon as
    it is known (a valid entry's line says what was recomputed)."""
    from jsonschema import Draft202012Validator

    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path} does not exist; give a leaderboard folder, an entries folder or an entry")
    schema_path = find_schema(path)
    schema = json.loads(schema_path.read_text())
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    eval_sets = _EvalSets()
    out = Validation()
    good = []
    cache = ValidationCache(schema_path, full, {"allow_module_names": allow_module_names})
    dirs = entry_dirs(path)
    hits = {entry_dir: cache.get(entry_dir) for entry_dir in dirs}
    stale = [entry_dir for entry_dir in dirs if hits[entry_dir] is None]
    note = (f"re-evaluating {cell_count(stale)} cells of {len(stale)} entr{'y' if len(stale) == 1 else 'ies'} from "
            f"their weights" + (" (--full: whatever was recorded)" if full else
                                f": once on this machine, each entry's verdict recorded in {cache.path} as it "
                                f"finishes, so that an interrupted validation resumes where it stopped"))
    tell = on_entry or (lambda slug, verdict, lines: None)
    with module_names(allow_module_names), Recheck(cell_count(stale), progress, note) as recheck:
        for entry_dir in dirs:
            slug = entry_dir.name
            if hits[entry_dir] is not None:
                entry, out.rechecked[slug] = hits[entry_dir][0], {**hits[entry_dir][1], "cached": True}
                good.append((entry_dir, entry))
                tell(slug, "valid", [f"{slug}: unchanged since validated here at {hits[entry_dir][1].get('validated')}; "
                                     f"then {describe(hits[entry_dir][1])}"])
                continue
            try:
                entry, lines = validate_entry(entry_dir, validator, eval_sets, allow_module_names, recheck)
            except MissingExtra as e:
                out.unchecked.append(f"{slug}: {e}")
                tell(slug, "unchecked", out.unchecked[-1:])
                continue
            except Exception as e:  # noqa: BLE001 - one entry's failure, whatever it is, is that entry's rejection
                message = str(e).splitlines()[0] if str(e) else ""
                kind = "" if isinstance(e, UsageError) else f"{type(e).__name__}: "
                entry, lines = None, [f"{slug}: cannot be validated: {kind}{message}"]
            out.rejections.extend(lines)
            if entry is not None:
                good.append((entry_dir, entry))
                cache.put(entry_dir, recheck.summaries[slug])
                tell(slug, "valid", [f"{slug}: {describe(recheck.summaries[slug])}"])
            else:
                out.rejected.append(slug)
                tell(slug, "rejected", lines)
    cache.save()
    out.rechecked |= {slug: {**summary, "cached": False} for slug, summary in recheck.summaries.items()}
    kept, lines = _duplicates(good)
    out.accepted = [item for item in good if item in kept]
    out.rejected += [item[0].name for item in good if item not in kept]
    out.rejections.extend(lines)
    for line in lines:
        tell(line.partition(":")[0], "rejected", [line])
    return out
