"""A level: one value per sweep axis of a task, and the one key that names it.

The key names a level in cells, tables, reports and leaderboard entries, and seeds the level's
evaluation and validation sets, so changing it would change every fingerprint. Here, not in
task.py, because reading results must not need torch.
"""
Level = dict[str, float | int]


def level_key(level: Level) -> str:
    return ",".join(f"{k}={v}" for k, v in level.items()) or "-"
