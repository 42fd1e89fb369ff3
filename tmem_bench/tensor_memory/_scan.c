/* The Tensor Memory scan on CPU as two plain C functions: the whole recurrence of
 * a batch forward, and its backward, each sequence one OpenMP task that keeps its
 * state, gates and gradients in cache from the first step to the last.
 *
 * The same computation as step.forward_step / backward_step (see there for the
 * maths); tests/tensor_memory/ holds both, and each vector variant below,
 * to the naive twin. Python calls these through ctypes (native.py), by
 * the argument names of native.NATIVE_SIGNATURES, which must list them as declared
 * here; the module init below exists only so that setuptools can build the file as
 * an ordinary (optional) extension of the package.
 *
 * Layouts, all float32 and contiguous, P = D*H*W voxels, C channels, each step
 * of each sequence at index (b, n):
 *   the write volume's factors: cz (B, N, D, C), uy (B, N, H, C), ux (B, N, W, C),
 *   so that write[d, h, w] = cz[d] * uy[h] * ux[w] + bvol[h, w] with bvol (H*W, C);
 *   the read weights' factors: wz (B, N, D), wy (B, N, H), wx (B, N, W);
 *   h0, c0, hN, cN (B, P, C)  taps (3 axes, 3, C)  biases (3, C)
 *   mix_w (2C, 4C)  mix_b (4C)  reads (B, N, C)
 *   saved hs, cs (B, N, P, C) and gs (B, N, P, 4C): each step's input state and
 *   its activated gates (sigmoid i, f, o and tanh g), kept for the backward, which
 *   then needs no matmul or exp to recover them.
 *   gparts (B, G): each sequence's weight gradients, summed over its steps;
 *   gsum (G): their sum over the batch, in a fixed order whatever the threads:
 *   mix_w (2C*4C), mix_b (4C), bvol (H*W*C), taps (9C), biases (3C).
 *   hN and cN may be NULL where nothing is kept for a backward (hs, cs, gs NULL): the
 *   final state is not wanted, and the last step's write, which only it sees, is skipped.
 *   Gradients have their input's layout; d_h0, d_c0 (outputs) and d_hN, d_cN
 *   (inputs) may be NULL.
 */
#include <Python.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define HAVE_MXCSR 1
#endif

#define INLINE static inline __attribute__((always_inline))

/* The vector width and the gemm's register tile follow the instruction set the file
 * is compiled for (the build uses -march=native): a tile of up to TR_A rows by NV
 * vectors keeps its accumulators, NV row vectors of B and a broadcast in registers,
 * which must fit the register file or every k step spills. AVX-512 has 32 registers
 * of 16 floats; AVX2 16 of 8; the generic variant (sse on x86, NEON, anything else)
 * is sized for 16 registers of 4. Rows go in blocks of TR_A, then as few blocks of TR_B
 * as complete them (AVX2: 216 voxels in 6s, the weight gradient's 2C = 32 rows in
 * 6, 6, 6, 6, 4, 4), single rows only where neither fits. */
#if defined(__AVX512F__)
#define TM_VARIANT "avx512"
#define VW 16
#define NV 4
#define TR_A 8
#define TR_B 6
#elif defined(__AVX2__)
#define TM_VARIANT "avx2"
#define VW 8
#define NV 2
#define TR_A 6
#define TR_B 4
#else
#if defined(__x86_64__) || defined(__i386__)
#define TM_VARIANT "sse"  /* x86 without AVX2: the same code as generic, told apart for kernels.py's "auto" */
#else
#define TM_VARIANT "generic"
#endif
#define VW 4
#define NV 2
#define TR_A 6
#define TR_B 4
#endif
typedef float vf __attribute__((vector_size(VW * sizeof(float)), aligned(4)));  /* unaligned loads allowed */

typedef int vi __attribute__((vector_size(VW * sizeof(int)), aligned(4)));

/* Lane-wise max and min that return x where x is NaN, so that a diverged state
 * stays NaN: one instruction where the instruction set has one. */
#if defined(__AVX512F__)
#include <immintrin.h>
INLINE vf vmax(vf lo, vf x) { return (vf)_mm512_max_ps((__m512)lo, (__m512)x); }
INLINE vf vmin(vf hi, vf x) { return (vf)_mm512_min_ps((__m512)hi, (__m512)x); }
#elif defined(__AVX2__)
#include <immintrin.h>
INLINE vf vmax(vf lo, vf x) { return (vf)_mm256_max_ps((__m256)lo, (__m256)x); }
INLINE vf vmin(vf hi, vf x) { return (vf)_mm256_min_ps((__m256)hi, (__m256)x); }
#else
INLINE vf vmax(vf lo, vf x) {
    for (int i = 0; i < VW; i++) x[i] = lo[i] > x[i] ? lo[i] : x[i];
    return x;
}
INLINE vf vmin(vf hi, vf x) {
    for (int i = 0; i < VW; i++) x[i] = hi[i] < x[i] ? hi[i] : x[i];
    return x;
}
#endif

INLINE vf vsplat(float a) { return (vf){0} + a; }

/* The first n <= VW lanes from or to p, the rest zero: whole vectors wherever the
 * channel count is a multiple of VW and constant, and C < VW (8 channels on
 * AVX-512) still works. */
INLINE vf vload(const float *p, int n) {
    if (n == VW) return *(const vf *)p;
    vf v = {0};
    memcpy(&v, p, n * sizeof(float));
    return v;
}

INLINE void vstore(float *p, vf v, int n) {
    if (n == VW) *(vf *)p = v;
    else memcpy(p, &v, n * sizeof(float));
}

/* exp(x) - 1 for x in [-87, 88] through a degree-6 polynomial (Cephes expf) after
 * reducing x to n ln2 + r: keeps full relative precision near 0, unlike exp(x) - 1;
 * and exp(x) + 1 in *plus2. */
INLINE vf vexpm1(vf x, vf *plus2) {
    const vf shifter = vsplat(12582912.0f);  /* 1.5 * 2^23: adding it rounds to an integer n in the low bits */
    vf m = x * 1.44269504088896341f + shifter, n = m - shifter;
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
    /* One fused step with ln 2 rounded to float: it is off by 2e-9, so r is off by
     * n * 2e-9, under an ulp of exp(r) while |x| < 20 (|n| <= 29), where gates
     * are not saturated; the tests' float64 referee holds the scan to it. */
    vf r = x - n * 0.693147180559945f;
#else
    vf r = x - n * 0.693359375f + n * 2.12194440e-4f;  /* unfused, ln 2 in two parts: n times the first is exact */
#endif
    /* The polynomial by Estrin's scheme: the loops that call this wait on its latency,
     * not on their instruction count, so shorter chains beat fewer operations. */
    const vf r2 = r * r;
    const vf p45 = r * 1.9875691500e-4f + 1.3981999507e-3f, p23 = r * 8.3334519073e-3f + 4.1665795894e-2f;
    const vf p01 = r * 1.6666665459e-1f + 5.0000001201e-1f;
    const vf em1 = ((p45 * r2 + p23) * r2 + p01) * r2 + r;  /* exp(r) - 1 */
    vf s = (vf)(((vi)m << 23) + 0x3f800000);  /* 2^n: the shift drops the shifter's bits */
    *plus2 = s * em1 + (s + 1.0f);  /* beside the result, not after it: it is on the callers' chain */
    return s * em1 + (s - 1.0f);
}

INLINE vf vsigmoid(vf x) {
    vf d;
    vexpm1(-vmin(vsplat(87.0f), vmax(vsplat(-88.0f), x)), &d);
    return 1.0f / d;
}

/* tanh |x| = -expm1(-2|x|) / (2 + expm1(-2|x|)): no cancellation for small |x|. */
INLINE vf vtanh(vf x) {
    const vi sign = (vi){0} + (int)0x80000000;
    vf d, e = vexpm1(vmax(vsplat(-87.0f), (vf)((vi)x | sign) * 2.0f), &d);
    return (vf)((vi)(-e / d) | ((vi)x & sign));
}

/* One voxel's LSTM cell on n <= VW channels from k: z (4C) holds the i, f, o, g
 * pre-activations; the activated gates go to g (4C), the new cell to c_out, the new
 * state to h_out. */
INLINE void gates_forward(const int C, int k, const int n, const float *restrict z, const float *restrict c,
                          float *restrict g, float *restrict h_out, float *restrict c_out) {
    const vf si = vsigmoid(vload(z + k, n)), sf = vsigmoid(vload(z + C + k, n));
    const vf so = vsigmoid(vload(z + 2 * C + k, n)), tg = vtanh(vload(z + 3 * C + k, n));
    const vf cn = sf * vload(c + k, n) + si * tg;
    vstore(g + k, si, n), vstore(g + C + k, sf, n), vstore(g + 2 * C + k, so, n), vstore(g + 3 * C + k, tg, n);
    vstore(c_out + k, cn, n), vstore(h_out + k, so * vtanh(cn), n);
}

/* Its backward from the saved gates g and input cell c: dz (4C) from the new
 * state's and cell's gradients dh, dc; dc becomes the input cell's gradient. */
INLINE void gates_backward(const int C, int k, const int n, const float *restrict g, const float *restrict c,
                           const float *restrict dh, float *restrict dc, float *restrict dz) {
    const vf si = vload(g + k, n), sf = vload(g + C + k, n), so = vload(g + 2 * C + k, n);
    const vf tg = vload(g + 3 * C + k, n), ck = vload(c + k, n), dhk = vload(dh + k, n);
    const vf tc = vtanh(sf * ck + si * tg);
    const vf dct = vload(dc + k, n) + dhk * so * (1.0f - tc * tc);
    vstore(dz + k, dct * tg * si * (1.0f - si), n);
    vstore(dz + C + k, dct * ck * sf * (1.0f - sf), n);
    vstore(dz + 2 * C + k, dhk * tc * so * (1.0f - so), n);
    vstore(dz + 3 * C + k, dct * si * (1.0f - tg * tg), n);
    vstore(dc + k, dct * sf, n);
}

/* out[i, :cols] (+)= bias + sum_k A[i*sar + k*sak] * Bm[k, :cols] for nr <= max(TR_A, TR_B) rows
 * and nv <= NV vectors of columns; constant nr and nv after inlining keep acc in registers. */
INLINE void tile(const int nr, const int nv, int red, const float *A, int sar, int sak, const float *Bm, int ldb,
                 float *O, int ldo, const float *bias, int accumulate) {
    vf acc[TR_A > TR_B ? TR_A : TR_B][NV];
    for (int i = 0; i < nr; i++)
        for (int v = 0; v < nv; v++)
            acc[i][v] = bias ? *(const vf *)(bias + v * VW) : (vf){0};
    for (int k = 0; k < red; k++) {
        vf b[NV];
        for (int v = 0; v < nv; v++) b[v] = *(const vf *)(Bm + k * ldb + v * VW);
        for (int i = 0; i < nr; i++) {
            float a = A[i * sar + k * sak];
            for (int v = 0; v < nv; v++) acc[i][v] += a * b[v];
        }
    }
    for (int i = 0; i < nr; i++)
        for (int v = 0; v < nv; v++) {
            vf *o = (vf *)(O + i * ldo + v * VW);
            *o = accumulate ? *o + acc[i][v] : acc[i][v];
        }
}

#define TILE_ROWS(nv)                                                                                        \
    do {                                                                                                     \
        int i = 0;                                                                                           \
        for (; i + TR_A <= rows - tail_b; i += TR_A)                                                         \
            tile(TR_A, nv, red, A + i * sar, sar, sak, Bm + j, ldb, O + i * ldo + j, ldo, bj, accumulate);   \
        for (; i + TR_B <= rows; i += TR_B)                                                                  \
            tile(TR_B, nv, red, A + i * sar, sar, sak, Bm + j, ldb, O + i * ldo + j, ldo, bj, accumulate);     \
        for (; i < rows; i++)                                                                                \
            tile(1, nv, red, A + i * sar, sar, sak, Bm + j, ldb, O + i * ldo + j, ldo, bj, accumulate);        \
    } while (0)

/* O (rows, cols) (+)= [bias +] A @ Bm with A's element (i, k) at A[i*sar + k*sak]. */
INLINE void gemm(int rows, int red, int cols, const float *A, int sar, int sak, const float *Bm, int ldb, float *O,
                 int ldo, const float *bias, int accumulate) {
    int tail_b = 0;  /* rows left to TR_B tiles: the fewest that leave a multiple of TR_A */
    while (tail_b + TR_B <= rows && (rows - tail_b) % TR_A) tail_b += TR_B;
    if ((rows - tail_b) % TR_A) tail_b = rows;
    int j = 0;
    for (; j + NV * VW <= cols; j += NV * VW) {
        const float *bj = bias ? bias + j : NULL;
        TILE_ROWS(NV);
    }
    for (; j + VW <= cols; j += VW) {
        const float *bj = bias ? bias + j : NULL;
        TILE_ROWS(1);
    }
    for (; j < cols; j++)
        for (int i = 0; i < rows; i++) {
            float s = bias ? bias[j] : 0.0f;
            for (int k = 0; k < red; k++) s += A[i * sar + k * sak] * Bm[k * ldb + j];
            O[i * ldo + j] = accumulate ? O[i * ldo + j] + s : s;
        }
}

/* Helpers take the channel count as a compile-time constant where the caller
 * dispatches on it (see DISPATCH), so that per-voxel channel loops become
 * straight-line vector code. */

typedef struct {
    int D, H, W, P, factorised;
} Shape;

/* Depthwise 3-tap cross-correlation along one axis (0: D, 1: H, 2: W) with zero
 * padding. At a border the missing neighbour is read from `zero` instead of
 * skipped, so every voxel is one branch-free pass that stays in registers. */
INLINE void conv_fwd(const int C, const Shape *s, int axis, const float *restrict in, const float *restrict taps,
                     const float *restrict bias, const float *restrict zero, float *restrict out) {
    const int L = axis == 0 ? s->D : axis == 1 ? s->H : s->W;
    const int stride = (axis == 0 ? s->H * s->W : axis == 1 ? s->W : 1) * C;
    const float *t0 = taps, *t1 = taps + C, *t2 = taps + 2 * C;
    for (int d = 0; d < s->D; d++)
        for (int h = 0; h < s->H; h++)
            for (int x = 0; x < s->W; x++) {
                const int p = ((d * s->H + h) * s->W + x) * C, i = axis == 0 ? d : axis == 1 ? h : x;
                const float *m = in + p, *lo = i > 0 ? m - stride : zero, *hi = i < L - 1 ? m + stride : zero;
                float *o = out + p;
                for (int k = 0; k < C; k++) o[k] = m[k] * t1[k] + bias[k] + lo[k] * t0[k] + hi[k] * t2[k];
            }
}

/* dx of conv_fwd, and its tap (3, C) and bias (C) gradients added to dtaps, dbias. */
INLINE void conv_bwd(const int C, const Shape *s, int axis, const float *restrict dy, const float *restrict in,
                     const float *restrict taps, const float *restrict zero, float *restrict dx,
                     float *restrict dtaps, float *restrict dbias) {
    const int L = axis == 0 ? s->D : axis == 1 ? s->H : s->W;
    const int stride = (axis == 0 ? s->H * s->W : axis == 1 ? s->W : 1) * C;
    const float *t0 = taps, *t1 = taps + C, *t2 = taps + 2 * C;
    float g0[C], g1[C], g2[C], gb[C];
    for (int k = 0; k < C; k++) g0[k] = g1[k] = g2[k] = gb[k] = 0.0f;
    for (int d = 0; d < s->D; d++)
        for (int h = 0; h < s->H; h++)
            for (int x = 0; x < s->W; x++) {
                const int p = ((d * s->H + h) * s->W + x) * C, i = axis == 0 ? d : axis == 1 ? h : x;
                const int has_lo = i > 0, has_hi = i < L - 1;
                const float *g = dy + p, *m = in + p;
                const float *g_lo = has_lo ? g - stride : zero, *g_hi = has_hi ? g + stride : zero;
                const float *m_lo = has_lo ? m - stride : zero, *m_hi = has_hi ? m + stride : zero;
                float *o = dx + p;
                for (int k = 0; k < C; k++) o[k] = g[k] * t1[k] + g_lo[k] * t2[k] + g_hi[k] * t0[k];
                for (int k = 0; k < C; k++) {
                    g0[k] += g[k] * m_lo[k];
                    g1[k] += g[k] * m[k];
                    g2[k] += g[k] * m_hi[k];
                    gb[k] += g[k];
                }
            }
    for (int k = 0; k < C; k++) {
        dtaps[k] += g0[k], dtaps[C + k] += g1[k], dtaps[2 * C + k] += g2[k];
        dbias[k] += gb[k];
    }
}

/* The sum of t[0..C), by halving while C is even: vector adds instead of a serial chain. */
INLINE float channel_sum(const int C, float *restrict t) {
    int n = C;
    for (; n % 2 == 0 && n > 1; n /= 2)
        for (int k = 0; k < n / 2; k++) t[k] += t[k + n / 2];
    float acc = 0.0f;
    for (int k = 0; k < n; k++) acc += t[k];
    return acc;
}

/* x = [write volume, h through the D, H, W convs] (P, 2C); a, b: the first two conv outputs. */
INLINE void operator_input(const int C, const Shape *s, const float *restrict h, const float *restrict cyz,
                           const float *restrict ux, const float *restrict bvol, const float *restrict taps,
                           const float *restrict biases, float *restrict a, float *restrict b, float *restrict hc,
                           float *restrict x) {
    float zero[C];
    for (int k = 0; k < C; k++) zero[k] = 0.0f;
    if (s->factorised) {
        conv_fwd(C, s, 0, h, taps, biases, zero, a);
        conv_fwd(C, s, 1, a, taps + 3 * C, biases + C, zero, b);
        conv_fwd(C, s, 2, b, taps + 6 * C, biases + 2 * C, zero, hc);
    }
    const float *hh = s->factorised ? hc : h;
    for (int d = 0; d < s->D; d++)
        for (int y = 0; y < s->H; y++)
            for (int w = 0; w < s->W; w++) {
                const int p = (d * s->H + y) * s->W + w;
                const float *cz = cyz + (d * s->H + y) * C, *u = ux + w * C, *bv = bvol + (y * s->W + w) * C;
                float *xp = x + p * 2 * C;
                for (int k = 0; k < C; k++) xp[k] = cz[k] * u[k] + bv[k];
                for (int k = 0; k < C; k++) xp[C + k] = hh[p * C + k];
            }
}

/* The batch-level arrays of one call. */
typedef struct {
    const float *cz, *uy, *ux, *bvol, *wz, *wy, *wx, *taps, *biases, *mix_w, *mix_b, *mix_t;
} Inputs;

/* cyz[d, h] = cz[d] * uy[h]: the write volume without its W factor, (D*H, C). */
INLINE void outer_cyz(const int C, const Shape *s, const float *restrict cz, const float *restrict uy,
                      float *restrict cyz) {
    for (int d = 0; d < s->D; d++)
        for (int h = 0; h < s->H; h++)
            for (int k = 0; k < C; k++) cyz[(d * s->H + h) * C + k] = cz[d * C + k] * uy[h * C + k];
}

/* One sequence through all N steps: reads, final state, and (if hs) each step's
 * input state and gates. Each step writes its new state straight into the next
 * step's saved slot (or into one of two scratch volumes), so nothing is copied. */
INLINE void forward_sequence(const int C, const Shape *s, int N, size_t bi, const Inputs *in, const float *h0,
                             const float *c0, float *hN, float *cN, float *reads, float *hs, float *cs, float *gs,
                             float *scratch) {
    const int P = s->P, D = s->D, H = s->H, W = s->W;
    const size_t PC = (size_t)P * C;
    float *a = scratch, *b = a + PC, *hc = b + PC, *x = hc + PC, *z = x + 2 * PC, *spare = z + 4 * PC;
    float *cyz = spare + 4 * PC, *ping = cyz + PC;  /* ping: two (h, c) pairs for a run that keeps nothing */
    const float *h = h0, *c = c0;
    if (hs) {
        memcpy(hs + bi * N * PC, h0, PC * sizeof(float));
        memcpy(cs + bi * N * PC, c0, PC * sizeof(float));
    }
    for (int n = 0; n < N; n++) {
        const size_t bn = bi * N + n;
        const float *wz = in->wz + bn * D, *wy = in->wy + bn * H, *wx = in->wx + bn * W;
        float *h_out = n == N - 1 ? hN : hs ? hs + (bn + 1) * PC : ping + (n % 2) * 2 * PC;
        float *c_out = n == N - 1 ? cN : hs ? cs + (bn + 1) * PC : ping + (n % 2) * 2 * PC + PC;
        /* The read: trilinear weights touch at most 2 cells per axis; skipping zeros is exact. */
        float r[C];
        for (int k = 0; k < C; k++) r[k] = 0.0f;
        for (int d = 0; d < D; d++) {
            if (wz[d] == 0.0f) continue;
            for (int y = 0; y < H; y++) {
                if (wy[y] == 0.0f) continue;
                const float wzy = wz[d] * wy[y];
                for (int w = 0; w < W; w++) {
                    if (wx[w] == 0.0f) continue;
                    const float wt = wzy * wx[w], *hp = h + ((d * H + y) * W + w) * C;
                    for (int k = 0; k < C; k++) r[k] += wt * hp[k];
                }
            }
        }
        memcpy(reads + bn * C, r, sizeof r);
        if (n == N - 1 && !hN) break;
        outer_cyz(C, s, in->cz + bn * D * C, in->uy + bn * H * C, cyz);
        operator_input(C, s, h, cyz, in->ux + bn * W * C, in->bvol, in->taps, in->biases, a, b, hc, x);
        gemm(P, 2 * C, 4 * C, x, 2 * C, 1, in->mix_w, 4 * C, z, 4 * C, in->mix_b, 0);
        float *gates = gs ? gs + bn * 4 * PC : spare;
        for (int p = 0; p < P; p++) {
            const float *zp = z + p * 4 * C, *cp = c + p * C;
            float *gp = gates + p * 4 * C, *hp = h_out + p * C, *cq = c_out + p * C;
            int k = 0;
            for (; k + VW <= C; k += VW) gates_forward(C, k, VW, zp, cp, gp, hp, cq);
            if (k < C) gates_forward(C, k, C - k, zp, cp, gp, hp, cq);
        }
        h = h_out, c = c_out;
    }
    if (N == 0 && hN) {
        memcpy(hN, h0, PC * sizeof(float));
        memcpy(cN, c0, PC * sizeof(float));
    }
}

/* The gradients of one sequence-step's inputs, written by backward_sequence. */
typedef struct {
    float *cz, *uy, *ux, *wz, *wy, *wx;
} StepGrads;

/* One sequence's backward through all N steps, last first. dh, dc hold the gradients
 * of the final state on entry and those of the initial state on return; scratch
 * holds 18 volumes of P x C. */
INLINE void backward_sequence(const int C, const Shape *s, int N, size_t bi, const Inputs *in, const float *hs,
                              const float *cs, const float *gs, const float *d_reads, float *restrict dh,
                              float *restrict dc, StepGrads out, float *g, float *scratch) {
    const int P = s->P, D = s->D, H = s->H, W = s->W, DH = D * H, C2 = 2 * C, C4 = 4 * C;
    const size_t PC = (size_t)P * C;
    float *a = scratch, *b = a + PC, *hc = b + PC, *x = hc + PC, *dz = x + 2 * PC;
    float *dx = dz + 4 * PC, *da = dx + 2 * PC, *db = da + PC, *dhc = db + PC;
    float *cyz = dhc + PC, *dcyz = cyz + PC, *dw3 = dcyz + PC, *dwzy = dw3 + PC;
    float *g_mix = g, *g_mixb = g_mix + C2 * C4, *g_bvol = g_mixb + C4, *g_taps = g_bvol + H * W * C;
    float *g_bias = g_taps + 9 * C;
    for (int n = N - 1; n >= 0; n--) {
        const size_t bn = bi * N + n;
        const float *restrict h = hs + bn * PC, *restrict c = cs + bn * PC, *restrict gates = gs + bn * 4 * PC;
        const float *czn = in->cz + bn * D * C, *uyn = in->uy + bn * H * C, *uxn = in->ux + bn * W * C;
        const float *wz = in->wz + bn * D, *wy = in->wy + bn * H, *wx = in->wx + bn * W;
        const float *dr = d_reads + bn * C;
        if (n > 0)  /* the previous step's saved state and gates, read next */
            for (size_t i = 0; i < PC; i += 64 / sizeof(float)) {
                __builtin_prefetch(hs + (bn - 1) * PC + i);
                __builtin_prefetch(cs + (bn - 1) * PC + i);
                for (int j = 0; j < 4; j++) __builtin_prefetch(gs + (bn - 1) * 4 * PC + j * PC + i);
            }
        outer_cyz(C, s, czn, uyn, cyz);
        operator_input(C, s, h, cyz, uxn, in->bvol, in->taps, in->biases, a, b, hc, x);
        for (int p = 0; p < P; p++) {
            const float *gp = gates + p * C4, *cp = c + p * C;
            float *dhp = dh + p * C, *dcp = dc + p * C, *dzp = dz + p * C4;
            int k = 0;
            for (; k + VW <= C; k += VW) gates_backward(C, k, VW, gp, cp, dhp, dcp, dzp);
            if (k < C) gates_backward(C, k, C - k, gp, cp, dhp, dcp, dzp);
        }
        gemm(P, C4, C2, dz, C4, 1, in->mix_t, C2, dx, C2, NULL, 0);
        gemm(C2, P, C4, x, 1, C2, dz, C4, g_mix, C4, NULL, 1);
        float mixb[C4];
        for (int k = 0; k < C4; k++) mixb[k] = 0.0f;
        for (int p = 0; p < P; p++)
            for (int k = 0; k < C4; k++) mixb[k] += dz[p * C4 + k];
        for (int k = 0; k < C4; k++) g_mixb[k] += mixb[k];
        /* The write half: dx[:, :C] into cz, uy, ux and bvol. */
        float *restrict dux = out.ux + bn * W * C;
        for (int i = 0; i < DH * C; i++) dcyz[i] = 0.0f;
        for (int i = 0; i < W * C; i++) dux[i] = 0.0f;
        for (int d = 0; d < D; d++)
            for (int y = 0; y < H; y++)
                for (int w = 0; w < W; w++) {
                    const int p = (d * H + y) * W + w;
                    const float *dw = dx + p * C2, *cz = cyz + (d * H + y) * C, *u = uxn + w * C;
                    float *dcz = dcyz + (d * H + y) * C, *du = dux + w * C, *gb = g_bvol + (y * W + w) * C;
                    for (int k = 0; k < C; k++) {
                        dcz[k] += dw[k] * u[k];
                        du[k] += dw[k] * cz[k];
                        gb[k] += dw[k];
                    }
                }
        float *restrict dczn = out.cz + bn * D * C, *restrict duyn = out.uy + bn * H * C;
        for (int i = 0; i < D * C; i++) dczn[i] = 0.0f;
        for (int i = 0; i < H * C; i++) duyn[i] = 0.0f;
        for (int d = 0; d < D; d++)
            for (int y = 0; y < H; y++)
                for (int k = 0; k < C; k++) {
                    dczn[d * C + k] += dcyz[(d * H + y) * C + k] * uyn[y * C + k];
                    duyn[y * C + k] += dcyz[(d * H + y) * C + k] * czn[d * C + k];
                }
        /* The h half back through the W, H, D convs, then the read. */
        for (int p = 0; p < P; p++)
            for (int k = 0; k < C; k++) dhc[p * C + k] = dx[p * C2 + C + k];
        if (s->factorised) {
            float zero[C];
            for (int k = 0; k < C; k++) zero[k] = 0.0f;
            conv_bwd(C, s, 2, dhc, b, in->taps + 6 * C, zero, db, g_taps + 6 * C, g_bias + 2 * C);
            conv_bwd(C, s, 1, db, a, in->taps + 3 * C, zero, da, g_taps + 3 * C, g_bias + C);
            conv_bwd(C, s, 0, da, h, in->taps, zero, dh, g_taps, g_bias);
        } else {
            memcpy(dh, dhc, PC * sizeof(float));
        }
        for (int d = 0; d < D; d++)
            for (int y = 0; y < H; y++) {
                const float wzy = wz[d] * wy[y];
                float acc = 0.0f;
                for (int w = 0; w < W; w++) {
                    const int p = (d * H + y) * W + w;
                    const float wt = wzy * wx[w];
                    if (wt != 0.0f)
                        for (int k = 0; k < C; k++) dh[p * C + k] += dr[k] * wt;
                    dw3[p] = 0.0f;
                    if (wzy != 0.0f || wx[w] != 0.0f) {  /* else both sums below take dw3[p] times zero */
                        float t[C];
                        for (int k = 0; k < C; k++) t[k] = dr[k] * h[p * C + k];
                        dw3[p] = channel_sum(C, t);
                    }
                    acc += dw3[p] * wx[w];
                }
                dwzy[d * H + y] = acc;
            }
        /* w3 = (wz wy) wx, differentiated in that order, as autograd would. */
        float *dwz = out.wz + bn * D, *dwy = out.wy + bn * H, *dwx = out.wx + bn * W;
        for (int w = 0; w < W; w++) {
            float acc = 0.0f;
            for (int d = 0; d < D; d++)
                for (int y = 0; y < H; y++) acc += dw3[(d * H + y) * W + w] * (wz[d] * wy[y]);
            dwx[w] = acc;
        }
        for (int d = 0; d < D; d++) {
            float acc = 0.0f;
            for (int y = 0; y < H; y++) acc += dwzy[d * H + y] * wy[y];
            dwz[d] = acc;
        }
        for (int y = 0; y < H; y++) {
            float acc = 0.0f;
            for (int d = 0; d < D; d++) acc += dwzy[d * H + y] * wz[d];
            dwy[y] = acc;
        }
    }
}

/* Calls f(C) with C a literal for the paper's 16 channels and the ablation's 8, else
 * with the variable (each literal adds about 5 s to the build). */
#define DISPATCH(f)                        \
    switch (C) {                           \
        case 8: f(8); break;               \
        case 16: f(16); break;             \
        default: f(C); break;              \
    }

static void set_ftz(unsigned *saved) {
#ifdef HAVE_MXCSR
    *saved = _mm_getcsr();
    _mm_setcsr(*saved | 0x8040);  /* flush denormals to zero (FTZ | DAZ): they cost up to 40% here */
#else
    (void)saved;
#endif
}

static void restore_ftz(unsigned saved) {
#ifdef HAVE_MXCSR
    _mm_setcsr(saved);
#else
    (void)saved;
#endif
}

static float *alloc(size_t n) {
    void *p = NULL;
    return posix_memalign(&p, 64, (n ? n : 1) * sizeof(float)) ? NULL : (float *)p;
}

/* native.py refuses a build whose interface version is not its own INTERFACE_VERSION:
 * ctypes cannot see a signature, so a stale build would otherwise read its arguments
 * from the wrong places. Bump it with every change to a signature or exported function below. */
#define TM_INTERFACE_VERSION 3

int tm_interface_version(void) { return TM_INTERFACE_VERSION; }

/* Which of the vector variants above this build is: results record it, and kernels.py's
 * "auto" takes the native scan only for variants measured faster than the alternatives. */
const char *tm_variant(void) { return TM_VARIANT; }

/* 0 on success; 1 where a buffer could not be allocated; 2 where hN and cN are not both
 * given, or are NULL while something is kept for a backward. */
int tm_forward(int B, int N, int D, int H, int W, int C, int factorised, int nthreads,
               const float *cz, const float *uy, const float *ux, const float *bvol, const float *wz,
               const float *wy, const float *wx, const float *h0, const float *c0, const float *taps,
               const float *biases, const float *mix_w, const float *mix_b,
               float *reads, float *hN, float *cN, float *hs, float *cs, float *gs) {
    const Shape s = {D, H, W, D * H * W, factorised};
    const Inputs in = {cz, uy, ux, bvol, wz, wy, wx, taps, biases, mix_w, mix_b, NULL};
    const size_t PC = (size_t)s.P * C;
    if (!hN != !cN || (!hN && (hs || cs || gs))) return 2;
    int failed = 0;
#pragma omp parallel num_threads(nthreads) reduction(|| : failed)
    {
        unsigned csr;
        set_ftz(&csr);
        float *buf = alloc(PC * 18);
        if (!buf) failed = 1;
#pragma omp for schedule(static)
        for (int bi = 0; bi < B; bi++) {
            if (!buf) continue;
#define FORWARD(CC) forward_sequence(CC, &s, N, bi, &in, h0 + bi * PC, c0 + bi * PC,                 \
                                     hN ? hN + bi * PC : NULL, cN ? cN + bi * PC : NULL, reads, hs, cs, gs, buf)
            DISPATCH(FORWARD)
        }
        free(buf);
        restore_ftz(csr);
    }
    return failed;
}

int tm_backward(int B, int N, int D, int H, int W, int C, int factorised, int nthreads,
                const float *cz, const float *uy, const float *ux, const float *bvol, const float *wz,
                const float *wy, const float *wx, const float *taps, const float *biases, const float *mix_w,
                const float *hs, const float *cs, const float *gs, const float *d_reads, const float *d_hN,
                const float *d_cN, float *d_cz, float *d_uy, float *d_ux, float *d_wz, float *d_wy, float *d_wx,
                float *d_h0, float *d_c0, float *gparts, float *gsum) {
    const Shape s = {D, H, W, D * H * W, factorised};
    const int C2 = 2 * C, C4 = 4 * C;
    const size_t PC = (size_t)s.P * C;
    const size_t G = (size_t)C2 * C4 + C4 + (size_t)H * W * C + 12 * C;
    const StepGrads out = {d_cz, d_uy, d_ux, d_wz, d_wy, d_wx};
    int failed = 0;
    float *mix_t = alloc((size_t)C4 * C2);  /* mix_w transposed, so that dx = dz @ mix_t is a plain gemm */
    if (!mix_t) return 1;
    for (int i = 0; i < C2; i++)
        for (int j = 0; j < C4; j++) mix_t[j * C2 + i] = mix_w[i * C4 + j];
    const Inputs in = {cz, uy, ux, bvol, wz, wy, wx, taps, biases, mix_w, NULL, mix_t};
#pragma omp parallel num_threads(nthreads) reduction(|| : failed)
    {
        unsigned csr;
        set_ftz(&csr);
        float *buf = alloc(PC * 20);
        if (!buf) failed = 1;
#pragma omp for schedule(static)
        for (int bi = 0; bi < B; bi++) {
            if (!buf) continue;
            float *g = gparts + bi * G, *dh = buf + 18 * PC, *dc = dh + PC;
            memset(g, 0, G * sizeof(float));
            if (d_hN) memcpy(dh, d_hN + bi * PC, PC * sizeof(float)); else memset(dh, 0, PC * sizeof(float));
            if (d_cN) memcpy(dc, d_cN + bi * PC, PC * sizeof(float)); else memset(dc, 0, PC * sizeof(float));
#define BACKWARD(CC) backward_sequence(CC, &s, N, bi, &in, hs, cs, gs, d_reads, dh, dc, out, g, buf)
            DISPATCH(BACKWARD)
            if (d_h0) memcpy(d_h0 + bi * PC, dh, PC * sizeof(float));
            if (d_c0) memcpy(d_c0 + bi * PC, dc, PC * sizeof(float));
        }
        free(buf);
#pragma omp for schedule(static)
        for (size_t j = 0; j < G; j++) {
            float acc = 0.0f;
            for (int bi = 0; bi < B; bi++) acc += gparts[bi * G + j];
            gsum[j] = acc;
        }
        restore_ftz(csr);
    }
    free(mix_t);
    return failed;
}

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", "Tensor Memory CPU scan (called through ctypes).",
                                    -1, NULL};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
