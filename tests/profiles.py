"""The small profile the tests train with: one text, and the variants derived from it.

TINY_PROFILE is two training steps of one small model on small evaluation sets. A test that
needs another setting derives it with `tiny_profile(...)` (exposed as the `tiny_profile`
fixture by tests/conftest.py) rather than pasting a profile of its own, so that every test
profile is this text with its differences named.
"""
from __future__ import annotations

import json

TINY_PROFILE = """\
[train]
steps = 2
batch_size = 8
lr = 1e-3
weight_decay = 0.0
grad_clip = 1.0
log_every = 1
eval_size = 32
seeds = [0]

[tasks.coordinate_binding]
models = ["base"]
model = { d_model = 16, n_layers = 1, n_heads = 2, dropout = 0.0 }
levels = { n_writes = [2, 4], noise = [0.05] }
train_at = { n_writes = 2 }
"""

# The model line without dropout (the size the harness and selection tests were written with).
NO_DROPOUT = "{ d_model = 16, n_layers = 1, n_heads = 2 }"


def toml_value(value) -> str:
    """A value as TOML text: a str is TOML already (written as given); bools, numbers and lists
    of them (or of strings, which are quoted) are written as TOML."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(json.dumps(v) if isinstance(v, str) else toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML text for {value!r}")


def _sections(text: str) -> list[tuple[str | None, list[str]]]:
    """(section header or None for the lines before the first, its lines), in order."""
    sections: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in text.splitlines():
        if line.startswith("["):
            sections.append((line.strip()[1:-1], []))
        else:
            sections[-1][1].append(line)
    return sections


def _changed(lines: list[str], changes: dict) -> list[str]:
    """`key = value` lines with `changes` applied: a key set to None is dropped, a new key is added
    after the last line of the section (before its trailing blank lines)."""
    out, seen = [], set()
    for line in lines:
        key = line.split(" = ")[0] if " = " in line else None
        if key in changes:
            seen.add(key)
            if changes[key] is not None:
                out.append(f"{key} = {toml_value(changes[key])}")
        else:
            out.append(line)
    end = len(out)
    while end and not out[end - 1].strip():
        end -= 1
    new = [f"{k} = {toml_value(v)}" for k, v in changes.items() if k not in seen and v is not None]
    return out[:end] + new + out[end:]


def tiny_profile(description: str | None = None, train: dict | None = None, tasks: dict | None = None,
                 append: str = "", text: str = TINY_PROFILE) -> str:
    """`text` (TINY_PROFILE unless given) with these differences:

    description: a `description = "..."` line first.
    train: key -> value for [train] (see toml_value; None drops the key, a new key is added).
    tasks: task name -> {key: value} for its [tasks.NAME] section, likewise; None drops the section;
        a section the text lacks is added after the others, with the models and model lines of the
        text's first task section unless the changes give them.
    append: text added at the end (so in the last section).
    """
    sections = _sections(text)
    first_task = next(lines for name, lines in sections if name and name.startswith("tasks."))
    inherited = {line.split(" = ")[0]: line.split(" = ", 1)[1] for line in first_task
                 if line.split(" = ")[0] in ("models", "model")}
    out = []
    for name, lines in sections:
        if name == "train" and train:
            lines = _changed(lines, train)
        elif name and name.startswith("tasks.") and tasks and name[len("tasks."):] in tasks:
            changes = tasks[name[len("tasks."):]]
            if changes is None:
                continue
            lines = _changed(lines, changes)
        out.append((name, lines))
    present = {name for name, _ in out}
    for task, changes in (tasks or {}).items():
        if changes is not None and f"tasks.{task}" not in present:
            if out[-1][1] and out[-1][1][-1].strip():
                out[-1][1].append("")
            out.append((f"tasks.{task}", _changed([], {**inherited, **changes})))
    body = "\n".join(line for name, lines in out
                     for line in ([f"[{name}]"] if name is not None else []) + lines).strip("\n") + "\n"
    if description is not None:
        body = f"description = {json.dumps(description)}\n\n" + body
    return body + append


def one_cell(steps: int = 4, lr: float = 1e-3) -> str:
    """One cell: base on coordinate_binding at n_writes=3 without noise, seed 0 (the run directory's
    tests: `steps` and `lr` as they need)."""
    return tiny_profile(train={"steps": steps, "lr": lr, "weight_decay": "0.01", "log_every": 2, "eval_size": 16},
                        tasks={"coordinate_binding": {"levels": "{ n_writes = [3], noise = [0.0] }", "train_at": None}})


def grid_profile(lr: str = "[1e-3, 1e-2]", seeds=(0, 1)) -> str:
    """base on coordinate_binding at n_writes=3, six steps, seeds 0 and 1 unless given others; `lr` a
    grid (the trials at the first seed, the others at the lr chosen) unless given one lr."""
    return tiny_profile(train={"steps": 6, "lr": lr, "weight_decay": "0.01", "log_every": 2, "seeds": list(seeds)},
                        tasks={"coordinate_binding": {"model": NO_DROPOUT, "train_at": None,
                                                      "levels": "{ n_writes = [3], noise = [0.05] }"}})


GRID = grid_profile()

TESTS_ONLY = "two training steps, small evaluation sets: tests only"  # the description of a board's test profile
