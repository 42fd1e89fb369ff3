"""The fast Tensor Memory scan: one autograd Function for a whole sequence.

Autograd would record about 40 small ops per memory step; here the forward loop
runs without a graph and the backward loop is written by hand, so one scan is one
autograd node. Each loop body is a pure tensor function (`forward_step`,
`backward_step`) that torch.compile can fuse into a few kernels; it is compiled
once per process (the body, never the unrolled loop), with dynamic shapes so that
training, evaluation and probe batches share one compilation, and it falls back to
eager PyTorch whenever compilation is unavailable or fails.

Volumes are channel-last, (B, D, H, W, C): the depthwise 3-tap convolutions become
shifted multiply-adds over contiguous channel vectors and the pointwise mix is one
(B*D*H*W, 2C) @ (2C, 4C) matmul. The write half of the memory operator is linear
and separable, so the caller convolves its 1D factors outside the loop and passes
them in (`cyz`, `ux`, `bvol`); the volume is formed inside the step, where a
compiled kernel never writes it to memory.
"""
from __future__ import annotations

import os
import warnings

import torch
import torch.nn.functional as F

KERNELS = ("auto", "compiled", "eager")


# Inductor's CPU tanh is several times slower than exp; these forms vectorise.
def _sigmoid(x):
    return 1.0 / (1.0 + torch.exp(-x))


def _tanh(x):
    return 2.0 / (1.0 + torch.exp(-2.0 * x)) - 1.0


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


def _gates(h, cyz, ux, bvol, taps, biases, mix_w, mix_b, factorised: bool):
    w = cyz.unsqueeze(3) * ux[:, None, None] + bvol  # (B, D, H, W, C)
    if factorised:
        a = conv_axis(h, 1, taps[0], biases[0])
        b = conv_axis(a, 2, taps[1], biases[1])
        hc = conv_axis(b, 3, taps[2], biases[2])
    else:
        a = b = hc = h
    x = torch.cat([w, hc], dim=-1)  # (B, D, H, W, 2C)
    z = torch.addmm(mix_b, x.flatten(0, 3), mix_w).view(*h.shape[:4], -1)  # (B, D, H, W, 4C)
    return w, a, b, x, z


def forward_step(h, c, cyz, ux, bvol, taps, biases, mix_w, mix_b, factorised: bool):
    """One memory write: (h, c) -> (h', c'), all (B, D, H, W, C)."""
    _, _, _, _, z = _gates(h, cyz, ux, bvol, taps, biases, mix_w, mix_b, factorised)
    i, f, o, g = z.chunk(4, dim=-1)
    c_new = _sigmoid(f) * c + _sigmoid(i) * _tanh(g)
    return _sigmoid(o) * _tanh(c_new), c_new


def backward_step(h, c, cyz, ux, bvol, taps, biases, mix_w, mix_b, dh_new, dc_new, factorised: bool):
    """Gradients of one write from those of (h', c'); the gates are recomputed, not stored."""
    w, a, b, x, z = _gates(h, cyz, ux, bvol, taps, biases, mix_w, mix_b, factorised)
    i, f, o, g = z.chunk(4, dim=-1)
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
    return dh, dc_tot * sf, d_cyz, d_ux, d_bvol, d_taps, d_biases, d_mix_w, d_mix_b


_compiled: dict[str, object] = {}
_compile_failed: list[str] = []


def compiled_available() -> bool:
    return not _compile_failed and os.environ.get("TMEM_BENCH_NO_COMPILE", "") in ("", "0")


def _step_functions(kernel: str):
    if kernel == "eager" or (kernel == "auto" and not compiled_available()):
        return forward_step, backward_step, False
    if not _compiled:
        _compiled["forward"] = torch.compile(forward_step, dynamic=True)
        _compiled["backward"] = torch.compile(backward_step, dynamic=True)
    return _compiled["forward"], _compiled["backward"], True


def _call(name: str, fn, eager_fn, compiled: bool, kernel: str, *args):
    """Run a step, falling back to eager (for the rest of the process) if compilation fails."""
    if not compiled:
        return eager_fn(*args)
    try:
        return fn(*args)
    except Exception as e:  # inductor needs a working C++ toolchain; anything else it lacks lands here too
        if kernel == "compiled":
            raise
        _compile_failed.append(f"{name}: {type(e).__name__}: {e}")
        warnings.warn(f"torch.compile of the Tensor Memory step failed, using eager PyTorch: {type(e).__name__}: {e}")
        return eager_fn(*args)


class TensorMemoryScan(torch.autograd.Function):
    """(h0, c0) and N writes -> states h_0..h_{N-1} (what each chunk reads) and (h_N, c_N)."""

    @staticmethod
    def forward(ctx, cyz, ux, bvol, h0, c0, taps, biases, mix_w, mix_b, factorised: bool, kernel: str):
        # cyz (N, B, D, H, C), ux (N, B, W, C), bvol (H, W, C), h0 / c0 (B, D, H, W, C)
        fwd, _, compiled = _step_functions(kernel)
        N = cyz.shape[0]
        hs = h0.new_empty((N, *h0.shape))  # (N, B, D, H, W, C)
        cs = []
        h, c = h0, c0
        for n in range(N):
            hs[n].copy_(h)
            cs.append(c)
            h, c = _call("forward", fwd, forward_step, compiled, kernel,
                         h, c, cyz[n], ux[n], bvol, taps, biases, mix_w, mix_b, factorised)
        ctx.save_for_backward(cyz, ux, bvol, taps, biases, mix_w, mix_b, hs, *cs)
        ctx.factorised, ctx.kernel = factorised, kernel
        return hs, h, c

    @staticmethod
    def backward(ctx, d_hs, d_hN, d_cN):
        cyz, ux, bvol, taps, biases, mix_w, mix_b, hs, *cs = ctx.saved_tensors
        _, bwd, compiled = _step_functions(ctx.kernel)
        N = cyz.shape[0]
        dh = torch.zeros_like(hs[0]) if d_hN is None else d_hN
        dc = torch.zeros_like(hs[0]) if d_cN is None else d_cN
        d_cyz, d_ux = torch.empty_like(cyz), torch.empty_like(ux)
        # Weight gradients are summed per step, then across steps: staged summation
        # keeps them at the fp32 error of a single reduction.
        parts = []
        for n in reversed(range(N)):
            out = _call("backward", bwd, backward_step, compiled, ctx.kernel,
                        hs[n], cs[n], cyz[n], ux[n], bvol, taps, biases, mix_w, mix_b, dh, dc, ctx.factorised)
            dh, dc, d_cyz[n], d_ux[n] = out[:4]
            parts.append(out[4:])
            if d_hs is not None:
                dh = dh + d_hs[n]
        d_bvol, d_taps, d_biases, d_mix_w, d_mix_b = (torch.stack(p).sum(0) for p in zip(*parts))
        return d_cyz, d_ux, d_bvol, dh, dc, d_taps, d_biases, d_mix_w, d_mix_b, None, None


def scan(cyz, ux, bvol, h0, c0, taps, biases, mix_w, mix_b, factorised: bool, kernel: str = "auto"):
    return TensorMemoryScan.apply(cyz, ux, bvol, h0, c0, taps, biases, mix_w, mix_b, factorised, kernel)
