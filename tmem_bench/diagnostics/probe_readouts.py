"""The state probe's readout family: each member answers a query token from a frozen memory state.

No one readout reads every state format. A learned feature of the state gated by a feature of the
query (`gated`) suits a spatial read, where the query picks the cells; a slot table or a key-value
matrix needs the query matched against stored keys and the matching value returned, which such a
product cannot form. The family, every member trained at the same budget and the best on the
probe's own validation sequences chosen (state_probe.py):

- gated: logits = W_o relu((W_s s + b_s) * g(q)) + b_o, the probe's first readout;
- mlp: a wide two-layer perceptron over [s, q];
- bilinear: K units, each a rank-H bilinear form of the state and the query,
  hidden_k = relu(z_k(s) . g(q) + b_k) with z(s) a linear map of s through a rank-R bottleneck:
  can express the read of a key-value matrix (its columns are z, the query's features g), rotated
  or not, but learns it slowly;
- attention: multi-head attention of the query over the state's rows, each row's key and value a
  small network of the row and a learned embedding of its position: matches the query against
  stored keys, as a slot table needs;
- rows_linear: a sum of the rows weighted by the query alone, one learned weight per row
  position, w(q) . E(rows): the read of a key-value matrix (S^T phi(q), its rows indexed by key
  features) and of a grid (the query's cell), which softmax attention over content reaches slowly.

Rows (`rows_of`): in a tensor (B, ..., d) the last axis holds a row's features and every other
axis indexes rows, except in a grid, a tensor of four or more axes whose last three are equal
(B, C, G, G, G), whose channels come first, as Tensor Memory holds them; a flat tensor (B, n) is
mapped by a learned linear map to `learned_rows` rows, which can undo a rotation of a table.

Every readout takes the state as one standardised vector s (B, n), the concatenation of the
flattened tensors in `layout` order, and the query tokens (B, Q, d).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

Layout = list[tuple[int, ...]]  # each state tensor's shape without the batch, in the order s concatenates them

READOUTS = ("gated", "mlp", "bilinear", "attention", "rows_linear")
# The family the probe trains unless told otherwise. bilinear is left out: in trials on the slot, kv
# and voxel references it read none better than another member did, at more cost a step
# (`tmem-bench probe --calibrate --readouts bilinear,rows_linear` measures it again).
DEFAULT_READOUTS = ("gated", "mlp", "attention", "rows_linear")


def is_grid(shape: tuple[int, ...]) -> bool:
    return len(shape) >= 4 and shape[-1] == shape[-2] == shape[-3]


def rows_of(t: torch.Tensor) -> torch.Tensor:
    """(B, *shape) -> (B, rows, features), `shape` of two or more axes (see the module's note)."""
    if is_grid(tuple(t.shape[1:])):
        t = t.movedim(1, -1)
    return t.reshape(t.shape[0], -1, t.shape[-1])


def mlp(d_in: int, hidden: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


class Gated(nn.Module):
    def __init__(self, layout: Layout, query_dim: int, n_classes: int, config):
        super().__init__()
        state_dim = sum(math.prod(s) for s in layout)
        self.state = nn.Linear(state_dim, config.width)
        self.query = mlp(query_dim, config.query_width, config.width)
        self.out = nn.Linear(config.width, n_classes)

    def forward(self, state: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:  # -> (B, Q, n_classes)
        return self.out(F.relu(self.state(state)[:, None] * self.query(queries)))


class MLP(nn.Module):
    def __init__(self, layout: Layout, query_dim: int, n_classes: int, config):
        super().__init__()
        state_dim = sum(math.prod(s) for s in layout)
        # The first layer applied to s and q apart and summed: the same as one layer over [s, q],
        # without repeating the state for every query.
        self.state = nn.Linear(state_dim, config.mlp_width)
        self.query = nn.Linear(query_dim, config.mlp_width, bias=False)
        self.rest = nn.Sequential(nn.ReLU(), nn.Linear(config.mlp_width, config.mlp_width), nn.ReLU(),
                                  nn.Linear(config.mlp_width, n_classes))

    def forward(self, state: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        return self.rest(self.state(state)[:, None] + self.query(queries))


class Bilinear(nn.Module):
    def __init__(self, layout: Layout, query_dim: int, n_classes: int, config):
        super().__init__()
        state_dim = sum(math.prod(s) for s in layout)
        self.units, self.rank = config.bilinear_units, config.bilinear_query
        self.state = nn.Sequential(nn.Linear(state_dim, config.bilinear_rank),
                                   nn.Linear(config.bilinear_rank, self.units * self.rank))
        self.query = mlp(query_dim, config.query_width, self.rank)
        self.bias = nn.Parameter(torch.zeros(self.units))
        self.out = nn.Linear(self.units, n_classes)

    def forward(self, state: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        z = self.state(state).view(state.shape[0], self.units, self.rank)  # (B, K, H)
        hidden = torch.einsum("bkh,bqh->bqk", z, self.query(queries)) + self.bias  # (B, Q, K)
        return self.out(F.relu(hidden))


class Attention(nn.Module):
    """Softmax attention over the rows (`linear=False`) or their sum weighted by the query alone (`linear=True`)."""

    def __init__(self, layout: Layout, query_dim: int, n_classes: int, config, linear: bool = False):
        super().__init__()
        r, self.heads, self.linear = config.attention_width, config.attention_heads, linear
        self.layout, self.learned = layout, config.learned_rows
        self.sizes = [math.prod(s) for s in layout]
        embed, positions = [], []
        for shape in layout:
            if len(shape) == 1:  # flat: rows made by a learned linear map
                embed.append(nn.Linear(shape[0], self.learned * r))
                count = self.learned
            else:
                width = shape[0] if is_grid(shape) else shape[-1]
                embed.append(nn.Linear(width, r))
                count = math.prod(shape) // width
            positions.append(nn.Parameter(torch.randn(count, r) * 0.1))
        self.embed, self.positions = nn.ModuleList(embed), nn.ParameterList(positions)
        n_rows = sum(p.shape[0] for p in positions)
        self.query = mlp(query_dim, config.query_width, r)
        if linear:
            self.weights = nn.Linear(r, n_rows * self.heads)  # one weight per row and head, from the query alone
            self.value = nn.Linear(r, r)
        else:
            self.key, self.value = mlp(r, r, r), mlp(r, r, r)
        self.out = mlp(2 * r, config.query_width, n_classes)

    def rows(self, state: torch.Tensor) -> torch.Tensor:  # (B, n) -> (B, N, r)
        B, out = state.shape[0], []
        for part, shape, embed, pos in zip(state.split(self.sizes, 1), self.layout, self.embed, self.positions):
            rows = embed(part).view(B, self.learned, -1) if len(shape) == 1 else embed(rows_of(part.view(B, *shape)))
            out.append(rows if self.linear else rows + pos)
        return torch.cat(out, 1)

    def forward(self, state: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        rows = self.rows(state)
        B, N, r = rows.shape
        h, e = self.heads, r // self.heads
        q = self.query(queries)  # (B, Q, r)
        v = self.value(rows).view(B, N, h, e)
        if self.linear:
            weights = self.weights(q).view(B, -1, N, h).transpose(2, 3)  # (B, Q, h, N)
            read = torch.einsum("bqhn,bnhe->bqhe", weights, v) / math.sqrt(N)
        else:
            k = self.key(rows).view(B, N, h, e)
            scores = torch.einsum("bqhe,bnhe->bqhn", q.view(B, -1, h, e), k) / math.sqrt(e)
            read = torch.einsum("bqhn,bnhe->bqhe", scores.softmax(-1), v)
        return self.out(torch.cat([read.reshape(B, -1, r), q], -1))


def build_readout(name: str, layout: Layout, query_dim: int, n_classes: int, config) -> nn.Module:
    if name == "gated":
        return Gated(layout, query_dim, n_classes, config)
    if name == "mlp":
        return MLP(layout, query_dim, n_classes, config)
    if name == "bilinear":
        return Bilinear(layout, query_dim, n_classes, config)
    if name in ("attention", "rows_linear"):
        return Attention(layout, query_dim, n_classes, config, linear=name == "rows_linear")
    raise ValueError(f"unknown readout {name!r}; known: {', '.join(READOUTS)}")
