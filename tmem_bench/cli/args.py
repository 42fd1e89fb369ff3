"""The parsers of the command line's values: each a one-line error naming the flag and what it takes."""
from __future__ import annotations

from ..errors import UsageError

MAX_SEEDS = 1000  # seeds per cell from a count; a list may name any seeds
DEVICES = ("auto", "cpu", "cuda")


def check_device(name: str, tf32: bool = False) -> str:
    """--device, refused in one line where it asks for CUDA and there is none, or where --tf32 asks
    for CUDA's matrix products on a run that will not have them."""
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available here; allowed: auto, cpu")
    if tf32 and (name == "cpu" or not torch.cuda.is_available()):
        raise UsageError(f"--tf32 sets the matrix products of a CUDA device, and this run (--device {name}) has none")
    return name


def number(text: str, what: str):
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{what}: {text!r} is not a number") from None
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


def parse_levels(items: list[str]) -> dict[str, list]:
    levels = {}
    for item in items:
        axis, sep, values = item.partition("=")
        if not sep or not axis or not values:
            raise UsageError(f"--level {item!r} is malformed; expected AXIS=V1,V2,... (for example n_writes=5,10)")
        if axis in levels:
            raise UsageError(f"--level {axis} is given twice; give all its values once: --level {axis}=V1,V2,...")
        levels[axis] = [number(v, f"--level {axis}") for v in values.split(",")]
    return levels


def parse_train_at(text: str | None):
    if text is None or text == "each":
        return text
    out = {}
    for item in text.split(","):
        axis, sep, value = item.partition("=")
        if not sep or not axis or not value:
            raise UsageError(f"--train-at {text!r} is malformed; expected 'each' or AXIS=V[,AXIS=V...]")
        out[axis] = number(value, f"--train-at {axis}")
    return out


def parse_seeds(count: str | None, seed_list: str | None = None):
    """The seeds of `--seeds N` (always a count: seeds 0 to N-1) or of `--seed-list A,B,...` (always
    the seeds themselves, one or more): one flag never means a count in one form and a list in another."""
    if count is not None and seed_list is not None:
        raise UsageError("--seeds (a count) and --seed-list (the seeds themselves) are one choice; give one")
    if count is not None:
        try:
            n = int(count)
        except ValueError:
            hint = f"; for the seeds {count} themselves give --seed-list {count}" if "," in count else ""
            raise UsageError(f"--seeds {count!r} is not a count (3 runs seeds 0, 1, 2){hint}") from None
        if n <= 0:
            raise UsageError(f"--seeds count must be positive, got {n}")
        if n > MAX_SEEDS:
            raise UsageError(f"--seeds count must be at most {MAX_SEEDS}, got {n}")
        return list(range(n))
    if seed_list is None:
        return None
    try:
        return [int(p) for p in seed_list.split(",")]
    except ValueError:
        raise UsageError(f"--seed-list {seed_list!r} is malformed; expected seeds such as 0,5,7 (or one: 3)") from None


def parse_options(items: list[str]) -> dict:
    """--option KEY=VALUE items -> factory options; numbers and true/false are typed, anything else is a string."""
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise UsageError(f"--option {item!r} is malformed; expected KEY=VALUE (for example kernel=eager)")
        if value.lower() in ("true", "false"):
            options[key] = value.lower() == "true"
        else:
            try:
                options[key] = number(value, f"--option {key}")
            except UsageError:
                options[key] = value
    return options
