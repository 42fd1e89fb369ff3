"""The built-in profiles (tmem_bench/profiles/*.toml) and profile files: found by name, read and
checked against the profile schema, and the task and model names a run is given, checked before
anything is imported to plan it (plan.py)."""
from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from ..errors import UsageError
from ..registry import BACKBONES, TASKS
from ..schema import check as check_schema


def profile_names() -> list[str]:
    """The built-in profiles, less those whose tasks need an extra that is not installed (naming
    one still loads it, and planning it says what to install)."""
    missing = {name for names in TASKS.missing_extras.values() for name in names}
    found = sorted((p for p in resources.files("tmem_bench.profiles").iterdir() if p.name.endswith(".toml")),
                   key=lambda p: p.name)
    return [p.name[:-5] for p in found
            if not missing or not missing & set(tomllib.loads(p.read_text("utf-8")).get("tasks", {}))]


def needs_extra(name: str) -> None:
    """A UsageError saying what to install, where `name` is a task of an extra that is not installed."""
    if any(name in names for names in TASKS.missing_extras.values()):
        TASKS.get(name)


def load_profile(name: str) -> dict:
    """A built-in profile by name, or a path to a TOML file, checked against the profile schema."""
    if name.endswith(".toml"):
        path = Path(name)
        if path.is_dir():
            raise UsageError(f"profile {name!r} is a folder; give a profile's TOML file")
        if not path.is_file():
            raise UsageError(f"profile file {name!r} does not exist")
        data = path.read_bytes()
    elif name.isidentifier() and resources.files("tmem_bench.profiles").joinpath(f"{name}.toml").is_file():
        data = resources.files("tmem_bench.profiles").joinpath(f"{name}.toml").read_bytes()
    else:
        raise UsageError(f"unknown profile {name!r}; known: {', '.join(profile_names())} (or a path to a .toml file)")
    try:
        profile = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UsageError(f"profile {name!r} is not UTF-8 text: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"profile {name!r} is not valid TOML: {e}") from None
    check_schema(profile, "profile", f"profile {name!r}")
    return profile


def entry_labels(profile: dict) -> set[str]:
    """The labels of the profile's model tables ({name, label, ...}), which `--models` may name to
    pick those tables (plan.py); read from unchecked profiles too (a leaderboard entry's)."""
    def listed(table) -> list:
        models = table.get("models") if isinstance(table, dict) else None
        return models if isinstance(models, list) else []

    tasks = profile.get("tasks")
    sections = list(tasks.values()) if isinstance(tasks, dict) else []
    lists = [listed(section) for section in sections]
    lists += [listed(variant) for section in sections if isinstance(section, dict)
              and isinstance(section.get("variants"), list) for variant in section["variants"]]
    return {entry["label"] for models in lists for entry in models
            if isinstance(entry, dict) and isinstance(entry.get("label"), str)}


def check_names(task: str, models: list[str] | None, labels: set[str] = frozenset()) -> None:
    """A task or model name that names nothing, refused before torch is imported (seconds, tens of
    them on a busy machine); registered, installed and module:attribute names are loaded when planned,
    and `labels` (the profile's entry_labels) are names too."""
    if task != "all" and task not in TASKS and ":" not in task:
        if TASKS.extra_of(task) is not None:
            TASKS.get(task)  # says which extra to install
        raise UsageError(f"unknown task {task!r}; known: {', '.join(TASKS.names())}, all (or module:attribute)")
    for name in models or ():
        if name not in BACKBONES and name not in labels and ":" not in name:
            if labels:
                raise UsageError(f"unknown model {name!r}; known: {', '.join(BACKBONES.names())}, and the profile's "
                                 f"labels {', '.join(sorted(labels))} (or module:attribute)")
            BACKBONES.get(name)  # raises the refusal, with the known names
