"""Reference memories for the state probe: states whose content is known by construction.

A probe number means something only beside what the probe reads from a state known to hold the
items. Each reference here is a plug-in backbone for coordinate binding whose `memory_state` hook
builds a state from the writes themselves, in one of the formats the suite's memories use, and
whose best possible read is computed exactly on the same sequences:

- slots: a table of rows (key, one-hot value), one per write, as a slot memory holds them;
- kv: a key-value matrix S (features x values) as the delta rule stores it, S phi(k_i) = v_i for
  every write (the minimum-norm solution), with phi a fixed random positive feature map;
- voxel: a G^3 grid, channels first as Tensor Memory holds it, each cell the one-hot value of the
  write nearest to its centre;
- dense: an LSTM-like vector, tanh of a fixed random linear map of all the writes (key, one-hot
  value) in order: injective, so it holds everything, but in no layout a readout knows.

Each also under a fixed random rotation of the whole flattened state (slots, kv: no rows left to
find), and mixed as a trained memory's own projections mix it, the rows kept: slots and voxel, one
orthogonal matrix over every row's features and the rows permuted; kv, an orthogonal matrix on each
side, R_k S R_v^T, as learned key and value projections do (dense is already a random mixing, so a
rotation of it is another reference of the same kind and is not repeated); each with every second
write dropped; a constant; fresh noise.

Best possible read, exactly on the evaluation sequences: the nearest written key's value (the task's
oracle, 100%) for slots and dense, which hold every key and value exactly; for kv, the read the delta
rule itself makes (argmax_v of S^T phi(q)), and for voxel the value held by the query's cell: both are
the format's own read, a lower bound of the optimum, named as such in `Reference.best_kind`. With
half the writes dropped, the same read where the nearest write was kept and chance where it was not
(its value is independent of everything kept); chance for constant and noise.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..contracts.device import hardware
from ..contracts.model import TaskModel
from ..contracts.task import Adapter, Batch, Task
from ..levels import Level
from .state_probe import probe_model

# The task whose writes and queries the references are built from: the only task the probe has
# references for, so the only one a probe number can be calibrated on.
TASK = "coordinate_binding"

GRID = 6  # voxel cells per axis: Tensor Memory's default grid
KV_FEATURES = 64  # phi's width: the delta rule stores W writes exactly when it exceeds W
DENSE_WIDTH = 512
REFERENCE_SEED = 20240  # the fixed random maps (rotations, feature maps, noise), the same for every probe

# The reference each format stands for, and the format of every built-in memory's state (a plug-in
# declares its own with `memory_state_format` on its backbone; shapes decide otherwise, see `state_format`).
FORMATS = ("slots", "kv", "voxel", "dense")
BUILTIN_FORMATS = {"slots": "slots", "delta": "kv", "linear": "kv", "ssm": "kv", "lstm": "dense", "gru": "dense",
                   "tensor": "voxel", "tensor_local": "voxel"}


@dataclass(frozen=True)
class Reference:
    name: str
    format: str  # one of FORMATS, or "none" for constant and noise
    rotated: bool = False
    dropped: bool = False  # every second write left out of the state
    complete: bool = True  # the state holds what its format's best read needs of every write
    best_kind: str = "oracle"  # "oracle" (exact optimum), "own read" (the format's read, a lower bound), "chance"


REFERENCES = (
    Reference("slots", "slots"),
    Reference("slots_rotated", "slots", rotated=True),
    Reference("slots_mixed", "slots", rotated=True),
    Reference("slots_half", "slots", dropped=True, complete=False),
    Reference("kv", "kv", best_kind="own read"),
    Reference("kv_rotated", "kv", rotated=True, best_kind="own read"),
    Reference("kv_mixed", "kv", rotated=True, best_kind="own read"),
    Reference("kv_half", "kv", dropped=True, complete=False, best_kind="own read"),
    Reference("voxel", "voxel", best_kind="own read"),
    Reference("voxel_mixed", "voxel", rotated=True, best_kind="own read"),
    Reference("voxel_half", "voxel", dropped=True, complete=False, best_kind="own read"),
    Reference("dense", "dense"),
    Reference("dense_half", "dense", dropped=True, complete=False),
    Reference("constant", "none", complete=False, best_kind="chance"),
    Reference("noise", "none", complete=False, best_kind="chance"),
)
BY_NAME = {r.name: r for r in REFERENCES}


def reference(name: str) -> Reference:
    if name not in BY_NAME:
        raise ValueError(f"unknown reference {name!r}; known: {', '.join(BY_NAME)}")
    return BY_NAME[name]


def closest_reference(fmt: str | None) -> str | None:
    """The information-complete reference of a state format as a trained memory holds it: its rows
    (where it has rows) mixed by projections the probe does not know."""
    return {"slots": "slots_mixed", "kv": "kv_mixed", "voxel": "voxel_mixed", "dense": "dense"}.get(fmt)


def state_format(model_name: str, backbone: nn.Module, state: dict[str, torch.Tensor]) -> str:
    """Which reference format a memory's state is closest to: declared by the backbone, else the
    built-in memory's, else its tensors' rank (5 or more: a grid with channels; 4: heads of key-value
    matrices; 3: rows; 2: a dense vector)."""
    declared = getattr(backbone, "memory_state_format", None)
    if declared in FORMATS:
        return declared
    if model_name in BUILTIN_FORMATS:
        return BUILTIN_FORMATS[model_name]
    rank = max(t.dim() for t in state.values())
    return "voxel" if rank >= 5 else {4: "kv", 3: "slots"}.get(rank, "dense")


def _orthogonal(n: int, generator: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()


@functools.lru_cache(maxsize=8)
def _fixed_maps(n_values: int, n_writes: int) -> dict[str, torch.Tensor]:
    """Every reference's fixed random maps, drawn in one order from REFERENCE_SEED (and kept: the
    rotations take seconds to draw)."""
    g = torch.Generator().manual_seed(REFERENCE_SEED)
    row = 3 + n_values
    return {
        "phi_w": torch.randn(KV_FEATURES, 3, generator=g) * 3.0,
        "phi_b": torch.randn(KV_FEATURES, generator=g),
        # Pre-activations of unit variance: each write's row (key, one-hot value) has squared norm about 2.
        "dense_w": torch.randn(DENSE_WIDTH, n_writes * row, generator=g) / (n_writes * 2) ** 0.5,
        "rot_slots": _orthogonal(n_writes * row, g),
        "rot_kv": _orthogonal(KV_FEATURES * n_values, g),
        "rot_cell": _orthogonal(n_values, g),
        "cell_order": torch.randperm(GRID ** 3, generator=g),
        # Drawn after the others, so that adding them changed none of the maps above.
        "rot_row": _orthogonal(row, g),
        "row_order": torch.randperm(n_writes, generator=g),
        "rot_key": _orthogonal(KV_FEATURES, g),
    }


class ReferenceAdapter(Adapter):
    """Tokens as plain features the reference reads back: [is query, key (3), one-hot value]."""

    def __init__(self, n_values: int):
        super().__init__()
        self.n_values = n_values

    def forward(self, batch: Batch) -> torch.Tensor:  # (B, W + Q, 4 + n_values)
        keys, values, queries = batch["keys"], batch["values"], batch["queries"]
        writes = torch.cat([torch.zeros_like(keys[..., :1]), keys, F.one_hot(values, self.n_values).float()], -1)
        asks = torch.cat([torch.ones_like(queries[..., :1]), queries,
                          queries.new_zeros(*queries.shape[:2], self.n_values)], -1)
        return torch.cat([writes, asks], dim=1)


class ReferenceMemory(nn.Module):
    """A backbone whose state is built from the write tokens it is given, in one reference format."""

    def __init__(self, ref: Reference, n_values: int, n_writes: int):
        super().__init__()
        self.ref, self.n_values, self.n_writes = ref, n_values, n_writes
        self.memory_state_format = ref.format if ref.format in FORMATS else None
        for name, tensor in _fixed_maps(n_values, n_writes).items():
            self.register_buffer(name, tensor)
        centres = (torch.arange(GRID) + 0.5) / GRID * 2 - 1
        self.register_buffer("centres", torch.cartesian_prod(centres, centres, centres))  # (G^3, 3), x slowest

    def forward(self, x, blocked=None):
        return x

    def phi(self, k: torch.Tensor) -> torch.Tensor:  # (..., 3) -> (..., F), positive as linear attention's
        return F.elu(k @ self.phi_w.T + self.phi_b) + 1

    def kept(self, n: int) -> torch.Tensor:  # (n,) bool: which writes the state holds
        keep = torch.ones(n, dtype=torch.bool)
        if self.ref.dropped:
            keep[1::2] = False
        return keep

    def memory_state(self, x: torch.Tensor, blocked=None) -> dict[str, torch.Tensor]:
        writes = x[:, (x[0, :, 0] == 0)]
        keys, onehot = writes[..., 1:4], writes[..., 4:]  # (B, W, 3), (B, W, n)
        B, W = keys.shape[:2]
        keep = self.kept(W).to(x.device)
        if self.ref.name == "constant":
            return {"state": torch.ones(B, 64, device=x.device)}
        if self.ref.name == "noise":
            # Fresh for every sequence yet the same on every rerun: drawn from a seed the tokens give.
            seed = int(x.double().abs().sum().item() * 1e6) % 2**31
            return {"state": torch.randn(B, 64, generator=torch.Generator().manual_seed(seed)).to(x.device)}
        fmt = self.ref.format
        if fmt == "slots":
            rows = torch.cat([keys, onehot], -1) * keep[None, :, None]  # (B, W, 3 + n)
            if self.ref.name == "slots_mixed":
                return {"slots": (rows @ self.rot_row.T)[:, self.row_order]}
            if self.ref.rotated:
                return {"state": rows.flatten(1) @ self.rot_slots.T}  # (B, W (3 + n))
            return {"slots": rows}
        if fmt == "dense":
            rows = torch.cat([keys, onehot], -1) * keep[None, :, None]
            return {"h": torch.tanh(rows.flatten(1) @ self.dense_w.T)}  # (B, DENSE_WIDTH)
        if fmt == "kv":
            S = self.delta_matrix(keys[:, keep], onehot[:, keep])  # (B, F, n)
            if self.ref.name == "kv_mixed":
                return {"S": self.rot_key @ S @ self.rot_cell.T}
            if self.ref.rotated:
                return {"state": S.flatten(1) @ self.rot_kv.T}
            return {"S": S}
        grid = self.voxels(keys[:, keep], onehot[:, keep])  # (B, G^3, n), x slowest
        if self.ref.rotated:
            grid = (grid @ self.rot_cell.T)[:, self.cell_order]
        return {"grid": grid.transpose(1, 2).reshape(B, self.n_values, GRID, GRID, GRID)}

    def delta_matrix(self, keys: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        """S (B, F, n) with S^T phi(k_i) = v_i for every write, of least norm: where the delta rule
        converges when it is shown the writes again and again."""
        phi = self.phi(keys).double()  # (B, W, F)
        return (torch.linalg.pinv(phi) @ onehot.double()).float()

    def voxels(self, keys: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        nearest = ((self.centres[None, :, None] - keys[:, None]) ** 2).sum(-1).argmin(-1)  # (B, G^3)
        return onehot.gather(1, nearest[..., None].expand(-1, -1, onehot.shape[-1]))

    def cell_of(self, queries: torch.Tensor) -> torch.Tensor:  # (B, Q, 3) -> (B, Q) cell index, x slowest
        index = ((queries + 1) / 2 * GRID).long().clamp(0, GRID - 1)
        return (index[..., 0] * GRID + index[..., 1]) * GRID + index[..., 2]

    def best_read(self, task: Task, batch: Batch) -> float:
        """The reference's best possible read of `batch`'s queries, exactly (see the module's note)."""
        chance = 1 / task.n_classes
        if self.ref.format == "none":
            return chance
        keys, values, queries, target = batch["keys"], batch["values"], batch["queries"], batch["target"]
        nearest = ((queries[:, :, None] - keys[:, None]) ** 2).sum(-1).argmin(-1)  # (B, Q)
        kept = self.kept(keys.shape[1])[nearest]
        if self.ref.format in ("slots", "dense"):
            right = torch.ones_like(target, dtype=torch.bool)
        elif self.ref.format == "kv":
            keep = self.kept(keys.shape[1])
            S = self.delta_matrix(keys[:, keep], F.one_hot(values[:, keep], task.n_classes).float())
            right = (self.phi(queries) @ S).argmax(-1) == target
        else:
            keep = self.kept(keys.shape[1])
            grid = self.voxels(keys[:, keep], F.one_hot(values[:, keep], task.n_classes).float())
            read = grid.argmax(-1).gather(1, self.cell_of(queries))
            right = read == target
        # A query whose nearest write was dropped is answered at chance whatever the read: its value
        # is independent of every write the state holds.
        return float(torch.where(kept, right.float(), torch.full_like(target, chance, dtype=torch.float)).mean())


def reference_model(name: str, task: Task, level: Level) -> TaskModel:
    """A TaskModel of reference `name` for coordinate binding at `level`, read by the probe like any memory."""
    if task.name != TASK:
        raise ValueError(f"the reference states are built for {TASK}, not {task.name!r}")
    return TaskModel(ReferenceAdapter(task.n_classes),
                     ReferenceMemory(reference(name), task.n_classes, int(level["n_writes"])))


CALIBRATION_EVAL_SIZE = 2048  # sequences of the task's evaluation set the references are scored on


def calibrate_reference(name: str, task: Task, level: Level, config, train_task: Task | None = None,
                        device: torch.device = torch.device("cpu")) -> dict:
    """The probe (every readout of `config`, trained on `device`) on reference `name`: {"reference",
    "best", "best_kind", "complete", "readout", "probe_accuracy", "readouts", "hardware"}, each
    member's accuracy on the evaluation sequences beside the reference's best possible read of the
    same sequences (computed on the CPU)."""
    ref = reference(name)
    model = reference_model(name, task, level)
    eval_batch, _ = task.eval_set(level, CALIBRATION_EVAL_SIZE)
    best = model.backbone.best_read(task, eval_batch)
    result = probe_model(model, task, level, eval_batch, config, train_task, device)
    return {"reference": name, "format": ref.format, "best": best,
            "best_kind": ref.best_kind, "complete": ref.complete, "readout": result["readout"],
            "probe_accuracy": result["probe_accuracy"],
            "readouts": {k: v["evaluation"] for k, v in result["readouts"].items()}, "hardware": hardware(device)}
