"""`ssm`: a selective state space layer in the Mamba-2 form (Dao and Gu, 2024) in place of attention.

Each head keeps a state H (head_dim x d_state) with one scalar decay per token:

    H_t = exp(dt_t A) H_{t-1} + dt_t x_t B_t^T,    y_t = H_t C_t + D x_t

where the step dt_t = softplus(. + dt_bias) (one per head), the input matrix B_t
and the output matrix C_t (d_state each, shared by the heads) come from the
token, and A = -exp(A_log) < 0. As in Mamba-2, one projection gives x, B, C, dt
and a gate z; x, B and C pass through a short causal depthwise convolution and
SiLU; the heads span expand * d_model channels; the output is RMSNorm(y * SiLU(z))
projected back to d_model.

Training uses the chunked state space dual (SSD) form: inside a chunk the masked
product (C B^T weighted by the decays between tokens) applied to x, across chunks
the states each chunk leaves, decayed to where they are read and summed in one
product. `ssd_recurrent` is the same function token by token, the reference the
chunked form must match.

As for `delta`: `blocked` is accepted and ignored (no attention edges, so under
memory forcing information reaches the queries only through the state), and the
MLP width is solved to `tensor`'s parameter count unless `mlp_ratio` is given.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from tmem_bench.contracts.recurrent import RecurrentTransformer, ShortConv, balanced_chunk, inverse_softplus_dt
from tmem_bench.contracts.transformer import TransformerConfig
from tmem_bench.tensor_memory.params import build_matched


@dataclass
class SSMConfig(TransformerConfig):
    d_state: int = 64  # Mamba-2's state size per head channel
    expand: int = 2  # the heads span expand * d_model channels
    chunk: int = 64  # longest training-time chunk of the SSD form; does not change the function
    conv: int = 4  # kernel of the short convolution on x, B, C

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model


def segment_sums(a: torch.Tensor) -> torch.Tensor:
    """(..., T) -> (..., T, T): sum of a over (j, i] at [i, j] for j <= i, -inf above the diagonal."""
    T = a.shape[-1]
    A = a.cumsum(-1)
    causal = torch.ones(T, T, dtype=torch.bool, device=a.device).tril()
    return (A[..., :, None] - A[..., None, :]).masked_fill(~causal, float("-inf"))


def ssd_chunked(
    x: torch.Tensor,
    a: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk: int,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The scalar-decay state space recurrence H_t = exp(a_t) H_{t-1} + x_t B_t^T, y_t = H_t C_t,
    parallel within chunks of `chunk` tokens and across them.

    x: (b, h, S, P) inputs (already scaled by the step); a: (b, h, S) log decays (<= 0);
    B, C: (b, h or 1, S, N), a size-1 head dimension shared by every head;
    initial_state: (b, h, P, N) or None for zeros.
    Returns y (b, h, S, P) and the state after the last token (b, h, P, N), or None
    without `output_final_state` (training needs no final state, and skips building it).
    """
    b, h, S, P = x.shape
    N = B.shape[-1]
    pad = (-S) % chunk
    if pad:
        # A padded token has x = 0 and a = 0: it leaves the state as it was.
        x, B, C = (F.pad(t, (0, 0, 0, pad)) for t in (x, B, C))
        a = F.pad(a, (0, pad))
    n = (S + pad) // chunk
    x, B, C = (t.reshape(t.shape[0], t.shape[1], n, chunk, t.shape[-1]) for t in (x, B, C))  # (b, h, n, c, e)
    a = a.reshape(b, h, n, chunk)

    A = a.cumsum(-1)  # log decay from the chunk's start through each token
    y = ((C @ B.transpose(-1, -2)) * segment_sums(a).exp()) @ x  # (b, h, n, c, P): within each chunk
    m = n if output_final_state else n - 1  # the chunks whose leaving state is read
    if initial_state is None and m == 0:
        return y.reshape(b, h, n * chunk, P)[:, :, :S], None
    # The state each chunk leaves from its own tokens, then the state entering every chunk:
    # the initial state and the earlier chunks' states, decayed across the chunks in between.
    left = (x[:, :, :m] * (A[:, :, :m, -1:] - A[:, :, :m]).exp()[..., None]).transpose(-1, -2) @ B[:, :, :m]
    start = x.new_zeros(b, h, 1, P, N) if initial_state is None else initial_state[:, :, None]
    states = torch.cat([start, left], dim=2)  # (b, h, m + 1, P, N)
    across = segment_sums(F.pad(A[:, :, :m, -1], (1, 0))).exp()  # (b, h, m + 1, m + 1)
    states = (across @ states.flatten(-2)).view(b, h, m + 1, P, N)
    y = y + (C @ states[:, :, :n].transpose(-1, -2)) * A.exp()[..., None]
    return y.reshape(b, h, n * chunk, P)[:, :, :S], states[:, :, n] if output_final_state else None


def ssd_recurrent(
    x: torch.Tensor,
    a: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`ssd_chunked` token by token (same arguments, no chunk): the reference it must match."""
    b, h, S, P = x.shape
    state = x.new_zeros(b, h, P, B.shape[-1]) if initial_state is None else initial_state
    outs = []
    for t in range(S):
        state = a[:, :, t, None, None].exp() * state + x[:, :, t, :, None] * B[:, :, t, None, :]
        outs.append((state * C[:, :, t, None, :]).sum(-1))
    return torch.stack(outs, dim=2), state


class Mamba2(nn.Module):
    def __init__(self, config: SSMConfig):
        super().__init__()
        d, h, di, n = config.d_model, config.n_heads, config.d_inner, config.d_state
        self.n_heads = h
        self.chunk = config.chunk
        self.sizes = [di, di + 2 * n, h]  # the gate z; x, B and C (convolved together); dt
        self.conv_sizes = [di, n, n]  # x, B, C
        self.in_proj = nn.Linear(d, 2 * di + 2 * n + h, bias=False)
        self.conv = ShortConv(di + 2 * n, config.conv, bias=True)
        self.dt_bias = nn.Parameter(inverse_softplus_dt(h))
        self.A_log = nn.Parameter(torch.empty(h).uniform_(1.0, 16.0).log())
        self.D = nn.Parameter(torch.ones(h))
        self.norm = nn.RMSNorm(di, eps=1e-5)
        self.out_proj = nn.Linear(di, d, bias=False)
        self.resid_dropout = nn.Dropout(config.dropout)

    def scan_inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The gate z (b, S, d_inner), the inputs u (b, h, S, P), the step dt and log decay a
        (b, h, S), and B, C (b, 1, S, N) of tokens x."""
        b, S, _ = x.shape
        z, xBC, dt = self.in_proj(x).split(self.sizes, dim=-1)
        u, B, C = F.silu(self.conv(xBC)).split(self.conv_sizes, dim=-1)
        u = u.view(b, S, self.n_heads, -1).transpose(1, 2)  # (b, h, S, P)
        dt = F.softplus(dt + self.dt_bias).transpose(1, 2)  # (b, h, S)
        a = -self.A_log.exp()[:, None] * dt
        return z, u, dt, a, B[:, None], C[:, None]

    def forward(self, x: torch.Tensor, mask=None) -> torch.Tensor:
        b, S, _ = x.shape
        z, u, dt, a, B, C = self.scan_inputs(x)
        chunk = balanced_chunk(S, self.chunk)
        y, _ = ssd_chunked(u * dt[..., None], a, B, C, chunk, output_final_state=False)
        y = y + self.D[:, None, None] * u
        y = self.norm(y.transpose(1, 2).reshape(b, S, -1) * F.silu(z))  # (b, S, d_inner)
        return self.resid_dropout(self.out_proj(y))

    def final_state(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every head's H (b, h, P, N) after the last token of x (the state hook); the short
        convolution's buffer of the last few inputs is not part of it."""
        _, u, dt, a, B, C = self.scan_inputs(x)
        _, state = ssd_chunked(u * dt[..., None], a, B, C, balanced_chunk(x.shape[1], self.chunk))
        return {"H": state}


class SSMTransformer(RecurrentTransformer):
    config_class = SSMConfig

    def make_mixer(self, config: SSMConfig) -> nn.Module:
        return Mamba2(config)

    def state_size(self, seq_len: int, bytes_per_element: int = 4) -> int:
        """Bytes carried between tokens, independent of seq_len: per layer, every head's H
        (head_dim x d_state) and the convolution's last kernel-1 inputs (x, B and C)."""
        c = self.config
        per_layer = c.d_inner * c.d_state + (c.conv - 1) * (c.d_inner + 2 * c.d_state)
        return c.n_layers * per_layer * bytes_per_element


def ssm(d_model: int, n_layers: int, n_heads: int, **options) -> SSMTransformer:
    """`options`: SSMConfig's fields; without `mlp_ratio` the MLP width is matched to `tensor`."""
    return build_matched(SSMTransformer, d_model, n_layers, n_heads, **options)
