"""`delta`: the gated delta rule (Gated DeltaNet, Yang, Kautz and Hatamizadeh, 2024) in place of attention.

Each head keeps a matrix state S (head_dim x head_dim). Token t decays it by
alpha_t, erases what S held under its key k_t with strength beta_t, and writes
its value there:

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t

(S is kept keys-by-values, so S^T q reads a value; the transposed convention
writes the same rule as v k^T.) Keys and queries are L2-normalised, so the erase
is a projection; alpha_t = exp(-exp(A_log) softplus(a_t + dt_bias)) and
beta_t = sigmoid(b_t) come from the token, one per head. As is standard, q, k, v
pass through a short causal depthwise convolution and SiLU first, and the read
goes through a per-head RMSNorm gated by SiLU of another projection.

Training uses the chunked (WY) form: inside a chunk the erase-and-write updates
are solved at once with one unit-lower-triangular system (the UT transform),
across chunks the state is carried. `gated_delta_recurrent` is the same function
token by token, the reference the chunked form must match.

A recurrent mixer (`tmem_bench.contracts.recurrent`): a task's `blocked` mask has no
attention edges to remove here. The factory solves the MLP width so that the model
has the parameter count of `tensor` (default memory) at the same d_model, n_layers
and n_heads (`tmem_bench.tensor_memory.params`); pass `mlp_ratio` to choose the
width yourself.
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
class DeltaConfig(TransformerConfig):
    chunk: int = 16  # longest training-time chunk of the parallel form; does not change the function
    conv: int = 4  # kernel of the short convolution on q, k, v


def gated_delta_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk: int,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gated delta rule, parallel within chunks of `chunk` tokens and recurrent across them.

    q, k: (B, h, S, dk); v: (B, h, S, dv); g: (B, h, S) log decay (log alpha, <= 0);
    beta: (B, h, S) write strength; initial_state: (B, h, dk, dv) or None for zeros.
    Returns the reads (B, h, S, dv) and the state after the last token (B, h, dk, dv), or
    None without `output_final_state` (training needs no final state, and skips building it).
    """
    B, H, S, K = k.shape
    V = v.shape[-1]
    pad = (-S) % chunk
    if pad:
        # A padded token has k = 0, beta = 0 and alpha = 1: it leaves the state as it was.
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = (F.pad(t, (0, pad)) for t in (g, beta))
    N = (S + pad) // chunk
    q, k, v = (t.reshape(B, H, N, chunk, t.shape[-1]) for t in (q, k, v))  # (B, h, N, C, e)
    g, beta = (t.reshape(B, H, N, chunk) for t in (g, beta))  # (B, h, N, C)

    G = g.cumsum(-1)  # log decay from the chunk's start through each token
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    # exp(G_r - G_i) for i <= r, exactly 0 above the diagonal (the exponent is masked before exp).
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # (B, h, N, C, C)

    # Within a chunk the writes u_r = beta_r (v_r - alpha_r S_{r-1}^T k_r) depend on the earlier
    # ones through (I + A) U = diag(beta) V - diag(beta exp(G)) K S_0, A strictly lower triangular.
    A = (beta[..., None] * decay * (k @ k.transpose(-1, -2))).tril(-1)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    rhs = torch.cat([beta[..., None] * v, (beta * G.exp())[..., None] * k], dim=-1)
    solved = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    u0, w = solved.split([V, K], dim=-1)  # U = u0 - w S_0: (B, h, N, C, dv), (B, h, N, C, dk)

    scores = (q @ k.transpose(-1, -2)) * decay  # (B, h, N, C, C)
    q_decayed = q * G.exp()[..., None]  # reads of the state the chunk started from
    k_decayed = k * (G[..., -1:] - G).exp()[..., None]  # each write as it stands at the chunk's end
    state = initial_state  # None while it is zero: the first chunk then skips reading it
    outs = []
    for n in range(N):
        if state is None:
            u = u0[:, :, n]  # (B, h, C, dv)
            outs.append(scores[:, :, n] @ u)
        else:
            u = u0[:, :, n] - w[:, :, n] @ state
            outs.append(q_decayed[:, :, n] @ state + scores[:, :, n] @ u)
        if n == N - 1 and not output_final_state:
            break
        written = k_decayed[:, :, n].transpose(-1, -2) @ u  # (B, h, dk, dv)
        state = written if state is None else G[:, :, n, -1, None, None].exp() * state + written
    o = torch.stack(outs, dim=2).reshape(B, H, N * chunk, V)[:, :, :S]
    return o, state if output_final_state else None


def gated_delta_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`gated_delta_chunked` token by token (same arguments, no chunk): the reference it must match."""
    B, H, S, K = k.shape
    state = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state
    outs = []
    for t in range(S):
        state = g[:, :, t, None, None].exp() * state
        kt = k[:, :, t]  # (B, h, dk)
        u = beta[:, :, t, None] * (v[:, :, t] - (kt[..., None] * state).sum(-2))  # (B, h, dv)
        state = state + kt[..., :, None] * u[..., None, :]
        outs.append((q[:, :, t, :, None] * state).sum(-2))
    return torch.stack(outs, dim=2), state


class GatedDeltaNet(nn.Module):
    def __init__(self, config: DeltaConfig):
        super().__init__()
        d, h = config.d_model, config.n_heads
        self.n_heads = h
        self.chunk = config.chunk
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.conv = ShortConv(3 * d, config.conv, bias=False)
        self.decay_and_strength = nn.Linear(d, 2 * h, bias=False)
        self.A_log = nn.Parameter(torch.empty(h).uniform_(1.0, 16.0).log())
        self.dt_bias = nn.Parameter(inverse_softplus_dt(h))
        self.gate = nn.Linear(d, d, bias=False)
        self.norm = nn.RMSNorm(config.head_dim, eps=1e-5)
        self.proj = nn.Linear(d, d, bias=False)
        self.resid_dropout = nn.Dropout(config.dropout)

    def rule_inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k, v (B, h, S, hd), the log decay g and the write strength beta (B, h, S) of tokens x."""
        B, S, D = x.shape
        h, hd = self.n_heads, D // self.n_heads
        qkv = F.silu(self.conv(self.qkv(x)))
        q, k, v = qkv.view(B, S, 3, h, hd).permute(2, 0, 3, 1, 4)  # (B, h, S, hd) each
        q = F.normalize(q, dim=-1) * hd ** -0.5
        k = F.normalize(k, dim=-1)
        a, b = self.decay_and_strength(x).transpose(1, 2).chunk(2, dim=1)  # (B, h, S) each
        g = -self.A_log.exp()[:, None] * F.softplus(a + self.dt_bias[:, None])
        return q, k, v, g, torch.sigmoid(b)

    def forward(self, x: torch.Tensor, mask=None) -> torch.Tensor:
        B, S, D = x.shape
        h, hd = self.n_heads, D // self.n_heads
        chunk = balanced_chunk(S, self.chunk)
        o, _ = gated_delta_chunked(*self.rule_inputs(x), chunk, output_final_state=False)  # (B, h, S, hd)
        o = self.norm(o.transpose(1, 2)) * F.silu(self.gate(x)).view(B, S, h, hd)  # (B, S, h, hd)
        return self.resid_dropout(self.proj(o.reshape(B, S, D)))

    def final_state(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every head's S (B, h, hd, hd) after the last token of x (the state hook); the short
        convolution's buffer of the last few inputs is not part of it."""
        _, state = gated_delta_chunked(*self.rule_inputs(x), balanced_chunk(x.shape[1], self.chunk))
        return {"S": state}


class DeltaTransformer(RecurrentTransformer):
    config_class = DeltaConfig

    def make_mixer(self, config: DeltaConfig) -> nn.Module:
        return GatedDeltaNet(config)

    def state_size(self, seq_len: int, bytes_per_element: int = 4) -> int:
        """Bytes carried between tokens, independent of seq_len: per layer, every head's S
        (head_dim x head_dim) and the convolution's last kernel-1 inputs (3 d_model channels)."""
        c = self.config
        per_layer = c.n_heads * c.head_dim * c.head_dim + (c.conv - 1) * 3 * c.d_model
        return c.n_layers * per_layer * bytes_per_element


def delta(d_model: int, n_layers: int, n_heads: int, **options) -> DeltaTransformer:
    """`options`: DeltaConfig's fields; without `mlp_ratio` the MLP width is matched to `tensor`."""
    return build_matched(DeltaTransformer, d_model, n_layers, n_heads, **options)
