"""Attention in one compiled call per layer, on every thread the forward has: the decode step's
(every row's one query) and, through `treesearch.cache.attention`, a prefill or scoring chunk's
(each row's queries at consecutive positions).

Why: read with torch ops, a step's attention is a few small products per cached run and layer,
each paying dispatch and (on several threads) an OpenMP fork/join far above its arithmetic, so the
decoder ran them on one thread (`SERIAL_ATTENTION`) and the step's K/V reads serialised. This
kernel reads every run a row attends over (the cached prefix runs, shared or not, the rows' own
runs and the forward's new K/V) in place, in one call per layer, split flash-decoding style into
work units. A row's context (its runs side by side) is cut into blocks of `CHUNK` positions
counted from its start, the same blocks however the context is cut into runs; a unit is one block
of one kv head (read once for every row that holds the same keys there: a shared prefix run), and
computes, for each query that sees part of it, its g query heads' scores over the keys it sees
there, their maximum m, sum l = sum_i e^{s_i - m} and acc = sum_i e^{s_i - m} v_i. The units are
shared out over the threads; then each (query, kv head) merges its blocks in order, exactly
(Hydragen):
    out = sum_c e^{m_c - M} acc_c / sum_c e^{m_c - M} l_c,  M = max_c m_c.
So a query's result depends only on its own keys and position, never on the thread count, the
other rows of the forward (their lengths, their padding, their prefixes), how its context was cut
into cached runs (a shared prefix against a whole prompt, a prompt prefilled in parts), or whether
a prefill or a decode step computes it: batch invariance (issue 42;
tests/engine/test_batch_invariance.py).

It is C, built and cached like `treesearch.kernels.runs_kernel` (same compiler, flags and switch
`TREESEARCH_RUNS_KERNEL=0`); where it cannot be built `load()` returns None and the decoder takes
the torch-op attention (not batch invariant). tests/engine/test_attend_kernel.py checks it against
float64 softmax.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from treesearch.kernels import runs_kernel
from treesearch.kernels.simd import VEC8

CHUNK = 128  # positions per block: 1,000 cached tokens over 3 kv heads make 24 units

SOURCE = (
    r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

"""
    + VEC8
    + r"""
static inline float hsum(v8 a) {
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

static inline float dot(const float *a, const float *b, int64_t d) {
    int64_t x = 0;
    float s = 0.0f;
    if (d >= 8) {
        v8 acc = ld(a) * ld(b);
        for (x = 8; x + 8 <= d; x += 8) acc += ld(a + x) * ld(b + x);
        s = hsum(acc);
    }
    for (; x < d; x++) s += a[x] * b[x];
    return s;
}

/* acc[x] += p * v[x] */
static inline void axpy(float *acc, float p, const float *v, int64_t d) {
    int64_t x = 0;
    v8 pv = splat(p);
    for (; x + 8 <= d; x += 8) st(acc + x, ld(acc + x) + pv * ld(v + x));
    for (; x < d; x++) acc[x] += p * v[x];
}

/* Tokens ahead that the score loops fetch K and V lines for: without it the step's attention
   read its K/V from memory at about half the rate the products stream at (a hint only: it
   changes no arithmetic, and past the end of a run it is a no-op). */
#define AHEAD 16
#define PREFETCH(p) __builtin_prefetch(p)

#ifdef __AVX__
#include <immintrin.h>
/* hsum of four vectors at once, each in hsum's order ((a0+a4)+(a1+a5))+((a2+a6)+(a3+a7)) (the
   same bits as four hsum calls): s[0..3] = hsum(a), hsum(b), hsum(c), hsum(e). */
static inline void hsum4(v8 a, v8 b, v8 c, v8 e, float *s) {
    __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps((__m256)a, (__m256)b, 0x20),
                              _mm256_permute2f128_ps((__m256)a, (__m256)b, 0x31));
    __m256 ce = _mm256_add_ps(_mm256_permute2f128_ps((__m256)c, (__m256)e, 0x20),
                              _mm256_permute2f128_ps((__m256)c, (__m256)e, 0x31));
    __m256 h = _mm256_hadd_ps(ab, ce); /* a01 a23 c01 c23 | b01 b23 e01 e23 */
    __m128 r = _mm_hadd_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)); /* a c b e */
    _mm_storeu_ps(s, _mm_shuffle_ps(r, r, _MM_SHUFFLE(3, 1, 2, 0)));
}
#else
static inline void hsum4(v8 a, v8 b, v8 c, v8 e, float *s) {
    s[0] = hsum(a), s[1] = hsum(b), s[2] = hsum(c), s[3] = hsum(e);
}
#endif

/* The T scores of query j from the accumulators a[T][M], stored at s[0..T). */
#define SUMS_4(a, j, s) hsum4(a[0][j], a[1][j], a[2][j], a[3][j], s)
#define SUMS_2(a, j, s) ((s)[0] = hsum(a[0][j]), (s)[1] = hsum(a[1][j]))

/* Scores of M queries (qp[0..M)) against tokens [0, n), T at a time: T M independent FMA chains
   where `dot` has one. Each score is summed in `dot`'s order (the same bits). d: a multiple of 8.
   v: the run's V, whose lines are fetched ahead beside K's (NULL: fetch nothing, the lines are
   in cache already). */
#define SCORES(M, T)                                                                                \
static void scores_##M##_##T(const float *const *qp, const float *k, const float *v, int64_t tok,   \
                             int64_t n, int64_t d, float *s, int64_t ldn) {                         \
    int64_t i = 0;                                                                                  \
    for (; i + T <= n; i += T) {                                                                    \
        const float *kt = k + i * tok;                                                              \
        if (v)                                                                                      \
            for (int t = 0; t < T; t++)                                                             \
                for (int64_t x = 0; x < d; x += 16) {                                               \
                    PREFETCH(kt + (AHEAD + t) * tok + x);                                           \
                    PREFETCH(v + (i + AHEAD + t) * tok + x);                                        \
                }                                                                                   \
        v8 a[T][M];                                                                                 \
        for (int t = 0; t < T; t++)                                                                 \
            for (int j = 0; j < M; j++) a[t][j] = splat(0.0f);                                      \
        for (int64_t x = 0; x < d; x += 8) {                                                        \
            v8 kv[T];                                                                               \
            for (int t = 0; t < T; t++) kv[t] = ld(kt + t * tok + x);                               \
            for (int j = 0; j < M; j++) {                                                           \
                v8 qv = ld(qp[j] + x);                                                              \
                for (int t = 0; t < T; t++) a[t][j] += qv * kv[t];                                  \
            }                                                                                       \
        }                                                                                           \
        for (int j = 0; j < M; j++) SUMS_##T(a, j, s + j * ldn + i);                                \
    }                                                                                               \
    for (; i < n; i++)                                                                              \
        for (int j = 0; j < M; j++) s[j * ldn + i] = dot(qp[j], k + i * tok, d);                    \
}
SCORES(1, 4)
SCORES(2, 4)
SCORES(3, 4)
SCORES(4, 2)
#ifdef __AVX512VL__
/* 32 vector registers: wider tiles (the same sums in the same order, so the same bits) */
SCORES(4, 4)
#define SCORES_4 scores_4_4
#define VQ 6
#else
#define SCORES_4 scores_4_2
#define VQ 3
#endif

/* acc[j] = sum_i p[j][i] v_i over tokens i in order, for M queries, 32 of the d values at a time
   held in registers (the order `axpy` adds in: the same bits); more: go on from acc (the next
   piece of a block: the same bits as one call over both). d: a multiple of 32. */
#define VSUM(M)                                                                                     \
static void vsum_##M(const float *p, int64_t ldn, const float *v, int64_t tok, int64_t n, int64_t d, \
                     float *acc, int more) {                                                        \
    for (int64_t x = 0; x < d; x += 32) {                                                           \
        v8 a[M][4];                                                                                 \
        for (int j = 0; j < M; j++)                                                                 \
            for (int c = 0; c < 4; c++) a[j][c] = more ? ld(acc + j * d + x + 8 * c) : splat(0.0f); \
        for (int64_t i = 0; i < n; i++) {                                                           \
            const float *vi = v + i * tok + x;                                                      \
            v8 w0 = ld(vi), w1 = ld(vi + 8), w2 = ld(vi + 16), w3 = ld(vi + 24);                    \
            for (int j = 0; j < M; j++) {                                                           \
                v8 pj = splat(p[j * ldn + i]);                                                      \
                a[j][0] += pj * w0, a[j][1] += pj * w1, a[j][2] += pj * w2, a[j][3] += pj * w3;     \
            }                                                                                       \
        }                                                                                           \
        for (int j = 0; j < M; j++)                                                                 \
            for (int c = 0; c < 4; c++) st(acc + j * d + x + 8 * c, a[j][c]);                       \
    }                                                                                               \
}
VSUM(1)
VSUM(2)
VSUM(3)
#ifdef __AVX512VL__
VSUM(6)
#endif

/* A block's keys from one run: K and V at its first key, token stride tok, n keys. */
typedef struct {
    const float *k, *v;
    int64_t tok, n;
} piece_t;

/* One work unit: one block of n keys, in pieces pc[0..npc) side by side, for nq queries at qp[],
   query j seeing its first nk[j] keys (1..n): scores into s (nq x n), then per query over its own
   nk[j] keys its max m, sum l = sum_i e^{s_i - m} and acc = sum_i e^{s_i - m} v_i, written at
   dst[j] (acc [d], m, l). A query's sums run over its own keys only, in key order: the same bits
   whatever else the unit holds (a probability past a query's keys is 0, and acc + 0 v is acc) and
   however the block is cut into pieces (a score is one key's, and acc goes on from piece to
   piece). acc: nq d scratch. */
static void unit(const float *const *qp, int64_t nq, const int64_t *nk, const piece_t *pc, int64_t npc,
                 int64_t n, int64_t d, float *s, float *acc, float *const *dst) {
    int64_t off = 0;
    for (int64_t e = 0; e < npc && off < n; e++) {
        const float *k = pc[e].k, *v = pc[e].v;
        int64_t tok = pc[e].tok, m_e = pc[e].n < n - off ? pc[e].n : n - off;
        if (d % 8 == 0) {
            for (int64_t j = 0; j < nq; j += 4) {
                int64_t m = nq - j < 4 ? nq - j : 4;
                const float *pv = j ? 0 : v; /* the first pass fetches ahead */
                float *sj = s + j * n + off;
                if (m == 4) SCORES_4(qp + j, k, pv, tok, m_e, d, sj, n);
                else if (m == 3) scores_3_4(qp + j, k, pv, tok, m_e, d, sj, n);
                else if (m == 2) scores_2_4(qp + j, k, pv, tok, m_e, d, sj, n);
                else scores_1_4(qp + j, k, pv, tok, m_e, d, sj, n);
            }
        } else {
            for (int64_t i = 0; i < m_e; i++) {
                const float *ki = k + i * tok;
                for (int64_t j = 0; j < nq; j++) s[j * n + off + i] = dot(qp[j], ki, d);
            }
        }
        off += m_e;
    }
    for (int64_t j = 0; j < nq; j++) {
        int64_t nj = nk[j];
        float *sj = s + j * n, m = sj[0];
        int64_t i = 1;
        if (nj >= 16) { /* eight lanes at a time: a maximum is exact in any order */
            v8 m8 = ld(sj);
            for (i = 8; i + 8 <= nj; i += 8) {
                v8 x = ld(sj + i);
                m8 = sel(x > m8, x, m8);
            }
            for (int l = 0; l < 8; l++) m = m8[l] > m ? m8[l] : m;
        }
        for (; i < nj; i++) m = sj[i] > m ? sj[i] : m;
        i = 0;
        v8 sum8 = splat(0.0f);
        for (; i + 8 <= nj; i += 8) {
            v8 p = exp8(ld(sj + i) - splat(m));
            st(sj + i, p);
            sum8 += p;
        }
        float sum = hsum(sum8);
        if (i < nj) {
            float tail[8] = {0};
            for (int64_t x = i; x < nj; x++) tail[x - i] = sj[x] - m;
            for (int64_t x = nj - i; x < 8; x++) tail[x] = -INFINITY;
            v8 p = exp8(ld(tail));
            for (int64_t x = i; x < nj; x++) { sj[x] = p[x - i]; sum += p[x - i]; }
        }
        for (int64_t x = nj; x < n; x++) sj[x] = 0.0f;
        dst[j][d] = m;
        dst[j][d + 1] = sum;
    }
    if (d % 32 != 0) memset(acc, 0, sizeof(float) * (size_t)(nq * d));
    off = 0;
    for (int64_t e = 0; e < npc && off < n; e++) {
        const float *v = pc[e].v;
        int64_t tok = pc[e].tok, m_e = pc[e].n < n - off ? pc[e].n : n - off;
        if (d % 32 == 0) {
            for (int64_t j = 0; j < nq;) {
                int64_t m = nq - j < VQ ? nq - j : VQ; /* VQ queries at a time, then 3, 2, 1 */
                if (m > 3 && m < VQ) m = 3;
                float *a = acc + j * d;
                const float *p = s + j * n + off;
#if VQ == 6
                if (m == 6) vsum_6(p, n, v, tok, m_e, d, a, e > 0);
                else
#endif
                if (m == 3) vsum_3(p, n, v, tok, m_e, d, a, e > 0);
                else if (m == 2) vsum_2(p, n, v, tok, m_e, d, a, e > 0);
                else vsum_1(p, n, v, tok, m_e, d, a, e > 0);
                j += m;
            }
        } else {
            for (int64_t i = 0; i < m_e; i++) {
                const float *vi = v + i * tok;
                for (int64_t j = 0; j < nq; j++) axpy(acc + j * d, s[j * n + off + i], vi, d);
            }
        }
        off += m_e;
    }
    for (int64_t j = 0; j < nq; j++) memcpy(dst[j], acc + j * d, sizeof(float) * (size_t)d);
}

#define QT 32 /* queries per work item (each with its g heads) */

/* Attention of `rows` queries, each over the keys at positions 0..pos[b] of its row's context, cut
   into blocks of `chunk` positions counted from the context's start: block c holds positions
   [c chunk, (c + 1) chunk). Each (query, block) gets its partial (m, l, acc) over the keys it sees
   there (a unit: block c of some row's context, possibly read by several rows that hold the same
   keys there, e.g. a shared prefix run), then each (query, kv head) merges its blocks in block
   order, exactly (Hydragen):
       out = sum_c e^{m_c - M} acc_c / sum_c e^{m_c - M} l_c,  M = max_c m_c.
   A query's result depends only on its own keys and position: not on the other queries, the
   thread count, the batch, or how its context was cut into runs (a block's keys are read from its
   pieces in order). units: per unit 6 int64 (first piece, pieces, keys n <= chunk, first reader range,
   ranges, block c); pieces: per piece 7 int64 (K address at layer 0, head 0 and the piece's first
   token; V's; K's layer stride; V's; head stride; token stride; tokens); readers: pos[rows] (the
   last position each query sees, -1: none: its output is 0), then 2 int64 per reader range (queries
   [q0, q1), each seeing the block from position c chunk on). q: [rows, hkv, g, d], row stride
   q_row; out [rows, hkv, g, d] contiguous. Strides in floats. Returns 0, or -1 (out of memory). */
int ts_attend(const float *q, int64_t q_row, float *out, int64_t rows, int64_t hkv, int64_t g,
              int64_t d, const int64_t *units, const int64_t *pieces, const int64_t *readers,
              int64_t nunits, int64_t layer, int64_t threads, int64_t chunk) {
    const int64_t *pos = readers, *ranges = readers + rows;
    int64_t *qbase = malloc(sizeof(int64_t) * (size_t)(rows + nunits + 2));
    if (!qbase) return -1;
    int64_t *wbase = qbase + rows + 1;
    qbase[0] = 0;
    for (int64_t b = 0; b < rows; b++) qbase[b + 1] = qbase[b] + (pos[b] >= 0 ? pos[b] / chunk + 1 : 0);
    wbase[0] = 0;
    for (int64_t u = 0; u < nunits; u++) {
        const int64_t *U = units + 6 * u;
        int64_t nq = 0;
        for (int64_t r = 0; r < U[4]; r++) nq += ranges[2 * (U[3] + r) + 1] - ranges[2 * (U[3] + r)];
        wbase[u + 1] = wbase[u] + (nq + QT - 1) / QT;
    }
    int64_t slots = qbase[rows] * hkv * g, items = wbase[nunits] * hkv, w = d + 2;
#ifndef _OPENMP
    threads = 1;
#endif
    if (threads < 1) threads = 1;
    /* per thread: scores, acc, then nk, the query and partial pointers and the pieces */
    int64_t nq = QT * g, fl = (nq * chunk + nq * d + 1) / 2 * 2, per = fl + 6 * nq + 8 * chunk;
    float *part = malloc(sizeof(float) * (size_t)(slots > 0 ? slots * w : 1));
    float *scratch = malloc(sizeof(float) * (size_t)(per * threads));
    if (!part || !scratch) {
        free(qbase); free(part); free(scratch);
        return -1;
    }
#pragma omp parallel num_threads((int)threads) if (threads > 1)
    {
#ifdef _OPENMP
        float *s = scratch + per * omp_get_thread_num();
#else
        float *s = scratch;
#endif
        float *acc = s + nq * chunk;
        int64_t *nk = (int64_t *)(void *)(s + fl); /* 8-byte aligned: fl and per are even */
        const float **qp = (const float **)(void *)(nk + nq);
        float **dst = (float **)(void *)(qp + nq);
        piece_t *pc = (piece_t *)(void *)(dst + nq);
#pragma omp for schedule(static)
        for (int64_t x = 0; x < slots; x++) part[x * w + d] = -INFINITY;
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            int64_t h = it % hkv, wi = it / hkv, lo = 0, hi = nunits - 1;
            while (lo < hi) { /* the unit of work item wi: wbase[u] <= wi < wbase[u + 1] */
                int64_t mid = (lo + hi + 1) / 2;
                if (wbase[mid] <= wi) lo = mid;
                else hi = mid - 1;
            }
            const int64_t *U = units + 6 * lo;
            int64_t n = U[2], c = U[5], skip = (wi - wbase[lo]) * QT, take = QT, na = 0;
            for (int64_t r = 0; r < U[4] && take > 0; r++) {
                int64_t q0 = ranges[2 * (U[3] + r)], q1 = ranges[2 * (U[3] + r) + 1];
                if (skip >= q1 - q0) { skip -= q1 - q0; continue; }
                for (int64_t b = q0 + skip; b < q1 && take > 0; b++, take--) {
                    int64_t see = pos[b] + 1 - c * chunk;
                    if (see <= 0) continue;
                    for (int64_t j = 0; j < g; j++) {
                        qp[na * g + j] = q + b * q_row + (h * g + j) * d;
                        nk[na * g + j] = see < n ? see : n;
                        dst[na * g + j] = part + (((qbase[b] + c) * hkv + h) * g + j) * w;
                    }
                    na++;
                }
                skip = 0;
            }
            if (!na) continue;
            int64_t most = 0;
            for (int64_t j = 0; j < na * g; j++) most = nk[j] > most ? nk[j] : most;
            const int64_t *P = pieces + 7 * U[0];
            int64_t npc = 0;
            for (int64_t e = 0, at = 0; e < U[1] && at < most; e++, P += 7, npc++) {
                pc[npc].k = (const float *)(intptr_t)P[0] + layer * P[2] + h * P[4];
                pc[npc].v = (const float *)(intptr_t)P[1] + layer * P[3] + h * P[4];
                pc[npc].tok = P[5];
                pc[npc].n = P[6];
                at += P[6];
            }
            unit(qp, na * g, nk, pc, npc, most, d, s, acc, dst);
        }
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < rows * hkv; bh++) {
            int64_t b = bh / hkv, h = bh % hkv, nb = qbase[b + 1] - qbase[b];
            float *o = out + bh * g * d;
            for (int64_t j = 0; j < g; j++) {
                float big = -INFINITY, den = 0.0f;
                for (int64_t c = 0; c < nb; c++) {
                    float m = part[(((qbase[b] + c) * hkv + h) * g + j) * w + d];
                    big = m > big ? m : big;
                }
                float *oj = o + j * d;
                memset(oj, 0, sizeof(float) * (size_t)d);
                for (int64_t c = 0; c < nb; c++) {
                    const float *p = part + (((qbase[b] + c) * hkv + h) * g + j) * w;
                    if (p[d] == -INFINITY) continue;
                    float wt = expf(p[d] - big);
                    den += wt * p[d + 1];
                    axpy(oj, wt, p, d);
                }
                if (den > 0.0f) {
                    float inv = 1.0f / den;
                    for (int64_t y = 0; y < d; y++) oj[y] *= inv;
                }
            }
        }
    }
    free(qbase);
    free(part);
    free(scratch);
    return 0;
}
"""
)

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_ARGS = [_PTR, _I64, _PTR, _I64, _I64, _I64, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64]
_state: dict[str, Any] = {}


def load() -> Any:
    """The compiled `ts_attend`, or None where it cannot be had (see `reason()`); built once per
    process."""
    return runs_kernel.load_once(_state, SOURCE, "attend", "ts_attend", _ARGS)


def reason() -> str:
    """Why the kernel is or is not used in this process."""
    load()
    return str(_state["reason"])


class StepRuns:
    """The kernel's table for one forward: each row's runs in context order (`add`: a cached prefix
    run, shared or not, or a stretch of the step's buffer or a prefill's new K/V), cut into blocks
    of `CHUNK` positions from the context's start (a block inside one run is a unit read once for
    every row that holds it at the same place; a block across runs reads its pieces in turn), and the
    queries: one per row at its last key (a decode step) or a row's chunk of consecutive positions
    (`done(spans=...)`: prefill, scoring). Made once per forward, read by every layer's call; the
    tensors it points into are kept alive here."""

    def __init__(self) -> None:
        self.rows: dict[int, list[tuple[torch.Tensor, torch.Tensor, int]]] = {}
        self.keep: list[torch.Tensor] = []
        self.entries: list[list[int]] = []

    def add(self, k: torch.Tensor, v: torch.Tensor, length: int, readers: list[int]) -> None:
        """A run read by `readers`, next in each reader's context: k and v [L, Hkv, >= length, d]
        views with the same head and token strides (d contiguous)."""
        if length <= 0:
            return
        for r in readers:
            self.rows.setdefault(r, []).append((k, v, length))
        self.keep += [k, v]

    @staticmethod
    def fits(k: torch.Tensor, v: torch.Tensor) -> bool:
        """K and V views the kernel can read: float32 on the CPU, d contiguous, K and V alike in
        head and token strides."""
        return (
            k.dtype == v.dtype == torch.float32
            and k.device.type == v.device.type == "cpu"
            and k.stride(3) == v.stride(3) == 1
            and k.stride()[1:3] == v.stride()[1:3]
        )

    def done(self, queries: int | None = None, spans: list[tuple[int, int, int, int]] | None = None) -> None:
        """Freeze the table. spans: (row, first query, count, position of the first): the row's
        queries at consecutive positions of its context (0-based, counted over its runs); None:
        one query per row (query b is row b) at its context's last position. queries: how many
        query rows the kernel's q and out hold (default: one past the last query)."""
        if spans is None:
            spans = [(r, r, 1, sum(n for _, _, n in runs) - 1) for r, runs in self.rows.items()]
        nq = max([b + n for _, b, n, _ in spans], default=0) if queries is None else queries
        pos = [-1] * nq
        by_row: dict[int, list[tuple[int, int, int]]] = {}
        for row, q0, n, p0 in spans:
            pos[q0 : q0 + n] = range(p0, p0 + n)
            by_row.setdefault(row, []).append((q0, n, p0))
        units: dict[tuple, list[tuple[int, int]]] = {}
        size = CHUNK
        for row, mine in by_row.items():
            top = max(p0 + n - 1 for _, n, p0 in mine)  # the last position any of its queries sees
            pending: list[tuple[int, ...]] = []
            o = 0
            for k, v, length in self.rows.get(row, []):
                if o > top:
                    break
                length = min(length, top + 1 - o)
                kp, vp = k.data_ptr(), v.data_ptr()
                sk, sv = k.stride(), v.stride()
                esz = k.element_size()
                i = 0
                while i < length:
                    a = o + i
                    n = min(length - i, size - a % size)
                    pending.append(
                        (kp + i * sk[2] * esz, vp + i * sv[2] * esz, sk[0], sv[0], sk[1], sk[2], n)
                    )
                    i += n
                    if (a + n) % size == 0 or a + n == top + 1:  # the block is whole
                        c = a // size
                        readers = units.setdefault((c, *pending), [])
                        for q0, cnt, p0 in mine:  # the queries at or past the block's start
                            j0 = max(0, c * size - p0)
                            if j0 < cnt:
                                readers.append((q0 + j0, q0 + cnt))
                        pending = []
                o += length
            if o < top + 1:
                raise ValueError(f"row {row}'s runs hold {o} keys; its queries reach position {top}")
        table: list[list[int]] = []
        pieces: list[tuple[int, ...]] = []
        ranges: list[tuple[int, int]] = []
        for (c, *parts), readers in units.items():
            if not readers:
                continue
            table.append([len(pieces), len(parts), sum(p[6] for p in parts), len(ranges), len(readers), c])
            pieces += parts
            ranges += readers
        self.entries = table
        self.table = torch.tensor(table, dtype=torch.int64).reshape(-1, 6)
        self.nread_t = torch.tensor(pieces, dtype=torch.int64).reshape(-1, 7)
        self.readers_t = torch.tensor(pos + [x for r in ranges for x in r], dtype=torch.int64)
        self.queries = nq

    def attend(self, fn: Any, layer: int, q: torch.Tensor, out: torch.Tensor, threads: int) -> None:
        """Every query's attention over its keys into out [Q, Hkv, g, d] (contiguous); q [Q, Hkv,
        g, d], queries strided, each query's heads contiguous."""
        bsz, hkv, g, d = q.shape
        assert bsz == self.queries, f"the table was made for {self.queries} queries, not {bsz}"
        if not self.entries:
            out.zero_()
            return
        rc = fn(
            q.data_ptr(),
            q.stride(0),
            out.data_ptr(),
            bsz,
            hkv,
            g,
            d,
            self.table.data_ptr(),
            self.nread_t.data_ptr(),
            self.readers_t.data_ptr(),
            len(self.entries),
            layer,
            threads,
            CHUNK,
        )
        if rc != 0:
            raise MemoryError("the attention kernel could not allocate its scratch")
