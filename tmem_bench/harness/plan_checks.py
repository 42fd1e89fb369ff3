"""Checks that a plan can run before anything is written: every model builds and keeps the
backbone contract, and every batch fits in memory."""
from __future__ import annotations

import inspect
import json
import os

import torch

from ..contracts.task import level_key
from ..errors import UsageError
from ..registry import BACKBONES

_CHECKED: set[tuple] = set()


def check_model(name: str, model_options: dict) -> None:
    """Build the backbone once and call it on a tiny batch, so that a bad name or option, or a
    plugin that breaks the backbone contract, fails before anything runs or is written. A model
    that passed is not checked again in this process (validating a board plans one profile once
    per entry, and building a model can take seconds)."""
    key = (name, BACKBONES.get(name), json.dumps(model_options, sort_keys=True, default=repr))
    if key in _CHECKED:
        return
    factory = key[1]  # an unknown name fails here with the list of known ones
    try:
        backbone = factory(**model_options)
    except (TypeError, ValueError) as e:
        raise UsageError(f"model {name!r}: {e}") from e
    except Exception as e:  # a plugin's own code failed; `--debug` shows where
        raise UsageError(f"model {name!r}: its factory raised {type(e).__name__}: {e}") from e
    if not isinstance(backbone, torch.nn.Module):
        raise UsageError(f"model {name!r}: its factory returned {type(backbone).__name__}, not a torch.nn.Module")
    params = inspect.signature(backbone.forward).parameters
    if "blocked" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        raise UsageError(f"model {name!r}: forward takes no `blocked` argument; "
                         "the contract is forward(x (B, S, d), blocked=None) -> (B, S, d)")
    d = model_options["d_model"]
    x = torch.zeros(2, 3, d)
    try:
        with torch.no_grad():
            y = backbone.eval()(x, blocked=None)
    except Exception as e:
        raise UsageError(f"model {name!r}: forward raised {type(e).__name__}: {e}") from e
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise UsageError(f"model {name!r}: forward of a (2, 3, {d}) batch returned {got}, expected (2, 3, {d})")
    _CHECKED.add(key)


def _memory_bytes(device: str) -> int:
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return torch.cuda.mem_get_info()[1]
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_sizes(cells: list, device: str = "auto") -> None:
    """Refuse cells (plan.Cell) whose batches cannot fit in memory, before anything is written.

    The estimate is a lower bound (activations of the blocks and attention scores, and the
    generated evaluation set), so it only refuses sizes that cannot fit at all."""
    available = _memory_bytes(device)
    seen = set()
    for cell in cells:
        key = (cell.task, json.dumps(cell.task_options, sort_keys=True), level_key(cell.train_level),
               json.dumps(cell.model_options, sort_keys=True, default=str), cell.train["batch_size"],
               cell.train["eval_size"])
        if key in seen:
            continue
        seen.add(key)
        task = cell.task_object()
        d, layers = cell.model_options["d_model"], cell.model_options["n_layers"]
        heads = cell.model_options["n_heads"]
        for level in (cell.train_level, *cell.eval_levels):
            try:
                one = task.sample(level, 1, torch.Generator().manual_seed(0))
                tokens = task.make_adapter(d)(one).shape[1]
            except (RuntimeError, MemoryError, OverflowError) as e:
                raise UsageError(f"{cell.task} at {level_key(level)}: one sequence cannot be built "
                                 f"({type(e).__name__}: {str(e).splitlines()[0]})") from None
            per_example = sum(t.nelement() * t.element_size() for t in one.values())
            train = cell.train["batch_size"] * layers * (40 * tokens * d + 12 * heads * tokens * tokens) * 4
            needed = max(train, cell.train["eval_size"] * per_example)
            if needed > available:
                raise UsageError(
                    f"{cell.describe()}: about {needed / 2**30:,.1f} GiB needed at {level_key(level)} "
                    f"({tokens} tokens, batch {cell.train['batch_size']}, eval_size {cell.train['eval_size']}), "
                    f"more than the {available / 2**30:,.1f} GiB here; lower the level, --batch-size or eval_size")
