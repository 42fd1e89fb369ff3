"""The Tensor Memory scan in PyTorch: one autograd Function for a whole sequence.

Autograd would record about 40 small ops per memory step; here the forward loop
runs without a graph and the backward loop is written by hand (`step`), so one
scan is one autograd node. Each loop body is compiled once per process (the body,
never the unrolled loop), with a dynamic batch dimension so that training,
evaluation and probe batches share one compilation, and falls back to eager
PyTorch whenever compilation is unavailable or fails.
"""
from __future__ import annotations

import os
import warnings

import torch

from .step import backward_step, forward_step


# Arguments of each step whose first dimension is the batch: only that dimension is
# compiled as dynamic, so channels and grid stay constants the kernels specialise on.
_BATCH_ARGS = {"forward": (0, 1, 2, 3, 5), "backward": (0, 1, 2, 3, 4, 6, 11, 12, 13)}
# With more inputs, inductor lowers a cat to one masked pointwise loop that
# evaluates every branch; realising each part into its slice is much faster here.
_INDUCTOR_OPTIONS = {"max_pointwise_cat_inputs": 1}

BATCH_TILE = 64

_compiled: dict[str, object] = {}
_compile_failed: list[str] = []


def compiled_available() -> bool:
    return not _compile_failed and os.environ.get("TMEM_BENCH_NO_COMPILE", "") in ("", "0")


def _step_functions(kernel: str):
    if kernel == "eager" or (kernel == "auto" and not compiled_available()):
        return forward_step, backward_step, False
    if not _compiled:
        _compiled["forward"] = torch.compile(forward_step, options=_INDUCTOR_OPTIONS)
        _compiled["backward"] = torch.compile(backward_step, options=_INDUCTOR_OPTIONS)
    return _compiled["forward"], _compiled["backward"], True


def _call(name: str, fn, eager_fn, compiled: bool, kernel: str, *args):
    """Run a step, falling back to eager (for the rest of the process) if compilation fails."""
    if not compiled or (kernel == "auto" and _compile_failed):
        return eager_fn(*args)
    for i in _BATCH_ARGS[name]:
        torch._dynamo.maybe_mark_dynamic(args[i], 0)
    try:
        return fn(*args)
    except Exception as e:  # inductor needs a working C++ toolchain; anything else it lacks lands here too
        if kernel == "compiled":
            raise
        _compile_failed.append(f"{name}: {type(e).__name__}: {e}")
        warnings.warn(f"torch.compile of the Tensor Memory step failed, using eager PyTorch: {type(e).__name__}: {e}")
        return eager_fn(*args)


def batch_tiles(batch: int, tile: int) -> list[tuple[int, int]]:
    """Balanced [start, end) slices of at most `tile` sequences each."""
    n = -(-batch // tile)
    bounds = [batch * i // n for i in range(n + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


class TensorMemoryScan(torch.autograd.Function):
    """(h0, c0), N read points and N writes -> N reads (each before its chunk's write) and (h_N, c_N).

    On CPU the batch is scanned in tiles of BATCH_TILE sequences, each tile through
    all steps before the next: a tile's state, gates and gradients stay in cache
    between the step's kernels. On a 2-core CPU at 2 threads, a training step at
    batch 128 measured 5-10% faster with tiles of 64 than with 16 (fewer, larger
    kernel calls) or with one tile of 128
    (`python benchmarks/bench_tensor_step.py --threads 2 --tiles 16,128`).
    """

    @staticmethod
    def forward(ctx, cyz, ux, bvol, w3, h0, c0, taps, biases, mix_w, mix_b, factorised: bool, kernel: str,
                keep: bool):
        # cyz (N, B, D, H, C), ux (N, B, W, C), bvol (H, W, C), w3 (N, B, D, H, W), h0 / c0 (B, D, H, W, C)
        ctx.factorised, ctx.kernel = factorised, kernel
        fwd, _, compiled = _step_functions(kernel)
        N, B = cyz.shape[:2]
        # Tiles are a CPU cache measure; a GPU wants the whole batch in each kernel.
        tiles = batch_tiles(B, BATCH_TILE if h0.device.type == "cpu" else B)
        reads = h0.new_empty((N, B, h0.shape[-1]))  # (N, B, C)
        hN, cN = torch.empty_like(h0), torch.empty_like(c0)
        saved = []
        for b0, b1 in tiles:
            h, c = h0[b0:b1], c0[b0:b1]
            for n in range(N):
                h_new, c_new, z, reads[n, b0:b1] = _call(
                    "forward", fwd, forward_step, compiled, kernel,
                    h, c, cyz[n, b0:b1], ux[n, b0:b1], bvol, w3[n, b0:b1], taps, biases, mix_w, mix_b, factorised)
                if keep:
                    saved += [h, c, z]
                h, c = h_new, c_new
            hN[b0:b1], cN[b0:b1] = h, c
        ctx.save_for_backward(cyz, ux, bvol, w3, taps, biases, mix_w, mix_b, *saved)
        ctx.tiles = tiles
        return reads, hN, cN

    @staticmethod
    def backward(ctx, d_reads, d_hN, d_cN):
        cyz, ux, bvol, w3, taps, biases, mix_w, mix_b, *saved = ctx.saved_tensors
        _, bwd, compiled = _step_functions(ctx.kernel)
        N, B = cyz.shape[:2]
        state_shape = (B, *saved[0].shape[1:])
        d_h0, d_c0 = saved[0].new_empty(state_shape), saved[0].new_empty(state_shape)
        if d_reads is None:
            d_reads = saved[0].new_zeros((N, B, state_shape[-1]))
        d_cyz, d_ux, d_w3 = torch.empty_like(cyz), torch.empty_like(ux), torch.empty_like(w3)
        # Weight gradients are summed per tile and step, then across them: staged
        # summation keeps them at the fp32 error of a single reduction.
        parts = []
        for t, (b0, b1) in enumerate(ctx.tiles):
            dh = saved[0].new_zeros((b1 - b0, *state_shape[1:])) if d_hN is None else d_hN[b0:b1]
            dc = saved[0].new_zeros((b1 - b0, *state_shape[1:])) if d_cN is None else d_cN[b0:b1]
            for n in reversed(range(N)):
                h, c, z = saved[3 * (t * N + n): 3 * (t * N + n) + 3]
                out = _call("backward", bwd, backward_step, compiled, ctx.kernel,
                            h, c, z, cyz[n, b0:b1], ux[n, b0:b1], bvol, w3[n, b0:b1], taps, biases, mix_w, mix_b,
                            dh, dc, d_reads[n, b0:b1], ctx.factorised)
                dh, dc, d_cyz[n, b0:b1], d_ux[n, b0:b1], d_w3[n, b0:b1] = out[:5]
                parts.append(out[5:])
            d_h0[b0:b1], d_c0[b0:b1] = dh, dc
        d_bvol, d_taps, d_biases, d_mix_w, d_mix_b = (torch.stack(p).sum(0) for p in zip(*parts))
        return d_cyz, d_ux, d_bvol, d_w3, d_h0, d_c0, d_taps, d_biases, d_mix_w, d_mix_b, None, None, None
