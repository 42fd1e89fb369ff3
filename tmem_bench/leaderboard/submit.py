"""Submit: a run's models as leaderboard entries, written into the board's entries/ folder.

make_entries builds each entry from the run's cells with the same functions validation
recomputes them with (entry.py), so that submit never writes an entry validate rejects.
"""
from __future__ import annotations

import errno
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import unicodedata
from datetime import datetime, timezone
from pathlib import Path

from ..contracts.device import cpu_model
from ..errors import UsageError
from ..harness.profiles import profile_names
from ..files import write_json
from ..harness.rundir import RunDir
from ..report.stats import CI_LEVEL
from .entry import SCHEMA_VERSION, builtin_profile_text, derived, planned_cells, profile_id
from .folder import JOURNAL, STAGING_PREFIX, held, place
from .guard import find_schema
from .weights import records as weight_records


def slugify(text: str) -> str:
    """A folder name from an entry's name: accents dropped where a letter has a plain form
    (Ünïcödé -> unicode), letters of other scripts kept (日本語 stays)."""
    plain = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    slug = re.sub(r"[\W_]+", "-", plain.casefold()).strip("-")
    if not slug:
        raise UsageError(f"name {text!r} has no letters or digits to make a directory name from")
    return slug


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
                 description: str | None = None, weights: bool = True,
                 weights_url: str | None = None) -> list[tuple[str, dict, list[dict]]]:
    """(slug, entry, cell results) per model of the run, or for `model` (a label) alone; with
    `weights`, every cell must have its weights, which the entry records by hash and size, held
    in its folder or, with `weights_url`, referenced at WEIGHTS_URL/<cell id>.safetensors."""
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
            problem = run_dir.weights_problem(cell.id, results[-1]) if weights else None
            if problem:
                raise UsageError(f"{cell.describe()}: {problem}; an entry ships them so that every number can be "
                                 "re-evaluated: rerun the run's command, which trains the cell again")
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
            "selection": [{k: r[k] for k in ("task", "variant", "train_level", "grid", "chosen_lr", "at_edge",
                                             "second_seed_lrs") if k in r}
                          for r in records if r["label"] == label],
            **facts,
        }
        if weights:
            entry["weights"] = weight_records({c.id: run_dir.weights_path(c.id) for c in mine}, weights_url)
        out.append((slugify(entry_name), entry, results))
    return out


def write_entries(entries_dir: Path, made: list[tuple[str, dict, list[dict]]], run_dir: RunDir) -> None:
    """entries/<slug>/entry.json, cells/<id>.json and the cells' weights (cells/<id>.safetensors,
    copied from `run_dir`) of every entry, all or nothing: each staged whole in one folder, the
    journal written, then each renamed into place (a kill from there on is finished by the next
    command of the board, see folder.py). An OSError names the board's file, never the staging."""
    entries_dir.mkdir(exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=entries_dir, prefix=STAGING_PREFIX))
    try:
        for slug, entry, results in made:
            for result in results:
                cells = staging / slug / "cells"
                write_json(cells / f"{result['cell_id']}.json", result)
                if "url" not in entry.get("weights", {}).get(result["cell_id"], {}):  # referenced: not held
                    _copy(run_dir.weights_path(result["cell_id"]), cells / f"{result['cell_id']}.safetensors")
            write_json(staging / slug / "entry.json", entry)
        write_json(staging / JOURNAL, {"entries": [slug for slug, _, _ in made]})
    except BaseException as e:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(e, OSError) and e.filename and Path(e.filename).is_relative_to(staging):
            raise OSError(e.errno, e.strerror, str(entries_dir / Path(e.filename).relative_to(staging))) from e
        raise
    place(staging, [slug for slug, _, _ in made])


def _copy(source: Path, target: Path) -> None:
    try:
        shutil.copyfile(source, target)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # writing failed, whichever file Python names
            raise OSError(e.errno, e.strerror, str(target)) from e
        raise


def _same(folder: Path, entry: dict) -> bool:
    """Whether a published entry is `entry` as an earlier run of the same command wrote it."""
    try:
        published = json.loads((folder / "entry.json").read_text())
        return ([published.get(k) for k in ("name", "model", "cells", "profile")]
                == [entry[k] for k in ("name", "model", "cells", "profile")])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return False


def submit(run_dir, name: str, leaderboard_dir="leaderboard", model: str | None = None,
           url: str | None = None, description: str | None = None, weights_url: str | None = None) -> list[Path]:
    """Write an entry per model of a finished run into the board, all or nothing; the same command
    after a kill or a full disk finishes what is not there yet."""
    from jsonschema import Draft202012Validator

    board = Path(leaderboard_dir)
    if board.exists() and not board.is_dir():
        raise UsageError(f"--leaderboard {str(board)!r} is a file, not a folder; give the leaderboard folder")
    RunDir.existing(run_dir)
    validator = Draft202012Validator(json.loads(find_schema(board).read_text()),
                                     format_checker=Draft202012Validator.FORMAT_CHECKER)
    made = make_entries(run_dir, name, model, url, description, weights_url=weights_url)
    entries_dir = board / "entries"
    for slug, entry, _ in made:
        # Checked here as validate will check it, so that submit never writes an entry validate rejects.
        error = next(iter(sorted(validator.iter_errors(entry), key=lambda e: list(map(str, e.absolute_path)))), None)
        if error is not None:
            raise UsageError(_refusal(error))
    board.mkdir(parents=True, exist_ok=True)
    with held(board):
        there = {slug for slug, entry, _ in made if _same(entries_dir / slug, entry)}
        taken = [slug for slug, _, _ in made if slug not in there and os.path.lexists(entries_dir / slug)]
        if taken:
            raise UsageError(f"entries {', '.join(taken)} exist already in {entries_dir}; choose another --name")
        todo = [item for item in made if item[0] not in there]
        for published, cells in published_cells(entries_dir).items():
            for slug, entry, _ in todo:
                shared = set(entry["cells"]) & cells
                if shared and published not in there:
                    raise UsageError(f"{len(shared)} of the cells of {slug} are published already in the entry "
                                     f"{published}; a run is submitted once")
        if todo:
            write_entries(entries_dir, todo, RunDir(run_dir))
    return [entries_dir / slug for slug, _, _ in made]


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
