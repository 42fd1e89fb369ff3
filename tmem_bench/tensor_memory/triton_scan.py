"""The Tensor Memory scan as one fused Triton kernel per direction (the GPU's scan).

The PyTorch scan calls a step per token from Python: on a GPU that is thousands of
small launches per training step, and the device waits on the host. Here one
program walks one sequence through all N steps, its state (h, c) held on chip from
the first step to the last; the write volume and the read weights are formed from
their 1D factors inside the kernel, the depthwise convolutions are shifted
multiply-adds, and the pointwise mix is (P, C) @ (C, C) products per gate and half.

The backward walks the steps in reverse from the states the forward saved (each
step's input h and c) and recomputes the rest; each program sums its sequence's
weight gradients, and the sequences' sums are added in PyTorch afterwards, so the
result does not depend on scheduling.

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
    """One step's write factors and read weights at every cell: cz, uy, ux, each (PB, CB);
    the write volume (PB, CB) and the read weights (PB,)."""
    c = offs_c[None, :]
    fz = tl.load(cz + fbase * D + pd[:, None] * C + c, mask=mask, other=0.0)
    fy = tl.load(uy + fbase * H + ph[:, None] * C + c, mask=mask, other=0.0)
    fx = tl.load(ux + fbase * W + pw[:, None] * C + c, mask=mask, other=0.0)
    bv = tl.load(bvol + (ph[:, None] * W + pw[:, None]) * C + c, mask=mask, other=0.0)
    gz = tl.load(wz + wbase * D + pd, mask=pm, other=0.0)
    gy = tl.load(wy + wbase * H + ph, mask=pm, other=0.0)
    gx = tl.load(wx + wbase * W + pw, mask=pm, other=0.0)
    return fz, fy, fx, fz * fy * fx + bv, gz, gy, gx


@triton.jit
def _mix_block(mix_w, row0, gate, offs_c, cm, C: tl.constexpr):
    """mix_w[row0:row0+C, gate*C:(gate+1)*C] as a (CB, CB) tile, zero-padded."""
    r = offs_c[:, None]
    k = offs_c[None, :]
    return tl.load(mix_w + (row0 + r) * (4 * C) + gate * C + k, mask=cm[:, None] & cm[None, :], other=0.0)


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
    offs_p = tl.arange(0, PB)
    offs_c = tl.arange(0, CB)
    pm, cm = offs_p < P, offs_c < C
    mask = pm[:, None] & cm[None, :]
    pd, ph, pw = offs_p // (H * W), (offs_p // W) % H, offs_p % W
    tile = offs_p[:, None] * C + offs_c[None, :]  # (PB, CB) offsets into one (P, C) volume
    scr_tile = scratch + b * PB * CB + offs_p[:, None] * CB + offs_c[None, :]
    h = tl.load(h0 + b * P * C + tile, mask=mask, other=0.0)
    c = tl.load(c0 + b * P * C + tile, mask=mask, other=0.0)
    Wi, Wf, Wo, Wg = (_mix_block(mix_w, 0, 0, offs_c, cm, C), _mix_block(mix_w, 0, 1, offs_c, cm, C),
                      _mix_block(mix_w, 0, 2, offs_c, cm, C), _mix_block(mix_w, 0, 3, offs_c, cm, C))
    Hi, Hf, Ho, Hg = (_mix_block(mix_w, C, 0, offs_c, cm, C), _mix_block(mix_w, C, 1, offs_c, cm, C),
                      _mix_block(mix_w, C, 2, offs_c, cm, C), _mix_block(mix_w, C, 3, offs_c, cm, C))
    bi, bf = _row(mix_b, offs_c, cm), _row(mix_b + C, offs_c, cm)
    bo, bg = _row(mix_b + 2 * C, offs_c, cm), _row(mix_b + 3 * C, offs_c, cm)
    n = 0
    while n < N:  # a while loop: Triton's interpreter cannot take a runtime bound to range() under numpy 2.4
        step = b * N + n
        _, _, _, wv, gz, gy, gx = _gathered(cz, uy, ux, bvol, wz, wy, wx, step * C, step, pd, ph, pw, offs_c, pm,
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
def _axis_sum(onehot, x):
    """(NB, PB) one-hot of each row's index on an axis @ (PB, CB) -> per index sums (NB, CB)."""
    return _dot(onehot, x)


@triton.jit
def _scan_backward(cz, uy, ux, bvol, wz, wy, wx, taps, biases, mix_w, mix_b, hs, cs,
                   d_reads, d_hN, d_cN, d_cz, d_uy, d_ux, d_wz, d_wy, d_wx, d_h0, d_c0,
                   p_mix_w, p_mix_b, p_bvol, p_taps, p_biases, scratch, N,
                   D: tl.constexpr, H: tl.constexpr, W: tl.constexpr, C: tl.constexpr,
                   PB: tl.constexpr, CB: tl.constexpr, NB: tl.constexpr, FACTORISED: tl.constexpr,
                   HAS_DH: tl.constexpr, HAS_DC: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    P: tl.constexpr = D * H * W
    offs_p = tl.arange(0, PB)
    offs_c = tl.arange(0, CB)
    offs_n = tl.arange(0, NB)
    pm, cm = offs_p < P, offs_c < C
    mask = pm[:, None] & cm[None, :]
    pd, ph, pw = offs_p // (H * W), (offs_p // W) % H, offs_p % W
    tile = offs_p[:, None] * C + offs_c[None, :]
    scr_tile = scratch + b * PB * CB + offs_p[:, None] * CB + offs_c[None, :]
    # One-hots of each cell's index on each axis (NB, PB): sums over the other two axes as products.
    oz = ((offs_n[:, None] == pd[None, :]) & pm[None, :]).to(tl.float32)
    oy = ((offs_n[:, None] == ph[None, :]) & pm[None, :]).to(tl.float32)
    ox = ((offs_n[:, None] == pw[None, :]) & pm[None, :]).to(tl.float32)
    Wi, Wf, Wo, Wg = (_mix_block(mix_w, 0, 0, offs_c, cm, C), _mix_block(mix_w, 0, 1, offs_c, cm, C),
                      _mix_block(mix_w, 0, 2, offs_c, cm, C), _mix_block(mix_w, 0, 3, offs_c, cm, C))
    Hi, Hf, Ho, Hg = (_mix_block(mix_w, C, 0, offs_c, cm, C), _mix_block(mix_w, C, 1, offs_c, cm, C),
                      _mix_block(mix_w, C, 2, offs_c, cm, C), _mix_block(mix_w, C, 3, offs_c, cm, C))
    bi, bf = _row(mix_b, offs_c, cm), _row(mix_b + C, offs_c, cm)
    bo, bg = _row(mix_b + 2 * C, offs_c, cm), _row(mix_b + 3 * C, offs_c, cm)
    if HAS_DH:
        dh = tl.load(d_hN + b * P * C + tile, mask=mask, other=0.0)
    else:
        dh = tl.zeros((PB, CB), tl.float32)
    if HAS_DC:
        dc = tl.load(d_cN + b * P * C + tile, mask=mask, other=0.0)
    else:
        dc = tl.zeros((PB, CB), tl.float32)
    zero_cc = tl.zeros((CB, CB), tl.float32)
    gWi, gWf, gWo, gWg, gHi, gHf, gHo, gHg = (zero_cc, zero_cc, zero_cc, zero_cc,
                                              zero_cc, zero_cc, zero_cc, zero_cc)
    zero_c = tl.zeros((CB,), tl.float32)
    gbi, gbf, gbo, gbg = zero_c, zero_c, zero_c, zero_c
    t00, t01, t02, t10, t11, t12, t20, t21, t22 = (zero_c, zero_c, zero_c, zero_c, zero_c, zero_c,
                                                   zero_c, zero_c, zero_c)
    gb0, gb1, gb2 = zero_c, zero_c, zero_c
    g_bvol = tl.zeros((PB, CB), tl.float32)
    n = N - 1
    while n >= 0:
        step = b * N + n
        h = tl.load(hs + step * P * C + tile, mask=mask, other=0.0)
        c = tl.load(cs + step * P * C + tile, mask=mask, other=0.0)
        fz, fy, fx, wv, gz, gy, gx = _gathered(cz, uy, ux, bvol, wz, wy, wx, step * C, step, pd, ph, pw, offs_c,
                                               pm, mask, D, H, W, C)
        if FACTORISED:
            a = _conv(scr_tile, h, H * W, pd, D, mask, taps, biases, offs_c, cm, C, CB)
            a2 = _conv(scr_tile, a, W, ph, H, mask, taps + 3 * C, biases + C, offs_c, cm, C, CB)
            hc = _conv(scr_tile, a2, 1, pw, W, mask, taps + 6 * C, biases + 2 * C, offs_c, cm, C, CB)
        else:
            a = h
            a2 = h
            hc = h
        si = _sigmoid(_dot(wv, Wi) + _dot(hc, Hi) + bi)
        sf = _sigmoid(_dot(wv, Wf) + _dot(hc, Hf) + bf)
        so = _sigmoid(_dot(wv, Wo) + _dot(hc, Ho) + bo)
        tg = _tanh(_dot(wv, Wg) + _dot(hc, Hg) + bg)
        tc = _tanh(sf * c + si * tg)
        dc_tot = dc + dh * so * (1.0 - tc * tc)
        dzi = tl.where(mask, dc_tot * tg * si * (1.0 - si), 0.0)
        dzf = tl.where(mask, dc_tot * c * sf * (1.0 - sf), 0.0)
        dzo = tl.where(mask, dh * tc * so * (1.0 - so), 0.0)
        dzg = tl.where(mask, dc_tot * si * (1.0 - tg * tg), 0.0)
        dwv = (_dot(dzi, tl.trans(Wi)) + _dot(dzf, tl.trans(Wf)) + _dot(dzo, tl.trans(Wo))
               + _dot(dzg, tl.trans(Wg)))
        dhc = (_dot(dzi, tl.trans(Hi)) + _dot(dzf, tl.trans(Hf)) + _dot(dzo, tl.trans(Ho))
               + _dot(dzg, tl.trans(Hg)))
        wvT, hcT = tl.trans(wv), tl.trans(hc)
        gWi += _dot(wvT, dzi)
        gWf += _dot(wvT, dzf)
        gWo += _dot(wvT, dzo)
        gWg += _dot(wvT, dzg)
        gHi += _dot(hcT, dzi)
        gHf += _dot(hcT, dzf)
        gHo += _dot(hcT, dzo)
        gHg += _dot(hcT, dzg)
        gbi += tl.sum(dzi, axis=0)
        gbf += tl.sum(dzf, axis=0)
        gbo += tl.sum(dzo, axis=0)
        gbg += tl.sum(dzg, axis=0)
        g_bvol += dwv
        # The write factors' gradients: the write volume's, summed over the other two axes.
        frows = (offs_n[:, None] * C + offs_c[None, :])
        fmask_c = cm[None, :]
        tl.store(d_cz + step * C * D + frows, _axis_sum(oz, dwv * fy * fx), mask=(offs_n < D)[:, None] & fmask_c)
        tl.store(d_uy + step * C * H + frows, _axis_sum(oy, dwv * fz * fx), mask=(offs_n < H)[:, None] & fmask_c)
        tl.store(d_ux + step * C * W + frows, _axis_sum(ox, dwv * fz * fy), mask=(offs_n < W)[:, None] & fmask_c)
        if FACTORISED:
            da2, s0, s1, s2 = _conv_backward(scr_tile, dhc, a2, 1, pw, W, mask, taps + 6 * C, offs_c, cm, C, CB)
            t20 += s0
            t21 += s1
            t22 += s2
            gb2 += tl.sum(dhc, axis=0)
            da, s0, s1, s2 = _conv_backward(scr_tile, da2, a, W, ph, H, mask, taps + 3 * C, offs_c, cm, C, CB)
            t10 += s0
            t11 += s1
            t12 += s2
            gb1 += tl.sum(da2, axis=0)
            dh_op, s0, s1, s2 = _conv_backward(scr_tile, da, h, H * W, pd, D, mask, taps, offs_c, cm, C, CB)
            t00 += s0
            t01 += s1
            t02 += s2
            gb0 += tl.sum(da, axis=0)
        else:
            dh_op = dhc
        # The read: r = sum_p w3[p] h[p].
        dr = tl.load(d_reads + step * C + offs_c, mask=cm, other=0.0)
        d_w3 = tl.sum(h * dr[None, :], axis=1)  # (PB,)
        tl.store(d_wz + step * D + offs_n, tl.sum(oz * (d_w3 * gy * gx)[None, :], axis=1), mask=offs_n < D)
        tl.store(d_wy + step * H + offs_n, tl.sum(oy * (d_w3 * gz * gx)[None, :], axis=1), mask=offs_n < H)
        tl.store(d_wx + step * W + offs_n, tl.sum(ox * (d_w3 * gz * gy)[None, :], axis=1), mask=offs_n < W)
        dh = tl.where(mask, dh_op + dr[None, :] * (gz * gy * gx)[:, None], 0.0)
        dc = dc_tot * sf
        n -= 1
    tl.store(d_h0 + b * P * C + tile, dh, mask=mask)
    tl.store(d_c0 + b * P * C + tile, dc, mask=mask)
    # This sequence's weight gradients: mix_w (2C, 4C), mix_b (4C), bvol (P, C), taps (3, 3, C), biases (3, C).
    rc = offs_c[:, None] * (4 * C) + offs_c[None, :]
    cc = cm[:, None] & cm[None, :]
    pw_ = p_mix_w + b * 8 * C * C
    tl.store(pw_ + rc, gWi, mask=cc)
    tl.store(pw_ + rc + C, gWf, mask=cc)
    tl.store(pw_ + rc + 2 * C, gWo, mask=cc)
    tl.store(pw_ + rc + 3 * C, gWg, mask=cc)
    tl.store(pw_ + 4 * C * C + rc, gHi, mask=cc)
    tl.store(pw_ + 4 * C * C + rc + C, gHf, mask=cc)
    tl.store(pw_ + 4 * C * C + rc + 2 * C, gHo, mask=cc)
    tl.store(pw_ + 4 * C * C + rc + 3 * C, gHg, mask=cc)
    pb = p_mix_b + b * 4 * C + offs_c
    tl.store(pb, gbi, mask=cm)
    tl.store(pb + C, gbf, mask=cm)
    tl.store(pb + 2 * C, gbo, mask=cm)
    tl.store(pb + 3 * C, gbg, mask=cm)
    tl.store(p_bvol + b * P * C + tile, g_bvol, mask=mask)
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


def _blocks(D: int, H: int, W: int, C: int) -> tuple[int, int, int, int]:
    """Tile sizes (cells, channels, axis indices; tl.dot wants 16 or more) and warps."""
    PB = max(16, triton.next_power_of_2(D * H * W))
    CB = max(16, triton.next_power_of_2(C))
    NB = max(16, triton.next_power_of_2(max(D, H, W)))
    # About 16 elements of each (PB, CB) tile per thread: the backward keeps a dozen tiles live.
    warps = min(16, max(4, PB * CB // 512))
    return PB, CB, NB, warps


class TritonScan(torch.autograd.Function):
    """The same scan as NativeScan on the GPU: arguments those of `scan`, in its order
    (float32, batch first), then whether to keep each step's state for a backward."""

    @staticmethod
    def forward(ctx, cz, uy, ux, bvol, wz, wy, wx, h0, c0, taps, biases, mix_w, mix_b, factorised: bool,
                keep: bool):
        B, N, D, C = cz.shape
        H, W = uy.shape[2], ux.shape[2]
        P = D * H * W
        PB, CB, NB, warps = _blocks(D, H, W, C)
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
        PB, CB, NB, warps = _blocks(D, H, W, C)
        d_reads = cz.new_zeros((B, N, C)) if d_reads is None else d_reads.contiguous()
        d_hN_, d_cN_ = (d_reads if t is None else t.contiguous() for t in (d_hN, d_cN))
        grads = [torch.empty_like(t) for t in (cz, uy, ux, wz, wy, wx)]
        d_h0, d_c0 = cz.new_empty((B, D, H, W, C)), cz.new_empty((B, D, H, W, C))
        parts = [cz.new_zeros((B, *shape)) for shape in ((2 * C, 4 * C), (4 * C,), (P, C), (3, 3, C), (3, C))]
        scratch = cz.new_empty((B, PB, CB))
        if B and N:
            _scan_backward[(B,)](cz, uy, ux, bvol, wz, wy, wx, taps, biases, mix_w, mix_b, hs, cs,
                                 d_reads, d_hN_, d_cN_, *grads, d_h0, d_c0, *parts, scratch, N,
                                 D=D, H=H, W=W, C=C, PB=PB, CB=CB, NB=NB, FACTORISED=ctx.factorised,
                                 HAS_DH=d_hN is not None, HAS_DC=d_cN is not None, num_warps=warps)
        else:
            d_h0 = cz.new_zeros(d_h0.shape) if d_hN is None else d_hN.clone()
            d_c0 = cz.new_zeros(d_c0.shape) if d_cN is None else d_cN.clone()
        d_mix_w, d_mix_b, d_bvol, d_taps, d_biases = (p.sum(0) for p in parts)
        d_bvol = d_bvol.view(D, H * W, C).sum(0).view(H, W, C)
        if not ctx.factorised:
            d_taps, d_biases = torch.zeros_like(taps), torch.zeros_like(biases)
        d_cz, d_uy, d_ux, d_wz, d_wy, d_wx = grads
        return (d_cz, d_uy, d_ux, d_bvol, d_wz, d_wy, d_wx, d_h0, d_c0, d_taps, d_biases, d_mix_w, d_mix_b,
                None, None)
