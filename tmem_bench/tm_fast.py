"""The fast Tensor Memory scan: one autograd Function for a whole sequence.

Autograd would record about 40 small ops per memory step; here the forward loop
runs without a graph and the backward loop is written by hand, so one scan is one
autograd node. Each loop body is a pure tensor function (`forward_step`,
`backward_step`) that torch.compile can fuse into a few kernels; it is compiled
once per process (the body, never the unrolled loop), with a dynamic batch
dimension so that training, evaluation and probe batches share one compilation,
and it falls back to eager PyTorch whenever compilation is unavailable or fails.

Volumes are channel-last, (B, D, H, W, C): the depthwise 3-tap convolutions become
shifted multiply-adds over contiguous channel vectors and the pointwise mix is one
(B*D*H*W, 2C) @ (2C, 4C) matmul. The write half of the memory operator is linear
and separable, so the caller convolves its 1D factors outside the loop and `scan`
takes them (and the read weights' factors); the PyTorch path forms the (D, H)
part outside the loop (`cyz`) and the full volume inside the step, where a
compiled kernel never writes it to memory.

On CPU in float32 the whole scan can run in `_scan.c` (kernel "native"), built by
`pip install` as an optional extension for the instruction set of the machine that
builds it (its variant: avx512, avx2 or generic; see `native.py`): one C call per
direction, each sequence's recurrence kept in cache from its first step to its last,
every volume formed from its factors in C. "auto" takes it where its variant is one
of AUTO_NATIVE_VARIANTS. Elsewhere, and wherever the extension is not built (no C
compiler, no OpenMP, an uninstalled checkout) or is switched off with
TMEM_BENCH_NO_NATIVE=1, "auto" takes the compiled step, and eager PyTorch where
compilation fails. A stale build (its interface version is not INTERFACE_VERSION)
is never called: "auto" warns and falls back the same way.
"""
from __future__ import annotations

import os
import warnings

import torch
import torch.nn.functional as F

from .native import WEIGHTS, native_call, native_status, native_variant

KERNELS = ("auto", "native", "compiled", "eager")


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


# The native variants that `auto` takes: those measured faster than the compiled step
# (benchmarks/bench_tensor_step.py, results in benchmarks/results/tensor_step_*.json;
# sse against a compiled step that still had AVX2, which a CPU without AVX2 lacks too).
# A build's variant is fixed when it is compiled, so a machine always makes the same
# choice. The generic variant (ARM and anything else) has not been measured, so there
# "auto" takes the compiled step.
AUTO_NATIVE_VARIANTS = ("avx512", "avx2", "sse")


def resolve_kernel(kernel: str, *tensors: torch.Tensor) -> str:
    """The kernel a scan over `tensors` runs with: native, compiled or eager ("auto"
    where the PyTorch path decides between the last two)."""
    native_ok = all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
    if kernel == "native":
        if not native_ok:
            found = sorted({f"{t.dtype} on {t.device}" for t in tensors})
            raise RuntimeError(f"the native Tensor Memory kernel runs float32 on CPU only, got {', '.join(found)}")
        lib, why = native_status()
        if lib is None:
            raise RuntimeError(f"the native Tensor Memory kernel {why}; use kernel auto, compiled or eager")
        return "native"
    if kernel == "auto" and native_ok and native_variant() in AUTO_NATIVE_VARIANTS:
        return "native"
    return kernel


def kernel_that_runs(kernel: str, *tensors: torch.Tensor) -> str:
    """What a scan over `tensors` asked to run `kernel` runs now, for the record:
    "native (<variant>)", "compiled" or "eager"."""
    kernel = resolve_kernel(kernel, *tensors)
    if kernel == "native":
        return f"native ({native_variant()})"
    if kernel == "auto":
        return "compiled" if compiled_available() else "eager"
    return kernel


# The native scan saves each step's state and gates for the backward: about 250 MB
# per layer at batch 128 and 24 steps. Fresh buffers of that size page-fault on every
# first touch, so they are recycled once their backward has run: the pool keeps what
# the last steps had in flight, for the few most recently used shapes only (a run
# that moves on to other sizes does not keep the old ones).
_free_buffers: dict[tuple, list[torch.Tensor]] = {}
_POOL_SHAPES = 6


def _buffer(shape: tuple) -> torch.Tensor:
    free = _free_buffers.get(shape)
    return free.pop() if free else torch.empty(shape)


def _release(tensors) -> None:
    for t in tensors:
        shape = tuple(t.shape)
        _free_buffers[shape] = _free_buffers.pop(shape, []) + [t]  # most recently used last
    while len(_free_buffers) > _POOL_SHAPES:
        del _free_buffers[next(iter(_free_buffers))]


class NativeScan(torch.autograd.Function):
    """The same scan as TensorMemoryScan through `_scan.c`, on the write and read
    weights' 1D factors (formed into volumes inside C, never in memory), batch first;
    the arguments are those of `scan`, in its order, then whether to keep each step's
    state and gates for a backward, and whether to return the final state (always, where
    kept: without it C skips the last step's write)."""

    @staticmethod
    def forward(ctx, cz, uy, ux, bvol, wz, wy, wx, h0, c0, taps, biases, mix_w, mix_b, factorised: bool, keep: bool,
                final: bool):
        B, N, D, C = cz.shape
        H, W = uy.shape[2], ux.shape[2]
        P = D * H * W
        ins = dict(cz=cz, uy=uy, ux=ux, bvol=bvol, wz=wz, wy=wy, wx=wx, h0=h0, c0=c0, taps=taps, biases=biases,
                   mix_w=mix_w, mix_b=mix_b)
        ins = {name: t.contiguous() for name, t in ins.items()}
        final = final or keep
        outs = dict(reads=h0.new_empty((B, N, C)), hN=torch.empty_like(ins["h0"]) if final else None,
                    cN=torch.empty_like(ins["c0"]) if final else None)
        # Each step's input state and activated gates, for the backward.
        shapes = dict(hs=(B, N, P, C), cs=(B, N, P, C), gs=(B, N, P, 4 * C))
        steps = {name: _buffer(shape) if keep else None for name, shape in shapes.items()}
        status = native_call("tm_forward", B=B, N=N, D=D, H=H, W=W, C=C, factorised=int(factorised),
                              nthreads=torch.get_num_threads(), **ins, **outs, **steps)
        if status == 1:
            raise MemoryError("the native Tensor Memory forward could not allocate its buffers")
        if status:
            raise ValueError(f"the native Tensor Memory forward refused its arguments (status {status})")
        if keep:
            ctx.saved_names = [*WEIGHTS, "taps", "biases", "mix_w", *steps]
            tensors = {**ins, **steps}
            ctx.save_for_backward(*(tensors[name] for name in ctx.saved_names))
        ctx.factorised, ctx.released = factorised, False
        ctx.set_materialize_grads(False)  # an unused final state arrives as None, not as a volume of zeros
        return outs["reads"], outs["hN"], outs["cN"]

    @staticmethod
    def backward(ctx, d_reads, d_hN, d_cN):
        if ctx.released:
            raise RuntimeError("the native Tensor Memory scan recycles its saved states after one backward; "
                               "use kernel='compiled' or 'eager' to backward through it twice")
        saved = dict(zip(ctx.saved_names, ctx.saved_tensors))
        B, N, D, C = saved["cz"].shape
        H, W = saved["uy"].shape[2], saved["ux"].shape[2]
        grads = {f"d_{name}": torch.empty_like(saved[name]) for name in ("cz", "uy", "ux", "wz", "wy", "wx")}
        grads["d_h0"], grads["d_c0"] = (saved["cz"].new_empty((B, D, H, W, C)) if want else None
                                        for want in ctx.needs_input_grad[7:9])
        sizes = [2 * C * 4 * C, 4 * C, H * W * C, 9 * C, 3 * C]
        gparts, gsum = _buffer((B, sum(sizes))), saved["cz"].new_empty(sum(sizes))
        d_reads = saved["cz"].new_zeros((B, N, C)) if d_reads is None else d_reads.contiguous()
        d_hN, d_cN = (None if t is None else t.contiguous() for t in (d_hN, d_cN))
        status = native_call("tm_backward", B=B, N=N, D=D, H=H, W=W, C=C, factorised=int(ctx.factorised),
                              nthreads=torch.get_num_threads(), **saved, d_reads=d_reads, d_hN=d_hN, d_cN=d_cN,
                              **grads, gparts=gparts, gsum=gsum)
        ctx.released = True
        _release([saved["hs"], saved["cs"], saved["gs"], gparts])
        if status:
            raise MemoryError("the native Tensor Memory backward could not allocate its buffers")
        # Weight gradients are summed in two stages, over each sequence's steps and then
        # over sequences, both in C in an order that does not depend on the threads.
        d_mix_w, d_mix_b, d_bvol, d_taps, d_biases = gsum.split(sizes)
        return (grads["d_cz"], grads["d_uy"], grads["d_ux"], d_bvol.view(H, W, C), grads["d_wz"], grads["d_wy"],
                grads["d_wx"], grads["d_h0"], grads["d_c0"], d_taps.view(3, 3, C), d_biases.view(3, C),
                d_mix_w.view(2 * C, 4 * C), d_mix_b, None, None, None)


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


def scan(*, cz: torch.Tensor, uy: torch.Tensor, ux: torch.Tensor, bvol: torch.Tensor, wz: torch.Tensor,
         wy: torch.Tensor, wx: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, taps: torch.Tensor,
         biases: torch.Tensor, mix_w: torch.Tensor, mix_b: torch.Tensor, factorised: bool,
         kernel: str = "auto", output_final_state: bool = True
         ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The Tensor Memory recurrence over N steps: each step reads the state at its read
    point, then writes its volume through the gated update.

    Args:
        cz (torch.Tensor):
            the write volume's D factor, of shape `[B, N, D, C]`: step n writes
            `cz[d] * uy[h] * ux[w] + bvol[h, w]` into cell (d, h, w), the write already
            through the convs' write half where factorised.
        uy (torch.Tensor):
            the write volume's H factor, of shape `[B, N, H, C]`.
        ux (torch.Tensor):
            the write volume's W factor, of shape `[B, N, W, C]`.
        bvol (torch.Tensor):
            the write volume's part from the convs' biases, of shape `[H, W, C]`.
        wz (torch.Tensor):
            the read weights' D factor, of shape `[B, N, D]`; cell (d, h, w) weighs
            `wz[d] * wy[h] * wx[w]`.
        wy (torch.Tensor):
            the read weights' H factor, of shape `[B, N, H]`.
        wx (torch.Tensor):
            the read weights' W factor, of shape `[B, N, W]`.
        h0 (torch.Tensor):
            the initial hidden state, channel-last, of shape `[B, D, H, W, C]`.
        c0 (torch.Tensor):
            the initial cell state, of shape `[B, D, H, W, C]`.
        taps (torch.Tensor):
            the state's depthwise 3-tap convs along D, H, W, of shape `[3, 3, C]`
            (axis, tap, channel).
        biases (torch.Tensor):
            those convs' biases, of shape `[3, C]`.
        mix_w (torch.Tensor):
            the pointwise mix from [write, state] to the gates (i, f, o, g), of shape `[2C, 4C]`.
        mix_b (torch.Tensor):
            the mix's bias, of shape `[4C]`.
        factorised (bool):
            whether the state goes through the three convs (taps, biases) before the mix;
            if False they are unused.
        kernel (str):
            "native" (`_scan.c`, float32 on CPU), "compiled" (torch.compile'd step),
            "eager", or "auto" (native where its variant is in AUTO_NATIVE_VARIANTS, else
            compiled, else eager).
            Default: "auto".
        output_final_state (bool):
            whether to return the final state; without it, the native scan skips the last
            step's write, which nothing else sees.
            Default: True.

    Returns:
        reads (torch.Tensor):
            each step's read of the state before its own write, of shape `[B, N, C]`.
        hN, cN (torch.Tensor | None):
            the final hidden and cell states, of shape `[B, D, H, W, C]`; None without
            output_final_state.
    """
    args = (cz, uy, ux, bvol, wz, wy, wx, h0, c0, taps, biases, mix_w, mix_b)
    kernel = resolve_kernel(kernel, *args)
    # Only a scan that autograd will differentiate keeps each step's state and gates (the
    # native scan: 1.3 GB per layer at the evaluation batch of 512). Inside a Function's
    # forward this is no longer visible: grad mode is off there, and needs_input_grad
    # stays True under torch.no_grad.
    keep = torch.is_grad_enabled() and any(t.requires_grad for t in args)
    if kernel == "native":
        reads, hN, cN = NativeScan.apply(*args, factorised, keep, output_final_state)
    else:
        cyz = cz[:, :, :, None] * uy[:, :, None]  # (B, N, D, H, C)
        w3 = wz[..., :, None, None] * wy[..., None, :, None] * wx[..., None, None, :]  # (B, N, D, H, W)
        reads, hN, cN = TensorMemoryScan.apply(
            cyz.transpose(0, 1).contiguous(), ux.transpose(0, 1).contiguous(), bvol, w3.transpose(0, 1).contiguous(),
            h0, c0, taps, biases, mix_w, mix_b, factorised, kernel, keep)
        reads = reads.transpose(0, 1)
    return (reads, hN, cN) if output_final_state else (reads, None, None)
