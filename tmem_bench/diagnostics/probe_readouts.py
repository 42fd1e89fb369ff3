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
  reads a key-value matrix exactly (its columns are z, the query's features g), rotated or not;
- attention: multi-head attention of the query over the state's rows, each row's key and value a
  small network of the row and a learned embedding of its position. Rows are the last axis of each
  tensor (B, ..., d) with every other axis indexing rows, or, for `attention_first`, the first
  axis after the batch (B, C, ...), channels first as a voxel grid holds them; a flat tensor (B, n)
  is mapped by a learned linear map to `learned_rows` rows, which undoes a rotation of a table.

Every readout takes the state as one standardised vector s (B, n), the concatenation of the
flattened tensors in `layout` order, and the query tokens (B, Q, d).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

Layout = list[tuple[int, ...]]  # each state tensor's shape without the batch, in the order s concatenates them

READOUTS = ("gated", "mlp", "bilinear", "attention", "attention_first")


def applicable(name: str, layout: Layout) -> bool:
    """Whether readout `name` reads a state of this layout differently from the others: channels first
    only where some tensor has two or more axes besides its features."""
    if name == "attention_first":
        return any(len(shape) >= 3 for shape in layout)
    return name in READOUTS


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
    def __init__(self, layout: Layout, query_dim: int, n_classes: int, config, channels_first: bool = False):
        super().__init__()
        r, self.heads = config.attention_width, config.attention_heads
        self.layout, self.channels_first, self.learned = layout, channels_first, config.learned_rows
        self.sizes = [math.prod(s) for s in layout]
        embed, positions = [], []
        for shape in layout:
            if len(shape) == 1:  # flat: rows made by a learned linear map
                embed.append(nn.Linear(shape[0], self.learned * r))
                positions.append(nn.Parameter(torch.zeros(self.learned, r)))
            else:
                width = shape[0] if channels_first and len(shape) >= 3 else shape[-1]
                embed.append(nn.Linear(width, r))
                positions.append(nn.Parameter(torch.randn(math.prod(shape) // width, r) * 0.1))
        self.embed, self.positions = nn.ModuleList(embed), nn.ParameterList(positions)
        self.key, self.value = mlp(r, r, r), mlp(r, r, r)
        self.query = mlp(query_dim, config.query_width, r)
        self.out = mlp(2 * r, config.query_width, n_classes)

    def rows(self, state: torch.Tensor) -> torch.Tensor:  # (B, n) -> (B, N, r)
        B, out = state.shape[0], []
        for part, shape, embed, pos in zip(state.split(self.sizes, 1), self.layout, self.embed, self.positions):
            if len(shape) == 1:
                rows = embed(part).view(B, self.learned, -1)
            else:
                t = part.view(B, *shape)
                if self.channels_first and len(shape) >= 3:
                    t = t.movedim(1, -1)
                rows = embed(t.reshape(B, -1, t.shape[-1]))
            out.append(rows + pos)
        return torch.cat(out, 1)

    def forward(self, state: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        rows = self.rows(state)
        B, N, r = rows.shape
        h = self.heads
        k = self.key(rows).view(B, N, h, r // h)
        v = self.value(rows).view(B, N, h, r // h)
        q = self.query(queries)  # (B, Q, r)
        weights = torch.einsum("bqhe,bnhe->bhqn", q.view(B, -1, h, r // h), k) / math.sqrt(r // h)
        read = torch.einsum("bhqn,bnhe->bqhe", weights.softmax(-1), v).reshape(B, -1, r)
        return self.out(torch.cat([read, q], -1))


def build_readout(name: str, layout: Layout, query_dim: int, n_classes: int, config) -> nn.Module:
    if name == "gated":
        return Gated(layout, query_dim, n_classes, config)
    if name == "mlp":
        return MLP(layout, query_dim, n_classes, config)
    if name == "bilinear":
        return Bilinear(layout, query_dim, n_classes, config)
    if name in ("attention", "attention_first"):
        return Attention(layout, query_dim, n_classes, config, channels_first=name == "attention_first")
    raise ValueError(f"unknown readout {name!r}; known: {', '.join(READOUTS)}")
