"""The Tensor Memory scan as one fused Triton kernel per direction (the GPU's scan).

The PyTorch scan calls a step per token from Python: on a GPU that is thousands of
small launches per training step, and the device waits on the host. Here one
program walks one sequence through all N steps, its state (h, c) held on chip from
the first step to the last; the write volume and the read weights are formed from
their 1D factors inside the kernel, the depthwise convolutions are shifted
multiply-adds, and the pointwise mix is (P, C) @ (C, C) products per gate and half.

The backward walks the steps in reverse from the states the forward saved (each
step's input h and c) and recomputes the rest. The gradients that are sums over cells
(the mix's weights, the write and read factors) would be products with an inner
dimension of P cells, which one program cannot hold in registers; so the kernel writes
each step's operands of those sums (the mix's input, the gates' gradients, the write
volume's and the read weights' gradients, 7C + 1 floats per cell and step) and PyTorch
sums them afterwards in a fixed order, so the result does not depend on scheduling.

A neighbour along an axis lives in another thread's registers, so each shift goes
through a per-program scratch tile in global memory (it stays in L1/L2) between
two barriers. Matrix products run in IEEE float32 (no TF32), as the other kernels do.

Triton is imported with this module, which `kernels.py` imports only when the kernel
is chosen; with TRITON_INTERPRET=1 set before that, Triton's interpreter runs the same
kernels on CPU tensors, which is how the tests check them without a GPU.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _row(ptr, offs_c, cm):
    """A (C,) vector as a (1, CB) row."""
    return tl.load(ptr + offs_c, mask=cm, other=0.0)[None, :]


@triton.jit
def _neighbours(scr_tile, x, stride, coord, n, mask, CB: tl.constexpr):
    """x at p - stride and p + stride along one axis (coord: each row's index on that axis
    of size n), zero past the border; x goes through the program's scratch tile."""
    tl.debug_barrier()  # every thread is done reading the tile's previous contents
    tl.store(scr_tile, x)
    tl.debug_barrier()
    prev = tl.load(scr_tile - stride * CB, mask=mask & (coord > 0)[:, None], other=0.0)
    nxt = tl.load(scr_tile + stride * CB, mask=mask & (coord < n - 1)[:, None], other=0.0)
    return prev, nxt


@triton.jit
def _conv(scr_tile, x, stride, coord, n, mask, taps, bias, offs_c, cm, C: tl.constexpr, CB: tl.constexpr):
    """Depthwise 3-tap cross-correlation along one axis (zero padding); taps (3, C), bias (C,)."""
    prev, nxt = _neighbours(scr_tile, x, stride, coord, n, mask, CB)
    return (prev * _row(taps, offs_c, cm) + x * _row(taps + C, offs_c, cm) + nxt * _row(taps + 2 * C, offs_c, cm)
            + _row(bias, offs_c, cm))


@triton.jit
def _conv_backward(scr_tile, dy, x, stride, coord, n, mask, taps, offs_c, cm, C: tl.constexpr, CB: tl.constexpr):
    """The input's gradient of `_conv` from its output's, and its taps' three (C,) gradient
    terms: sum(dy[p] * x[p-1]) = sum(dy[p+1] * x[p]), so x needs no neighbours of its own."""
    dprev, dnxt = _neighbours(scr_tile, dy, stride, coord, n, mask, CB)
    dx = dnxt * _row(taps, offs_c, cm) + dy * _row(taps + C, offs_c, cm) + dprev * _row(taps + 2 * C, offs_c, cm)
    return dx, tl.sum(dnxt * x, axis=0), tl.sum(dy * x, axis=0), tl.sum(dprev * x, axis=0)


@triton.jit
def _gathered(cz, uy, ux, bvol, wz, wy, wx, fbase, wbase, pd, ph, pw, offs_c, pm, mask,
              D: tl.constexpr, H: tl.constexpr, W: tl.constexpr, C: tl.constexpr):
    """One step's write volume at every cell (PB, CB), formed from its factors, and the read
    weights' three factors at every cell (PB,)."""
    c = offs_c[None, :]
    fz = tl.load(cz + fbase * D + pd[:, None] * C + c, mask=mask, other=0.0)
    fy = tl.load(uy + fbase * H + ph[:, None] * C + c, mask=mask, other=0.0)
    fx = tl.load(ux + fbase * W + pw[:, None] * C + c, mask=mask, other=0.0)
    bv = tl.load(bvol + (ph[:, None] * W + pw[:, None]) * C + c, mask=mask, other=0.0)
    gz = tl.load(wz + wbase * D + pd, mask=pm, other=0.0)
    gy = tl.load(wy + wbase * H + ph, mask=pm, other=0.0)
    gx = tl.load(wx + wbase * W + pw, mask=pm, other=0.0)
    return fz * fy * fx + bv, gz, gy, gx


@triton.jit
def _mix_block(mix_w, row0, gate, offs_c, cm, C: tl.constexpr):
    """mix_w[row0:row0+C, gate*C:(gate+1)*C] as a (CB, CB) tile, zero-padded."""
    r = offs_c[:, None]
    k = offs_c[None, :]
    return tl.load(mix_w + (row0 + r) * (4 * C) + gate * C + k, mask=cm[:, None] & cm[None, :], other=0.0)


@triton.jit
def _mix_weights(mix_w, mix_b, offs_c, cm, C: tl.constexpr):
    """The mix's (CB, CB) blocks per gate (i, f, o, g) of its write half, then of its h half, then
    its bias per gate as (1, CB) rows."""
    return (_mix_block(mix_w, 0, 0, offs_c, cm, C), _mix_block(mix_w, 0, 1, offs_c, cm, C),
            _mix_block(mix_w, 0, 2, offs_c, cm, C), _mix_block(mix_w, 0, 3, offs_c, cm, C),
            _mix_block(mix_w, C, 0, offs_c, cm, C), _mix_block(mix_w, C, 1, offs_c, cm, C),
            _mix_block(mix_w, C, 2, offs_c, cm, C), _mix_block(mix_w, C, 3, offs_c, cm, C),
            _row(mix_b, offs_c, cm), _row(mix_b + C, offs_c, cm),
            _row(mix_b + 2 * C, offs_c, cm), _row(mix_b + 3 * C, offs_c, cm))


@triton.jit
def _layout(D: tl.constexpr, H: tl.constexpr, W: tl.constexpr, C: tl.constexpr, PB: tl.constexpr,
            CB: tl.constexpr):
    """A program's indices: cells and channels (padded to PB, CB) with their masks, each cell's
    (d, h, w), and the (PB, CB) offsets into one channel-last (P, C) volume."""
    offs_p = tl.arange(0, PB)
    offs_c = tl.arange(0, CB)
    pm, cm = offs_p < D * H * W, offs_c < C
    return (offs_p, offs_c, pm, cm, pm[:, None] & cm[None, :], offs_p // (H * W), (offs_p // W) % H, offs_p % W,
            offs_p[:, None] * C + offs_c[None, :])


@triton.jit
def _mix_block_t(mix_w, row0, gate, offs_c, cm, C: tl.constexpr):
    """The same block transposed, loaded so (tl.trans of a loaded block cost the backward its registers)."""
    r = offs_c[None, :]
    k = offs_c[:, None]
    return tl.load(mix_w + (row0 + r) * (4 * C) + gate * C + k, mask=cm[:, None] & cm[None, :], other=0.0)


@triton.jit
def _through_mix(dzi, dzf, dzo, dzg, mix_w, row0, offs_c, cm, C: tl.constexpr):
    """The gradient of one half of the mix's input, rows row0:row0+C, from the gates' (PB, CB) each."""
    return (_dot(dzi, _mix_block_t(mix_w, row0, 0, offs_c, cm, C))
            + _dot(dzf, _mix_block_t(mix_w, row0, 1, offs_c, cm, C))
            + _dot(dzo, _mix_block_t(mix_w, row0, 2, offs_c, cm, C))
            + _dot(dzg, _mix_block_t(mix_w, row0, 3, offs_c, cm, C)))


@triton.jit
def _dot(a, b):
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _scan_forward(cz, uy, ux, bvol, wz, wy, wx, h0, c0, taps, biases, mix_w, mix_b,
                  reads, hN, cN, hs, cs, scratch, N,
                  D: tl.constexpr, H: tl.constexpr, W: tl.constexpr, C: tl.constexpr,
                  PB: tl.constexpr, CB: tl.constexpr, FACTORISED: tl.constexpr, KEEP: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    P: tl.constexpr = D * H * W
    offs_p, offs_c, pm, cm, mask, pd, ph, pw, tile = _layout(D, H, W, C, PB, CB)
    scr_tile = scratch + b * PB * CB + offs_p[:, None] * CB + offs_c[None, :]
    h = tl.load(h0 + b * P * C + tile, mask=mask, other=0.0)
    c = tl.load(c0 + b * P * C + tile, mask=mask, other=0.0)
    Wi, Wf, Wo, Wg, Hi, Hf, Ho, Hg, bi, bf, bo, bg = _mix_weights(mix_w, mix_b, offs_c, cm, C)
    n = 0
    while n < N:  # a while loop: Triton's interpreter cannot take a runtime bound to range() under numpy 2.4
        step = b * N + n
        wv, gz, gy, gx = _gathered(cz, uy, ux, bvol, wz, wy, wx, step * C, step, pd, ph, pw, offs_c, pm,
                                            mask, D, H, W, C)
        w3 = gz * gy * gx  # (PB,) the read's trilinear weights
        tl.store(reads + step * C + offs_c, tl.sum(h * w3[:, None], axis=0), mask=cm)
        if KEEP:
            tl.store(hs + step * P * C + tile, h, mask=mask)
            tl.store(cs + step * P * C + tile, c, mask=mask)
        if FACTORISED:
            a = _conv(scr_tile, h, H * W, pd, D, mask, taps, biases, offs_c, cm, C, CB)
            a2 = _conv(scr_tile, a, W, ph, H, mask, taps + 3 * C, biases + C, offs_c, cm, C, CB)
            hc = _conv(scr_tile, a2, 1, pw, W, mask, taps + 6 * C, biases + 2 * C, offs_c, cm, C, CB)
        else:
            hc = h
        si = _sigmoid(_dot(wv, Wi) + _dot(hc, Hi) + bi)
        sf = _sigmoid(_dot(wv, Wf) + _dot(hc, Hf) + bf)
        so = _sigmoid(_dot(wv, Wo) + _dot(hc, Ho) + bo)
        tg = _tanh(_dot(wv, Wg) + _dot(hc, Hg) + bg)
        c = tl.where(mask, sf * c + si * tg, 0.0)
        h = so * _tanh(c)
        n += 1
    tl.store(hN + b * P * C + tile, h, mask=mask)
    tl.store(cN + b * P * C + tile, c, mask=mask)


@triton.jit
def _scan_backward(cz, uy, ux, bvol, wz, wy, wx, taps, biases, mix_w, mix_b, hs, cs,
                   d_reads, d_hN, d_cN, d_h0, d_c0, xs, dzs, dws, dw3s, p_taps, p_biases, scratch, N,
                   D: tl.constexpr, H: tl.constexpr, W: tl.constexpr, C: tl.constexpr,
                   PB: tl.constexpr, CB: tl.constexpr, FACTORISED: tl.constexpr,
                   HAS_DH: tl.constexpr, HAS_DC: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    P: tl.constexpr = D * H * W
    offs_p, offs_c, pm, cm, mask, pd, ph, pw, tile = _layout(D, H, W, C, PB, CB)
    scr_tile = scratch + b * 3 * PB * CB + offs_p[:, None] * CB + offs_c[None, :]
    Wi, Wf, Wo, Wg, Hi, Hf, Ho, Hg, bi, bf, bo, bg = _mix_weights(mix_w, mix_b, offs_c, cm, C)
    if HAS_DH:
        dh = tl.load(d_hN + b * P * C + tile, mask=mask, other=0.0)
    else:
        dh = tl.zeros((PB, CB), tl.float32)
    if HAS_DC:
        dc = tl.load(d_cN + b * P * C + tile, mask=mask, other=0.0)
    else:
        dc = tl.zeros((PB, CB), tl.float32)
    zero_c = tl.zeros((CB,), tl.float32)
    t00, t01, t02, t10, t11, t12, t20, t21, t22 = (zero_c, zero_c, zero_c, zero_c, zero_c, zero_c,
                                                   zero_c, zero_c, zero_c)
    gb0, gb1, gb2 = zero_c, zero_c, zero_c
    # Per step, what the weights' and the factors' gradients are made of, summed afterwards in
    # PyTorch: the operator's input [write, h after the convs] (P, 2C), the gates' pre-activation
    # gradients (P, 4C), the write volume's gradient (P, C) and the read weights' (P,). Summing
    # them here over the P cells would be products with an inner dimension of P, which a program
    # holding one sequence cannot keep in registers.
    x_tile = offs_p[:, None] * (2 * C) + offs_c[None, :]
    z_tile = offs_p[:, None] * (4 * C) + offs_c[None, :]
    # The convs' intermediate volumes wait in two more scratch tiles until the backward through
    # the convs needs them: a tile fewer in registers each (the program spills past ~8 live tiles).
    stash_a = scr_tile + PB * CB
    stash_a2 = scr_tile + 2 * PB * CB
    n = N - 1
    while n >= 0:  # a while loop: Triton's interpreter cannot take a runtime bound to range() under numpy 2.4
        step = b * N + n
        h = tl.load(hs + step * P * C + tile, mask=mask, other=0.0)
        wv, gz, gy, gx = _gathered(cz, uy, ux, bvol, wz, wy, wx, step * C, step, pd, ph, pw, offs_c,
                                   pm, mask, D, H, W, C)
        if FACTORISED:
            a = _conv(scr_tile, h, H * W, pd, D, mask, taps, biases, offs_c, cm, C, CB)
            tl.store(stash_a, a)
            a2 = _conv(scr_tile, a, W, ph, H, mask, taps + 3 * C, biases + C, offs_c, cm, C, CB)
            tl.store(stash_a2, a2)
            hc = _conv(scr_tile, a2, 1, pw, W, mask, taps + 6 * C, biases + 2 * C, offs_c, cm, C, CB)
        else:
            hc = h
        xrow = xs + step * P * 2 * C
        tl.store(xrow + x_tile, wv, mask=mask)
        tl.store(xrow + C + x_tile, hc, mask=mask)
        si = _sigmoid(_dot(wv, Wi) + _dot(hc, Hi) + bi)
        sf = _sigmoid(_dot(wv, Wf) + _dot(hc, Hf) + bf)
        so = _sigmoid(_dot(wv, Wo) + _dot(hc, Ho) + bo)
        tg = _tanh(_dot(wv, Wg) + _dot(hc, Hg) + bg)
        c = tl.load(cs + step * P * C + tile, mask=mask, other=0.0)
        tc = _tanh(sf * c + si * tg)
        dc_tot = dc + dh * so * (1.0 - tc * tc)
        dzo = tl.where(mask, dh * tc * so * (1.0 - so), 0.0)
        dzf = tl.where(mask, dc_tot * c * sf * (1.0 - sf), 0.0)
        dzi = tl.where(mask, dc_tot * tg * si * (1.0 - si), 0.0)
        dzg = tl.where(mask, dc_tot * si * (1.0 - tg * tg), 0.0)
        dc = dc_tot * sf
        zrow = dzs + step * P * 4 * C
        tl.store(zrow + z_tile, dzi, mask=mask)
        tl.store(zrow + C + z_tile, dzf, mask=mask)
        tl.store(zrow + 2 * C + z_tile, dzo, mask=mask)
        tl.store(zrow + 3 * C + z_tile, dzg, mask=mask)
        dwv = _through_mix(dzi, dzf, dzo, dzg, mix_w, 0, offs_c, cm, C)  # the write volume's gradient
        tl.store(dws + step * P * C + tile, dwv, mask=mask)
        dhc = _through_mix(dzi, dzf, dzo, dzg, mix_w, C, offs_c, cm, C)  # that of h after the convs
        if FACTORISED:
            a2 = tl.load(stash_a2)
            da2, s0, s1, s2 = _conv_backward(scr_tile, dhc, a2, 1, pw, W, mask, taps + 6 * C, offs_c, cm, C, CB)
            t20 += s0
            t21 += s1
            t22 += s2
            gb2 += tl.sum(dhc, axis=0)
            a = tl.load(stash_a)
            da, s0, s1, s2 = _conv_backward(scr_tile, da2, a, W, ph, H, mask, taps + 3 * C, offs_c, cm, C, CB)
            t10 += s0
            t11 += s1
            t12 += s2
            gb1 += tl.sum(da2, axis=0)
            h = tl.load(hs + step * P * C + tile, mask=mask, other=0.0)
            dh_op, s0, s1, s2 = _conv_backward(scr_tile, da, h, H * W, pd, D, mask, taps, offs_c, cm, C, CB)
            t00 += s0
            t01 += s1
            t02 += s2
            gb0 += tl.sum(da, axis=0)
        else:
            dh_op = dhc
        # The read r = sum_p w3[p] h[p]: its weights' gradient, and h's.
        dr = tl.load(d_reads + step * C + offs_c, mask=cm, other=0.0)
        tl.store(dw3s + step * P + offs_p, tl.sum(h * dr[None, :], axis=1), mask=pm)
        dh = tl.where(mask, dh_op + dr[None, :] * (gz * gy * gx)[:, None], 0.0)
        n -= 1
    tl.store(d_h0 + b * P * C + tile, dh, mask=mask)
    tl.store(d_c0 + b * P * C + tile, dc, mask=mask)
    # This sequence's conv gradients: taps (3, 3, C), biases (3, C).
    pt = p_taps + b * 9 * C + offs_c
    tl.store(pt, t00, mask=cm)
    tl.store(pt + C, t01, mask=cm)
    tl.store(pt + 2 * C, t02, mask=cm)
    tl.store(pt + 3 * C, t10, mask=cm)
    tl.store(pt + 4 * C, t11, mask=cm)
    tl.store(pt + 5 * C, t12, mask=cm)
    tl.store(pt + 6 * C, t20, mask=cm)
    tl.store(pt + 7 * C, t21, mask=cm)
    tl.store(pt + 8 * C, t22, mask=cm)
    pbs = p_biases + b * 3 * C + offs_c
    tl.store(pbs, gb0, mask=cm)
    tl.store(pbs + C, gb1, mask=cm)
    tl.store(pbs + 2 * C, gb2, mask=cm)


def _blocks(D: int, H: int, W: int, C: int) -> tuple[int, int, int]:
    """Tile sizes (cells, channels; tl.dot wants 16 or more) and warps."""
    PB = max(16, triton.next_power_of_2(D * H * W))
    CB = max(16, triton.next_power_of_2(C))
    # 16 elements of each (PB, CB) tile per thread: 8 warps at a 6x6x6 grid, where the backward's
    # dozen live tiles fit 255 registers with little spilling (ptxas for sm_90, read off its
    # resource usage); at 8x8x8 no count avoids spilling, and 16 warps spill least.
    warps = min(16, max(4, PB * CB // 512))
    return PB, CB, warps


class TritonScan(torch.autograd.Function):
    """The same scan as NativeScan on the GPU: arguments those of `scan`, in its order
    (float32, batch first), then whether to keep each step's state for a backward."""

    @staticmethod
    def forward(ctx, cz, uy, ux, bvol, wz, wy, wx, h0, c0, taps, biases, mix_w, mix_b, factorised: bool,
                keep: bool):
        B, N, D, C = cz.shape
        H, W = uy.shape[2], ux.shape[2]
        P = D * H * W
        PB, CB, warps = _blocks(D, H, W, C)
        ins = [t.contiguous() for t in (cz, uy, ux, bvol, wz, wy, wx, h0, c0, taps, biases, mix_w, mix_b)]
        reads = cz.new_empty((B, N, C))
        hN, cN = cz.new_empty((B, D, H, W, C)), cz.new_empty((B, D, H, W, C))
        hs, cs = (cz.new_empty((B, N, P, C)) for _ in range(2)) if keep else (reads, reads)
        scratch = cz.new_empty((B, PB, CB))
        if B and N:
            _scan_forward[(B,)](*ins, reads, hN, cN, hs, cs, scratch, N, D=D, H=H, W=W, C=C, PB=PB, CB=CB,
                                FACTORISED=factorised, KEEP=keep, num_warps=warps)
        else:
            hN.copy_(h0)
            cN.copy_(c0)
        if keep:
            ctx.save_for_backward(*ins[:7], *ins[9:], hs, cs)
        ctx.factorised = factorised
        ctx.set_materialize_grads(False)
        return reads, hN, cN

    @staticmethod
    def backward(ctx, d_reads, d_hN, d_cN):
        cz, uy, ux, bvol, wz, wy, wx, taps, biases, mix_w, mix_b, hs, cs = ctx.saved_tensors
        B, N, D, C = cz.shape
        H, W = uy.shape[2], ux.shape[2]
        P = D * H * W
        PB, CB, warps = _blocks(D, H, W, C)
        d_reads = cz.new_zeros((B, N, C)) if d_reads is None else d_reads.contiguous()
        d_hN_, d_cN_ = (d_reads if t is None else t.contiguous() for t in (d_hN, d_cN))
        d_h0, d_c0 = cz.new_empty((B, D, H, W, C)), cz.new_empty((B, D, H, W, C))
        xs, dzs = cz.new_empty((B, N, P, 2 * C)), cz.new_empty((B, N, P, 4 * C))
        dws, dw3s = cz.new_empty((B, N, D, H, W, C)), cz.new_empty((B, N, D, H, W))
        p_taps, p_biases = cz.new_zeros((B, 3, 3, C)), cz.new_zeros((B, 3, C))
        scratch = cz.new_empty((B, 3, PB, CB))  # the shifts' tile and the two stashed conv volumes
        if B and N:
            _scan_backward[(B,)](cz, uy, ux, bvol, wz, wy, wx, taps, biases, mix_w, mix_b, hs, cs,
                                 d_reads, d_hN_, d_cN_, d_h0, d_c0, xs, dzs, dws, dw3s, p_taps, p_biases, scratch, N,
                                 D=D, H=H, W=W, C=C, PB=PB, CB=CB, FACTORISED=ctx.factorised,
                                 HAS_DH=d_hN is not None, HAS_DC=d_cN is not None, num_warps=warps)
        else:
            d_h0 = cz.new_zeros(d_h0.shape) if d_hN is None else d_hN.clone()
            d_c0 = cz.new_zeros(d_c0.shape) if d_cN is None else d_cN.clone()
            xs.zero_(), dzs.zero_(), dws.zero_(), dw3s.zero_()
        # The sums over cells, steps and sequences, as products with a long inner dimension.
        d_mix_w = xs.view(-1, 2 * C).t() @ dzs.view(-1, 4 * C)  # (2C, 4C)
        d_mix_b = dzs.view(-1, 4 * C).sum(0)
        d_bvol = dws.sum((0, 1, 2))  # (H, W, C)
        d_cz = torch.einsum("bndhwc,bnhc,bnwc->bndc", dws, uy, ux)
        d_uy = torch.einsum("bndhwc,bndc,bnwc->bnhc", dws, cz, ux)
        d_ux = torch.einsum("bndhwc,bndc,bnhc->bnwc", dws, cz, uy)
        d_wz = torch.einsum("bndhw,bnh,bnw->bnd", dw3s, wy, wx)
        d_wy = torch.einsum("bndhw,bnd,bnw->bnh", dw3s, wz, wx)
        d_wx = torch.einsum("bndhw,bnd,bnh->bnw", dw3s, wz, wy)
        if ctx.factorised:
            d_taps, d_biases = p_taps.sum(0), p_biases.sum(0)
        else:
            d_taps, d_biases = torch.zeros_like(taps), torch.zeros_like(biases)
        return (d_cz, d_uy, d_ux, d_bvol, d_wz, d_wy, d_wx, d_h0, d_c0, d_taps, d_biases, d_mix_w, d_mix_b,
                None, None)
