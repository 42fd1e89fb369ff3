"""A level: one value per sweep axis of a task, and the one key that names it; a cell's description,
which carries it.

The key names a level in cells, tables, reports and leaderboard entries, and seeds the level's
evaluation and validation sets, so changing it would change every fingerprint. Here, not in
task.py, because reading results must not need torch.
"""
Level = dict[str, float | int]


def level_key(level: Level) -> str:
    return ",".join(f"{k}={v}" for k, v in level.items()) or "-"


def describe_cell(task: str, variant: str, label: str, level: str, seed: int) -> str:
    """How a cell is named to people, and in a manifest, which keeps only this of a cell not yet trained."""
    return f"{task}{'' if variant == 'standard' else f' [{variant}]'} {label} @ {level} seed {seed}"


def where_described(text: str) -> tuple[str, str, str] | None:
    """The (task, variant, level key) a `describe_cell` names; None where `text` is not one."""
    head, at, tail = text.rpartition(" @ ")
    task, _, rest = head.partition(" ")
    variant = rest[1:rest.find("] ")] if rest.startswith("[") and "] " in rest else "standard"
    level, seed, _ = tail.rpartition(" seed ")
    return (task, variant, level) if at and seed and task and rest else None
