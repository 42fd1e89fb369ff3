"""The Tensor Memory scan through `_scan.c`: its autograd Function and the buffers it recycles."""
from __future__ import annotations

import torch

from .native import WEIGHTS, native_call

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
