"""The int8 weights' layout and the C product over it (`treesearch.models.int8_kernel` compiles it).

Layout: an int8 weight [N, K] is held in blocks of BLOCK = 16 output channels, k-major:
[ceil(N/16), K, 16], channel n's k-th weight at [n // 16, k, n % 16], channels past N zero
(`block`; `unblock` gives the plain matrix back). One block at one k is 16 bytes: one AVX-512 vector
of 16 channels once widened (two AVX2 vectors).

Why: with output channels in the vector lanes, a tile of R rows widens each weight vector once per
k for all R rows, broadcasts one activation per row, and keeps each (row, channel) dot product in one
lane as a chain of FMAs in k order. The earlier layout (plain [N, K], K in the lanes, each dot
product summed across lanes at the end) ran wide products (prefill, scoring, decode steps of many
searches) at 0.46-0.72x float32's on an AVX-512 Xeon at 16-256 rows; this one at 0.97-1.33x
(docs/guide/precision.md). The order is fixed per (row, channel), not by the tile, so a row's
result is the same bits in any batch and at any thread count (see the C below).

Tried and dropped: widening a chunk of channels once into a float32 scratch (all of K, in L2) for
every tile of rows to read: 0.82-0.91x float32's at 16-256 rows, slower than widening in registers.
"""

from __future__ import annotations

import torch

BLOCK = 16  # output channels per block of the int8 layout (`block`)


def blocks(n: int) -> int:
    """How many blocks of BLOCK channels hold n channels."""
    return -(-n // BLOCK)


def block(q: torch.Tensor) -> torch.Tensor:
    """An int8 weight [N, K] in the kernel's layout: [ceil(N/16), K, 16], block i holding channels
    16 i .. 16 i + 15 k-major (channel n's k-th weight at [n // 16, k, n % 16]), channels past N
    zero."""
    n, k = q.shape
    pad = blocks(n) * BLOCK - n
    if pad:
        q = torch.cat([q, q.new_zeros(pad, k)])
    return q.view(-1, BLOCK, k).transpose(1, 2).contiguous()


def unblock(b: torch.Tensor, n: int) -> torch.Tensor:
    """The plain [n, K] int8 weight of a blocked one (`block`): a new tensor."""
    return b.transpose(1, 2).reshape(-1, b.shape[1])[:n].contiguous()


BLOCKED = r"""
/* ---- The int8 product over blocked weights ----------------------------------------------------
   A weight [N, K] is stored in blocks of BL = 16 output channels, k-major: [ceil(N/16)][K][16]
   int8, channels past N zero. Output channels are in the vector lanes (one block is one AVX-512
   vector, two AVX2 vectors): every (row, channel) dot product is one lane's chain of FMAs over
   k = 0, 1, ..., K-1 in order, acc = fma(x[r,k], w[n,k], acc) from acc = 0; then times the
   channel's scale, plus its bias, plus other (`put`). A tile of R rows x V vectors keeps R V
   accumulators: per k it widens V weight vectors once and broadcasts R activations. Tiles only
   change which chains run side by side, never a chain: so a row's result is the same bits in any
   tile, beside any rows, at any thread count (threads share out vectors of channels; a chain is
   whole in one thread). */
#define BL 16
#if defined(TS_AVX512)
#define VLOADW_B(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#define VSET1(a) _mm512_set1_ps(a)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VST(p, v) _mm512_storeu_ps(p, v)
/* Tiles measured on one layer of the 0.5B (Xeon, 2 threads): 8 x 2, 8 x 3, 12 x 2 and 6 x 4 wide
   tiles within 5% of each other at 8 to 256 rows (the FMA ports are shared with the widening);
   8 x 2 holds 16 accumulators and was best at 8 to 64 rows. */
#define R_WIDE 8
#define V_WIDE 2
#define R_MID 4 /* 2-4 rows: 4 x 6 (5-7 rows: one 8 x 2 tile) */
#define V_MID 6
#define V_ONE 8 /* one row: 1 x 8, eight blocks' streams at once */
#else
#define VLOADW_B(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define VSET1(a) _mm256_set1_ps(a)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VST(p, v) _mm256_storeu_ps(p, v)
#define R_WIDE 4 /* 4 x 3: 12 accumulators of 16 registers (3 x 4 spills: 1.4x slower) */
#define V_WIDE 3
#define R_MID 4
#define V_MID 3
#define V_ONE 6
#endif
#ifndef TS_PF
#define TS_PF 64 /* k ahead that the weight stream is prefetched (64 k: 1 KB of a block's bytes) */
#endif

/* Vector v's first weight byte in a blocked matrix: block v W / 16, lane offset v W % 16. */
static inline const int8_t *vbase(const int8_t *w, int64_t K, int64_t v) {
    int64_t n = v * W;
    return w + (n / BL) * K * BL + n % BL;
}

/* y[n..] = ((acc * s) + b) + o for the channels n, n+1, ... < N of one vector, each operation
   rounded (no FMA contraction), in one function for every tile. */
#if defined(__GNUC__) && !defined(__clang__)
#define FINISH __attribute__((noinline, optimize("fp-contract=off")))
#else
#define FINISH __attribute__((noinline)) /* clang contracts only within one expression */
#endif
static FINISH void put(vf acc, float *y, const float *o, const float *s, const float *b, int64_t n,
                       int64_t N) {
    if (n + W <= N) {
        if (s) acc = VMUL(acc, VLOADX(s + n));
        if (b) acc = VADD(acc, VLOADX(b + n));
        if (o) acc = VADD(acc, VLOADX(o + n));
        VST(y + n, acc);
        return;
    }
    float t[W];
    VST(t, acc);
    for (int64_t j = 0; n + j < N; j++) {
        float a = t[j];
        if (s) a = a * s[n + j];
        if (b) a = a + b[n + j];
        if (o) a = a + o[n + j];
        y[n + j] = a;
    }
}

/* R rows (row pointers: a short tile repeats its last row) x V vectors from vector v0 of w. */
#define BTILE(R, V)                                                                                \
static void btile_##R##x##V(const float *const *xr, float *const *yr, const float *const *orow,   \
                            const int8_t *w, int64_t K, int64_t v0, const float *s, const float *b,\
                            int64_t N) {                                                           \
    vf acc[R][V];                                                                                  \
    const int8_t *wp[V];                                                                           \
    for (int j = 0; j < V; j++) wp[j] = vbase(w, K, v0 + j);                                       \
    for (int i = 0; i < R; i++)                                                                    \
        for (int j = 0; j < V; j++) acc[i][j] = VZERO();                                           \
    int64_t k = 0;                                                                                 \
    for (; k + 4 <= K; k += 4) {                                                                   \
        for (int j = 0; j < V; j++) PREFETCH(wp[j] + (k + TS_PF) * BL);                            \
        for (int u = 0; u < 4; u++) {                                                              \
            vf wv[V];                                                                              \
            for (int j = 0; j < V; j++) wv[j] = VLOADW_B(wp[j] + (k + u) * BL);                    \
            for (int i = 0; i < R; i++) {                                                          \
                vf xv = VSET1(xr[i][k + u]);                                                       \
                for (int j = 0; j < V; j++) acc[i][j] = VFMA(xv, wv[j], acc[i][j]);                \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    for (; k < K; k++) {                                                                           \
        vf wv[V];                                                                                  \
        for (int j = 0; j < V; j++) wv[j] = VLOADW_B(wp[j] + k * BL);                              \
        for (int i = 0; i < R; i++) {                                                              \
            vf xv = VSET1(xr[i][k]);                                                               \
            for (int j = 0; j < V; j++) acc[i][j] = VFMA(xv, wv[j], acc[i][j]);                    \
        }                                                                                          \
    }                                                                                              \
    for (int i = 0; i < R; i++)                                                                    \
        if (yr[i])                                                                                 \
            for (int j = 0; j < V; j++) put(acc[i][j], yr[i], orow[i], s, b, (v0 + j) * W, N);    \
}

#if defined(TS_AVX512)
BTILE(8, 1) BTILE(8, 2)
BTILE(4, 1) BTILE(4, 2) BTILE(4, 3) BTILE(4, 4) BTILE(4, 5) BTILE(4, 6)
BTILE(1, 1) BTILE(1, 2) BTILE(1, 3) BTILE(1, 4) BTILE(1, 5) BTILE(1, 6) BTILE(1, 7) BTILE(1, 8)
typedef void (*btile_fn)(const float *const *, float *const *, const float *const *, const int8_t *,
                         int64_t, int64_t, const float *, const float *, int64_t);
static const btile_fn wide_t[] = {0, btile_8x1, btile_8x2};
static const btile_fn mid_t[] = {0, btile_4x1, btile_4x2, btile_4x3, btile_4x4, btile_4x5, btile_4x6};
static const btile_fn one_t[] = {0, btile_1x1, btile_1x2, btile_1x3, btile_1x4, btile_1x5, btile_1x6,
                                 btile_1x7, btile_1x8};
#else
BTILE(4, 1) BTILE(4, 2) BTILE(4, 3)
BTILE(1, 1) BTILE(1, 2) BTILE(1, 3) BTILE(1, 4) BTILE(1, 5) BTILE(1, 6)
typedef void (*btile_fn)(const float *const *, float *const *, const float *const *, const int8_t *,
                         int64_t, int64_t, const float *, const float *, int64_t);
static const btile_fn wide_t[] = {0, btile_4x1, btile_4x2, btile_4x3};
static const btile_fn mid_t[] = {0, btile_4x1, btile_4x2, btile_4x3};
static const btile_fn one_t[] = {0, btile_1x1, btile_1x2, btile_1x3, btile_1x4, btile_1x5, btile_1x6};
#endif

/* Rows r0 .. r0+m-1 (m <= R) through an R-row tile of V vectors from v0: the tile's rows past m
   repeat row r0+m-1 and write nothing (y may be other: the residual, updated in place). */
static void bgroup(int R, btile_fn fn, const float *x, int64_t ldx, const float *o, int64_t ldo,
                   float *y, int64_t ldy, int64_t r0, int64_t m, const int8_t *w, int64_t K,
                   int64_t v0, const float *s, const float *b, int64_t N) {
    const float *xr[R_WIDE], *orow[R_WIDE];
    float *yr[R_WIDE];
    for (int i = 0; i < R; i++) {
        int64_t r = r0 + (i < m ? i : m - 1);
        xr[i] = x + r * ldx;
        orow[i] = o ? o + r * ldo : 0;
        yr[i] = i < m ? y + r * ldy : 0;
    }
    fn(xr, yr, orow, w, K, v0, s, b, N);
}

/* Rows [0, rows) of vectors [va, vb) of one blocked matrix: one row by 1 x V_ONE tiles, up to
   R_MID rows by R_MID x V_MID, more by R_WIDE x V_WIDE tiles for every row of a vector chunk (its
   weights read from memory once, then from cache), the last rows by the narrower tiles. */
static void brange(const float *x, int64_t ldx, int64_t rows, const int8_t *w, int64_t K,
                   const float *s, const float *b, const float *o, int64_t ldo, float *y, int64_t ldy,
                   int64_t N, int64_t va, int64_t vb) {
    if (rows == 1 || rows <= R_MID) {
        int64_t C = rows == 1 ? V_ONE : V_MID;
        for (int64_t v = va; v < vb; v += C) {
            int64_t V = vb - v < C ? vb - v : C;
            if (rows == 1) bgroup(1, one_t[V], x, ldx, o, ldo, y, ldy, 0, 1, w, K, v, s, b, N);
            else bgroup(R_MID, mid_t[V], x, ldx, o, ldo, y, ldy, 0, rows, w, K, v, s, b, N);
        }
        return;
    }
    for (int64_t v = va; v < vb; v += V_WIDE) {
        int64_t V = vb - v < V_WIDE ? vb - v : V_WIDE, r = 0;
        for (; r + R_WIDE <= rows; r += R_WIDE)
            bgroup(R_WIDE, wide_t[V], x, ldx, o, ldo, y, ldy, r, R_WIDE, w, K, v, s, b, N);
        int64_t m = rows - r;
        if (m > R_MID) bgroup(R_WIDE, wide_t[V], x, ldx, o, ldo, y, ldy, r, m, w, K, v, s, b, N);
        else if (m > 1) bgroup(R_MID, mid_t[V], x, ldx, o, ldo, y, ldy, r, m, w, K, v, s, b, N);
        else if (m == 1) bgroup(1, one_t[V], x, ldx, o, ldo, y, ldy, r, 1, w, K, v, s, b, N);
    }
}

/* A projection's parts side by side, y[:, part i's columns] = x W_i^T s_i + b_i (+ other): every
   part's vectors of channels shared out over the threads in contiguous ranges (whole blocks). */
static void proj_int8(const ts_proj *p, const float *x, int64_t ldx, int64_t rows, const float *other,
                      int64_t ldo, float *y, int64_t ldy, int64_t threads) {
    int64_t first[TS_PARTS + 1], col[TS_PARTS + 1];
    first[0] = col[0] = 0;
    for (int64_t i = 0; i < p->nparts; i++) {
        first[i + 1] = first[i] + (p->n[i] + BL - 1) / BL * (BL / W);
        col[i + 1] = col[i] + p->n[i];
    }
    int64_t nv = first[p->nparts], per = BL / W, nb = nv / per;
#ifndef _OPENMP
    threads = 1;
#endif
    if (threads > nb) threads = nb;
    if (threads < 1) threads = 1;
#pragma omp parallel for num_threads((int)threads) schedule(static) if (threads > 1)
    for (int64_t t = 0; t < threads; t++) {
        int64_t a = nb * t / threads * per, e = nb * (t + 1) / threads * per;
        for (int64_t i = 0; i < p->nparts; i++) {
            int64_t lo = a > first[i] ? a : first[i], hi = e < first[i + 1] ? e : first[i + 1];
            int64_t last = first[i] + (p->n[i] + W - 1) / W; /* vectors wholly past n: none */
            if (hi > last) hi = last;
            if (lo < hi)
                brange(x, ldx, rows, (const int8_t *)p->w[i], p->K, p->scale[i], p->bias[i],
                       other ? other + col[i] : 0, ldo, y + col[i], ldy, p->n[i], lo - first[i],
                       hi - first[i]);
        }
    }
}

/* y [rows, sum n_i] (row stride ldy) = a projection's int8 parts side by side (+ other). */
void ts_int8_proj(const ts_proj *p, const float *x, int64_t ldx, int64_t rows, const float *other,
                  int64_t ldo, float *y, int64_t ldy, int64_t threads) {
    proj_int8(p, x, ldx, rows, other, ldo, y, ldy, threads);
}

/* Rows of an int8 table as float32 (an embedding lookup): out[i] = w[ids[i]] * scale[ids[i]]. */
void ts_int8_rows(const int64_t *ids, int64_t n, const int8_t *w, const float *scale, int64_t K,
                  float *out) {
    for (int64_t i = 0; i < n; i++) {
        const int8_t *src = w + ids[i] / BL * K * BL + ids[i] % BL; /* its lane of its block */
        float s = scale[ids[i]];
        for (int64_t k = 0; k < K; k++) out[i * K + k] = (float)src[k * BL] * s;
    }
}
"""
