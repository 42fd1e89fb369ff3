"""The built-in profiles as data: what the report says about them (which profile checks a claim, the
colours of the labels they name) needs no planner, no model and no torch."""
from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources


@cache
def builtin_profiles() -> dict[str, dict]:
    """Name -> the profile's TOML, for every profile shipped in tmem_bench/profiles."""
    folder = resources.files("tmem_bench.profiles")
    return {path.name[:-5]: tomllib.loads(path.read_text())
            for path in sorted(folder.iterdir(), key=lambda p: p.name) if path.name.endswith(".toml")}


def section_models(section: dict) -> list[tuple[str, str]]:
    """(model name, label) of every model a task section names, its variants' included."""
    entries = section.get("models", []) + [m for v in section.get("variants", []) for m in v.get("models", [])]
    return [(m, m) if isinstance(m, str) else (m["name"], m.get("label", m["name"])) for m in entries]


def profile_labels() -> list[str]:
    """Every label a built-in profile gives a model in place of its name (an ablation's, a grid size's)."""
    return sorted({label for profile in builtin_profiles().values() for section in profile.get("tasks", {}).values()
                   for name, label in section_models(section) if label != name})
