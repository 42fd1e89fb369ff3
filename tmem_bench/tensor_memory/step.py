"""The Tensor Memory step in PyTorch: one chunk's read and gated write, and its hand-written backward.

Pure tensor functions, so that torch.compile can fuse each into a few kernels
(`torch_scan` compiles them) and `_scan.c` can follow them line for line.

Volumes are channel-last, (B, D, H, W, C): the depthwise 3-tap convolutions become
shifted multiply-adds over contiguous channel vectors and the pointwise mix is one
(B*D*H*W, 2C) @ (2C, 4C) matmul. The write half of the memory operator is linear
and separable, so the caller convolves its 1D factors outside the loop and passes
the (D, H) part formed (`cyz`) with the W factor; the step forms the full write
volume, where a compiled kernel never writes it to memory.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


# Inductor's CPU tanh is several times slower than exp; these forms vectorise.
# tanh goes through expm1, which keeps its relative precision near 0, where
# 2 / (1 + exp(-2x)) - 1 cancels (it cost some gradients a few 1e-6).
def _sigmoid(x):
    return 1.0 / (1.0 + torch.exp(-x))


def _tanh(x):
    e = torch.expm1(-2.0 * x.abs())
    return torch.copysign(-e / (2.0 + e), x)


def _shifted(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x[i-1], x[i], x[i+1]) along `dim` with zero padding."""
    n = x.shape[dim]
    pad = [0, 0] * (x.dim() - 1 - dim) + [1, 1]
    xp = F.pad(x, pad)
    return xp.narrow(dim, 0, n), x, xp.narrow(dim, 2, n)


def conv_axis(x: torch.Tensor, dim: int, taps: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Depthwise 3-tap cross-correlation along `dim` of a channel-last volume; taps (3, C)."""
    prev, mid, nxt = _shifted(x, dim)
    return prev * taps[0] + mid * taps[1] + nxt * taps[2] + bias


def conv_axis_backward(dy: torch.Tensor, x: torch.Tensor, dim: int, taps: torch.Tensor):
    """(dx, dtaps (3, C), dbias (C,)) of `conv_axis`."""
    prev, mid, nxt = _shifted(x, dim)
    dprev, dmid, dnxt = _shifted(dy, dim)
    dx = dnxt * taps[0] + dmid * taps[1] + dprev * taps[2]
    reduce = tuple(range(dy.dim() - 1))
    dtaps = torch.stack([(dy * prev).sum(reduce), (dy * mid).sum(reduce), (dy * nxt).sum(reduce)])
    return dx, dtaps, dy.sum(reduce)


def _operator_input(h, cyz, ux, bvol, taps, biases, factorised: bool):
    """[write volume, h] after the depthwise convs, and the two intermediate conv outputs."""
    w = cyz.unsqueeze(3) * ux[:, None, None] + bvol  # (B, D, H, W, C)
    if factorised:
        a = conv_axis(h, 1, taps[0], biases[0])
        b = conv_axis(a, 2, taps[1], biases[1])
        hc = conv_axis(b, 3, taps[2], biases[2])
    else:
        a = b = hc = h
    return torch.cat([w, hc], dim=-1), a, b  # (B, D, H, W, 2C)


def forward_step(h, c, cyz, ux, bvol, w3, taps, biases, mix_w, mix_b, factorised: bool):
    """Read h at the chunk's read point (weights w3 (B, D, H, W)), then write:
    (h, c) -> (h', c'), all (B, D, H, W, C). Also returns the gate pre-activations z."""
    r = (h * w3.unsqueeze(-1)).sum((1, 2, 3))  # (B, C)
    x, _, _ = _operator_input(h, cyz, ux, bvol, taps, biases, factorised)
    # mm, not addmm: addmm first copies the broadcast bias into its output; the bias
    # is added inside the fused gate kernel instead.
    z = torch.mm(x.flatten(0, 3), mix_w).view(*h.shape[:4], -1)  # (B, D, H, W, 4C), without the bias
    i, f, o, g = (z + mix_b).chunk(4, dim=-1)
    c_new = _sigmoid(f) * c + _sigmoid(i) * _tanh(g)
    return _sigmoid(o) * _tanh(c_new), c_new, z, r


def backward_step(h, c, z, cyz, ux, bvol, w3, taps, biases, mix_w, mix_b, dh_new, dc_new, dr, factorised: bool):
    """Gradients of one read-and-write from those of (h', c') and of the read r."""
    x, a, b = _operator_input(h, cyz, ux, bvol, taps, biases, factorised)
    i, f, o, g = (z + mix_b).chunk(4, dim=-1)
    si, sf, so, tg = _sigmoid(i), _sigmoid(f), _sigmoid(o), _tanh(g)
    c_new = sf * c + si * tg
    tc = _tanh(c_new)
    dc_tot = dc_new + dh_new * so * (1 - tc * tc)
    dz = torch.cat([
        dc_tot * tg * si * (1 - si),
        dc_tot * c * sf * (1 - sf),
        dh_new * tc * so * (1 - so),
        dc_tot * si * (1 - tg * tg),
    ], dim=-1).flatten(0, 3)  # (M, 4C)
    dx = (dz @ mix_w.t()).view(x.shape)  # (B, D, H, W, 2C)
    C = h.shape[-1]
    dw, dhc = dx[..., :C], dx[..., C:]
    d_mix_w = x.flatten(0, 3).t() @ dz  # (2C, 4C)
    d_mix_b = dz.sum(0)
    d_cyz = (dw * ux[:, None, None]).sum(3)  # (B, D, H, C)
    d_ux = (dw * cyz.unsqueeze(3)).sum((1, 2))  # (B, W, C)
    d_bvol = dw.sum((0, 1))  # (H, W, C)
    if factorised:
        db, dt_w, db_w = conv_axis_backward(dhc, b, 3, taps[2])
        da, dt_h, db_h = conv_axis_backward(db, a, 2, taps[1])
        dh, dt_d, db_d = conv_axis_backward(da, h, 1, taps[0])
        d_taps = torch.stack([dt_d, dt_h, dt_w])
        d_biases = torch.stack([db_d, db_h, db_w])
    else:
        dh = dhc
        d_taps, d_biases = torch.zeros_like(taps), torch.zeros_like(biases)
    dr_ = dr[:, None, None, None, :]
    dh = dh + dr_ * w3.unsqueeze(-1)
    d_w3 = (dr_ * h).sum(-1)  # (B, D, H, W)
    return dh, dc_tot * sf, d_cyz, d_ux, d_w3, d_bvol, d_taps, d_biases, d_mix_w, d_mix_b
