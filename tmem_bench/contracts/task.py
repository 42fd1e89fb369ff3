"""The task contract shared by every task family.

A task samples batches (dicts of tensors with a "target" of shape (B, n_scored))
from an explicit torch.Generator, owns a fixed evaluation set per level made from
a reserved seed that training never uses, knows its chance level and ceiling, and
builds the adapter that turns its batches into tokens and scored positions into
logits. Backbones never see which task they serve. One task object serves every cell of its
options in a process (registry.get_task), so it keeps nothing that a cell changes.
"""
from __future__ import annotations

import hashlib
import zlib

import torch
import torch.nn as nn

from ..errors import UsageError
from ..levels import Level, level_key

Batch = dict[str, torch.Tensor]

# Training seeds are user seeds below 2**31. PyTorch's CPU generator keeps only the low 32 bits
# of a seed, so an evaluation seed (2**62 plus a 32-bit hash) draws the stream of its hash: the
# planner refuses a training seed equal to the hash of a level it evaluates. Validation seeds lie
# in [2**31, 2**32), where no training seed can, and differ from every evaluation hash of the
# built-in profiles (tested).
MAX_TRAIN_SEED = 2**31
_EVAL_SEED_BASE = 2**62
SEED_BITS = 2**32


def fingerprint(batch: Batch) -> str:
    """sha256 over every tensor of a batch, in key order, with dtypes and shapes."""
    h = hashlib.sha256()
    for key in sorted(batch):
        t = batch[key].detach().cpu().contiguous()
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def split_batch(batch: Batch, size: int):
    n = batch["target"].shape[0]
    for start in range(0, n, size):
        yield {k: v[start:start + size] for k, v in batch.items()}


class Adapter(nn.Module):
    """Task-side input embedding and output head around a backbone."""

    def forward(self, batch: Batch) -> torch.Tensor:  # (B, S, d)
        raise NotImplementedError

    def blocked(self, batch: Batch) -> torch.Tensor | None:
        """(S, S) bool, True on attention edges the task forbids (memory-forcing variants)."""
        return None

    def head(self, h: torch.Tensor, batch: Batch) -> torch.Tensor:  # (B, n_scored, n_classes)
        raise NotImplementedError


class Task:
    name: str = ""
    axes: tuple[str, ...] = ()
    n_classes: int = 0
    # Bumped when the data drawn at an existing level changes (its fingerprints), so that results
    # made on the earlier data are told apart (the leaderboard refuses them).
    version: int = 1
    # A small evaluation grid, one list of values per axis: what `tmem-bench check --task` checks,
    # and what a run plans for a task its profile does not name.
    levels: dict[str, tuple] = {}
    # Named variants: the options each is built with ("standard" is the defaults, the paper's
    # setting). A profile may name one (`{ variant = "memory_forcing" }`); one its profile does not
    # name runs all of them.
    variants: dict[str, dict] = {"standard": {}}
    # The variants in which attention alone is blind by construction: their adapter's `blocked`
    # edges cut every attention path from the evidence to the answer, so only a state the backbone
    # carries can pass it on (the report keeps them apart from the paper's setting).
    memory_forcing: tuple[str, ...] = ()

    @classmethod
    def forces_memory(cls, options: dict) -> bool:
        """Whether a variant with these options (as a cell records them) is memory-forcing: it has
        every option of one of the memory-forcing variants, whatever else it sets (sizes, say)."""
        return any(all(options.get(k) == v for k, v in cls.variants[name].items()) for name in cls.memory_forcing)

    def options(self) -> dict:
        """Task options that change the data or the model (recorded in every result)."""
        return {}

    def validate_level(self, level: Level) -> Level:
        """Check a level's axes and values; return it with values cast to their types."""
        if set(level) != set(self.axes):
            raise UsageError(
                f"task {self.name!r} has axes {list(self.axes) or 'none'}, got {sorted(level) or 'none'}"
            )
        return {axis: self.check_value(axis, level[axis]) for axis in self.axes}

    def check_value(self, axis: str, value):
        """One axis value checked (a UsageError naming the axis and the allowed values) and cast to its type."""
        raise NotImplementedError

    def sample(self, level: Level, batch_size: int, generator: torch.Generator) -> Batch:
        raise NotImplementedError

    def make_adapter(self, d_model: int) -> Adapter:
        raise NotImplementedError

    def oracle(self, level: Level, batch: Batch) -> torch.Tensor:
        """(B, n_scored) predictions of the best reader of the inputs; its accuracy is the ceiling."""
        raise NotImplementedError

    def chance(self, level: Level) -> float:
        """Accuracy of the best constant predictor."""
        return 1.0 / self.n_classes

    def ceiling(self, level: Level, batch: Batch) -> float:
        """Best accuracy the information in `batch` allows (1.0 when the target is a function of the inputs)."""
        return 1.0

    def reach_positions(self, level: Level, batch: Batch) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(S,) bool masks over the adapter's tokens of a batch at `level`: the evidence tokens (what
        the answer must be read from) and the answer tokens (the outputs the head reads), for the
        information-reach probe of every cell and the state probe; None for a task without a memory
        axis. Disjoint, some answer tokens, every evidence token before every answer token; every
        memory-forcing variant gives them, and where it blocks edges they cut this evidence from
        this answer (`tmem-bench check --task`'s reach check)."""
        return None

    def eval_seed(self, level: Level) -> int:
        return _EVAL_SEED_BASE + zlib.crc32(f"{self.name}|{level_key(level)}".encode())

    def eval_set(self, level: Level, size: int) -> tuple[Batch, str]:
        """The fixed evaluation set of a level and its sha256 fingerprint."""
        return self._fixed_set(self.eval_seed(level), level, size)

    def reserved_seed(self, purpose: str, level: Level) -> int:
        """The seed of a fixed set drawn for `purpose` ("validation", "closed_loop", "chance",
        "state_probe|train", ...) at `level`: in [MAX_TRAIN_SEED, SEED_BITS), where no training seed
        lies, and apart for each purpose, task and level. Cell ids and the committed results depend on
        these values, so the formula never changes."""
        return MAX_TRAIN_SEED + zlib.crc32(f"{purpose}|{self.name}|{level_key(level)}".encode()) % MAX_TRAIN_SEED

    def validation_seed(self, level: Level) -> int:
        return self.reserved_seed("validation", level)

    def validation_set(self, level: Level, size: int) -> tuple[Batch, str]:
        """The fixed validation set of a level (hyperparameters are chosen on it, never on the
        evaluation set) and its sha256 fingerprint."""
        return self._fixed_set(self.validation_seed(level), level, size)

    def _fixed_set(self, seed: int, level: Level, size: int) -> tuple[Batch, str]:
        batch = self.sample(level, size, torch.Generator().manual_seed(seed))
        return batch, fingerprint(batch)
