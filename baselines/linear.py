"""`linear`: causal linear attention with the ELU+1 feature map (Katharopoulos et al., 2020).

Token t reads phi(q_t) S_t / (phi(q_t) . z_t) where S_t = sum_{j<=t} phi(k_j) v_j^T and
z_t = sum_{j<=t} phi(k_j): a running state of fixed size (head_dim x head_dim per head),
so inference carries no cache that grows with the sequence. Training uses the chunked
form: within a chunk the masked quadratic product, across chunks the state summed over
earlier chunks. Both give the same numbers as the token-by-token recurrence.

A recurrent mixer (`tmem_bench.contracts.recurrent`): a task's `blocked` mask does not apply
to its state (the contract removes softmax edges only).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from tmem_bench.contracts.recurrent import RecurrentTransformer
from tmem_bench.contracts.transformer import TransformerConfig


@dataclass
class LinearConfig(TransformerConfig):
    chunk: int = 16  # training-time chunk of the quadratic form; does not change the function


def feature_map(x: torch.Tensor) -> torch.Tensor:
    return F.elu(x) + 1.0


def linear_attention_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int, eps: float = 1e-6):
    """Causal linear attention of already feature-mapped q, k (B, h, S, e) and v (B, h, S, e_v)."""
    B, H, S, E = q.shape
    pad = (-S) % chunk
    if pad:
        # Padding sits after every real token, so it only reaches padded queries.
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    N = (S + pad) // chunk
    q, k, v = (t.reshape(B, H, N, chunk, t.shape[-1]) for t in (q, k, v))  # (B, h, N, C, e)
    kv = k.transpose(-1, -2) @ v  # (B, h, N, e, e_v): each chunk's contribution to the state
    ksum = k.sum(-2)  # (B, h, N, e)
    # The state before each chunk: an exclusive prefix sum, built by shifting so that no
    # later chunk enters it even through rounding (cumsum - kv would).
    state = F.pad(kv.cumsum(2), (0, 0, 0, 0, 1, 0))[:, :, :N]
    norm_state = F.pad(ksum.cumsum(2), (0, 0, 1, 0))[:, :, :N]
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    scores = (q @ k.transpose(-1, -2)).masked_fill(~causal, 0.0)  # (B, h, N, C, C)
    num = q @ state + scores @ v  # (B, h, N, C, e_v)
    den = (q * norm_state[:, :, :, None]).sum(-1) + scores.sum(-1)  # (B, h, N, C)
    out = num / (den[..., None] + eps)
    return out.reshape(B, H, N * chunk, -1)[:, :, :S]


def linear_attention_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float = 1e-6):
    """The same function token by token with the running state: the reference the chunked form must match."""
    B, H, S, E = q.shape
    state = q.new_zeros(B, H, E, v.shape[-1])
    norm = q.new_zeros(B, H, E)
    outs = []
    for t in range(S):
        state = state + k[:, :, t, :, None] * v[:, :, t, None, :]
        norm = norm + k[:, :, t]
        num = (q[:, :, t, :, None] * state).sum(-2)  # (B, h, e_v)
        den = (q[:, :, t] * norm).sum(-1, keepdim=True)
        outs.append(num / (den + eps))
    return torch.stack(outs, dim=2)


class LinearAttention(nn.Module):
    def __init__(self, config: LinearConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.chunk = config.chunk
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, mask=None) -> torch.Tensor:
        B, S, D = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)  # (B, h, S, hd)
        y = linear_attention_chunked(feature_map(q), feature_map(k), v, self.chunk)
        y = y.transpose(1, 2).reshape(B, S, D)
        return self.resid_dropout(self.proj(y))

    def final_state(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """S (B, h, hd, hd) and z (B, h, hd) after the last token of x (the state hook)."""
        B, S, D = x.shape
        _, k, v = self.qkv(x).view(B, S, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)
        k = feature_map(k)
        return {"S": k.transpose(-1, -2) @ v, "z": k.sum(-2)}


class LinearTransformer(RecurrentTransformer):
    config_class = LinearConfig

    def make_mixer(self, config: LinearConfig) -> nn.Module:
        return LinearAttention(config)

    def state_size(self, seq_len: int, bytes_per_element: int = 4) -> int:
        """Bytes carried between tokens: per layer and head, S (hd x hd) and z (hd); independent of seq_len."""
        c = self.config
        return c.n_layers * c.n_heads * (c.head_dim * c.head_dim + c.head_dim) * bytes_per_element


linear = LinearTransformer.build
