"""Every task and model name a leaderboard entry gives, checked before anything is planned.

A name is code: a built-in or an installed entry point is code the person validating
installed, while `module:attribute` imports a module the entry names, and importing runs
it. So an entry may name only the former unless the person validating trusts module names
(--allow-module-names), and the options it hands a factory must be ones the factory declares.
"""
from __future__ import annotations

import tomllib

from ..errors import UsageError
from ..harness.plan import VARIANT_KEYS
from ..harness.profiles import entry_labels
from ..registry import BACKBONES, TASKS

MODEL_TABLE_KEYS = ("name", "label", "train")  # a profile's model table: these, then the factory's options


def name_sites(entry: dict, results: dict[str, dict]) -> list[tuple[str, str, object, dict | None]]:
    """(where, "task" or "model", the name, the options given to its factory or None) for every
    name the entry gives: its model, its run's task and models, its profile text, its cells, its settings."""
    run = entry["run"]
    sites = [("model.name", "model", entry["model"]["name"], None)]
    if run["task"] != "all":
        sites.append(("run.task", "task", run["task"], None))
    try:
        profile = tomllib.loads(entry["profile"]["toml"])
    except tomllib.TOMLDecodeError:
        profile = {}  # planning refuses it, naming the error
    # A label of one of the profile's model tables names that table, whose model is named below.
    labels = entry_labels(profile)
    models = run["overrides"].get("models")
    sites += [(f"run.overrides.models[{i}]", "model", name, None) for i, name in enumerate(models or [])
              if not (isinstance(name, str) and name in labels)]  # an entry's name may be any JSON value
    sites += _profile_sites(profile)
    for cell_id, result in sorted(results.items()):
        cell = result["cell"]
        sites.append((f"cells/{cell_id}.json: task", "task", cell["task"], cell["task_options"]))
        sites.append((f"cells/{cell_id}.json: model", "model", cell["model"], cell["model_options"]))
    sites += [(f"settings[{i}].task", "task", s["task"], None) for i, s in enumerate(entry["settings"])]
    return sites


def _profile_sites(profile: dict) -> list[tuple[str, str, object, dict | None]]:
    """The names in a profile: its task sections, their variants' task options, and the models of
    every model list with their options (the section's `model` size, then the table's)."""
    tasks = profile.get("tasks")
    out = []
    for task, section in (tasks if isinstance(tasks, dict) else {}).items():
        where = f"profile: tasks.{task}"
        out.append((where, "task", task, None))
        if not isinstance(section, dict):
            continue
        size = section["model"] if isinstance(section.get("model"), dict) else {}
        lists = [(f"{where}.models", section.get("models"))]
        variants = section.get("variants")
        for j, variant in enumerate(variants if isinstance(variants, list) else []):
            if isinstance(variant, dict):
                options = {k: v for k, v in variant.items() if k not in VARIANT_KEYS}
                out.append((f"{where}.variants[{j}]", "task", task, options))
                lists.append((f"{where}.variants[{j}].models", variant.get("models")))
        for at, models in lists:
            for i, model in enumerate(models if isinstance(models, list) else []):
                if isinstance(model, dict):
                    options = {k: v for k, v in model.items() if k not in MODEL_TABLE_KEYS}
                    out.append((f"{at}[{i}]", "model", model.get("name"), {**size, **options}))
                else:
                    out.append((f"{at}[{i}]", "model", model, size))
    return out


def is_module_name(name: str) -> bool:
    """`package.module:attribute` made of Python identifiers only: no path, so nothing that names it
    can reach a file outside the folders Python imports from."""
    module, _, attr = name.partition(":")
    return bool(attr) and attr.isidentifier() and all(part.isidentifier() for part in module.split("."))


def refusal(kind: str, name, options: dict | None, allow_module_names: bool) -> str | None:
    """Why an entry may not name `name` (with `options` for its factory), or None; the factory
    is read, never called."""
    registry = TASKS if kind == "task" else BACKBONES
    if not isinstance(name, str) or not name:
        return f"{name!r} is not a {kind} name"
    if name not in registry:
        if ":" not in name:
            return f"unknown {kind} {name!r}; known: {', '.join(registry.names())}"
        if not is_module_name(name):  # a path such as /abs/dir/mod:x would name a file, not a module
            return f"{kind} {name[:80]!r} is not a module:attribute name (dotted Python identifiers)"
        if not allow_module_names:
            return (f"{kind} {name!r} is a module:attribute name, and importing a module runs its code; an entry "
                    f"may name built-in and installed {kind}s only ({', '.join(registry.names())}); "
                    f"--allow-module-names trusts module names")
    if not isinstance(options, dict):
        return None
    try:
        declared = registry.declared(name)
    except UsageError as e:
        return str(e)
    unknown = sorted(set(options) - set(declared)) if declared is not None else []
    if unknown:
        return f"{kind} {name!r} takes no option {unknown[0]!r}; it takes: {', '.join(declared) or 'none'}"
    return None


def missing_extra(entry: dict, results: dict[str, dict]) -> str | None:
    """The optional extra, not installed here, whose tasks the entry names (POPGym's without the popgym
    extra), or None: such an entry cannot be checked here, which says nothing of the entry."""
    return next((extra for _, kind, name, _ in name_sites(entry, results)
                 if kind == "task" and (extra := TASKS.extra_of(name)) is not None), None)


def refused_names(entry: dict, results: dict[str, dict], allow_module_names: bool) -> list[tuple[str, str]]:
    """(where, reason) for each name or option the entry may not give, at the first place it gives it."""
    out, seen = [], set()
    for where, kind, name, options in name_sites(entry, results):
        reason = refusal(kind, name, options, allow_module_names)
        if reason is not None and reason not in seen:
            seen.add(reason)
            out.append((where, reason))
    return out
