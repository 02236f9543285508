"""The decode step's whole attention in one compiled call per layer, on every thread the step has.

Why: read with torch ops, a step's attention is a few small products per cached run and layer,
each paying dispatch and (on several threads) an OpenMP fork/join far above its arithmetic, so the
decoder ran them on one thread (`SERIAL_ATTENTION`) and the step's K/V reads serialised. This
kernel reads every run a row attends over (the cached prefix runs, shared or not, the rows' own
runs and the step's buffer) in place, in one call per layer, split flash-decoding style into work
units of (run, kv head, chunk of `CHUNK` tokens): each unit computes, for every row that reads the
run, its g query heads' scores over the chunk (the K/V read once for all those rows), their
maximum m, sum l = sum_i e^{s_i - m} and acc = sum_i e^{s_i - m} v_i. The units are shared out over
the threads; then each (row, kv head) merges its units in table order, exactly (Hydragen):
    out = sum_u e^{m_u - M} acc_u / sum_u e^{m_u - M} l_u,  M = max_u m_u.
The units' split depends only on the runs' lengths, never on the thread count, so the result is
the same at any thread count; a row's scores and sums depend only on its own queries and runs.

It is C, built and cached like `treesearch.engine.runs_kernel` (same compiler, flags and switch
`TREESEARCH_RUNS_KERNEL=0`); where it cannot be built `load()` returns None and the decoder takes
the torch-op attention. tests/engine/test_attend_kernel.py checks it against float64 softmax.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from treesearch.engine import runs_kernel
from treesearch.models.simd import VEC8

CHUNK = 128  # tokens per work unit: 1,000 cached tokens over 3 kv heads make 24 units

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

/* acc[j] = sum_i p[j][i] v_i over tokens i in order, for M queries, 32 of the d values at a time
   held in registers (the order `axpy` adds in: the same bits). d: a multiple of 32. */
#define VSUM(M)                                                                                     \
static void vsum_##M(const float *p, int64_t ldn, const float *v, int64_t tok, int64_t n, int64_t d, \
                     float *acc) {                                                                  \
    for (int64_t x = 0; x < d; x += 32) {                                                           \
        v8 a[M][4];                                                                                 \
        for (int j = 0; j < M; j++)                                                                 \
            for (int c = 0; c < 4; c++) a[j][c] = splat(0.0f);                                      \
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

/* One work unit: run e's kv head h over tokens [t0, t0 + n), for the nq queries at qp[]:
   scores into s (nq x n), then per query its m, l and acc (d floats) at part (nq (d + 2) floats:
   acc [nq][d], m [nq], l [nq]). */
static void unit(const float *const *qp, int64_t nq, const float *k, const float *v, int64_t tok,
                 int64_t n, int64_t d, float *s, float *part) {
    float *acc = part, *mm = part + nq * d, *ll = mm + nq;
    if (d % 8 == 0) {
        for (int64_t j = 0; j < nq; j += 4) {
            int64_t m = nq - j < 4 ? nq - j : 4;
            const float *pv = j ? 0 : v; /* the first pass fetches ahead */
            if (m == 4) scores_4_2(qp + j, k, pv, tok, n, d, s + j * n, n);
            else if (m == 3) scores_3_4(qp + j, k, pv, tok, n, d, s + j * n, n);
            else if (m == 2) scores_2_4(qp + j, k, pv, tok, n, d, s + j * n, n);
            else scores_1_4(qp + j, k, pv, tok, n, d, s + j * n, n);
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            const float *ki = k + i * tok;
            for (int64_t j = 0; j < nq; j++) s[j * n + i] = dot(qp[j], ki, d);
        }
    }
    for (int64_t j = 0; j < nq; j++) {
        float *sj = s + j * n, m = sj[0];
        int64_t i = 1;
        if (n >= 16) { /* eight lanes at a time: a maximum is exact in any order */
            v8 m8 = ld(sj);
            for (i = 8; i + 8 <= n; i += 8) {
                v8 x = ld(sj + i);
                m8 = sel(x > m8, x, m8);
            }
            for (int l = 0; l < 8; l++) m = m8[l] > m ? m8[l] : m;
        }
        for (; i < n; i++) m = sj[i] > m ? sj[i] : m;
        i = 0;
        v8 sum8 = splat(0.0f);
        for (; i + 8 <= n; i += 8) {
            v8 p = exp8(ld(sj + i) - splat(m));
            st(sj + i, p);
            sum8 += p;
        }
        float sum = hsum(sum8);
        if (i < n) {
            float tail[8] = {0};
            for (int64_t x = i; x < n; x++) tail[x - i] = sj[x] - m;
            for (int64_t x = n - i; x < 8; x++) tail[x] = -INFINITY;
            v8 p = exp8(ld(tail));
            for (int64_t x = i; x < n; x++) { sj[x] = p[x - i]; sum += p[x - i]; }
        }
        mm[j] = m;
        ll[j] = sum;
    }
    if (d % 32 == 0) {
        for (int64_t j = 0; j < nq; j += 3) {
            int64_t m = nq - j < 3 ? nq - j : 3;
            if (m == 3) vsum_3(s + j * n, n, v, tok, n, d, acc + j * d);
            else if (m == 2) vsum_2(s + j * n, n, v, tok, n, d, acc + j * d);
            else vsum_1(s + j * n, n, v, tok, n, d, acc + j * d);
        }
        return;
    }
    memset(acc, 0, sizeof(float) * (size_t)(nq * d));
    for (int64_t i = 0; i < n; i++) {
        const float *vi = v + i * tok;
        for (int64_t j = 0; j < nq; j++) axpy(acc + j * d, s[j * n + i], vi, d);
    }
}

/* runs: per run 8 int64 (address of K at layer 0, head 0, token 0; of V; K's layer stride; V's
   layer stride; head stride; token stride; length; index of its first reader in readers[]), with
   nread[e] readers (rows) each. q: [rows, hkv, g, d], row stride q_row; out [rows, hkv, g, d]
   contiguous. Strides in floats. Returns 0, or -1 when out of memory. */
int ts_attend(const float *q, int64_t q_row, float *out, int64_t rows, int64_t hkv, int64_t g,
              int64_t d, const int64_t *runs, const int64_t *nread, const int64_t *readers,
              int64_t nruns, int64_t layer, int64_t threads, int64_t chunk) {
    int64_t *ubase = malloc(sizeof(int64_t) * (size_t)(3 * nruns + 2 * rows + 1));
    if (!ubase) return -1;
    int64_t *pbase = ubase + nruns, *nch = pbase + nruns, *rcount = nch + nruns, *rptr = rcount + rows;
    int64_t units = 0, parts = 0, most = 1;
    memset(rcount, 0, sizeof(int64_t) * (size_t)(2 * rows + 1));
    for (int64_t e = 0; e < nruns; e++) {
        int64_t len = runs[8 * e + 6];
        nch[e] = (len + chunk - 1) / chunk;
        ubase[e] = units;
        pbase[e] = parts;
        units += hkv * nch[e];
        parts += hkv * nch[e] * nread[e] * g * (d + 2);
        if (nread[e] > most) most = nread[e];
        for (int64_t r = 0; r < nread[e]; r++) rcount[readers[runs[8 * e + 7] + r]]++;
    }
    /* each row's (run, reader slot) pairs in run order: rptr is a CSR over rows */
    for (int64_t b = 0; b < rows; b++) rptr[b + 1] = rptr[b] + rcount[b];
    int64_t *pairs = malloc(sizeof(int64_t) * (size_t)(2 * rptr[rows] + rows + 1));
    float *part = malloc(sizeof(float) * (size_t)(parts > 0 ? parts : 1));
#ifndef _OPENMP
    threads = 1;
#endif
    if (threads < 1) threads = 1;
    /* scores, then the query pointers (2 floats each, 8-byte aligned: per is even) */
    int64_t per = (most * g * chunk + 1) / 2 * 2 + 2 * most * g;
    float *scratch = malloc(sizeof(float) * (size_t)(per * threads));
    if (!pairs || !part || !scratch) {
        free(ubase); free(pairs); free(part); free(scratch);
        return -1;
    }
    int64_t *fill = pairs + 2 * rptr[rows];
    for (int64_t b = 0; b < rows; b++) fill[b] = rptr[b];
    for (int64_t e = 0; e < nruns; e++)
        for (int64_t r = 0; r < nread[e]; r++) {
            int64_t b = readers[runs[8 * e + 7] + r], at = fill[b]++;
            pairs[2 * at] = e;
            pairs[2 * at + 1] = r;
        }
#pragma omp parallel num_threads((int)threads) if (threads > 1)
    {
#ifdef _OPENMP
        float *s = scratch + per * omp_get_thread_num();
#else
        float *s = scratch;
#endif
        const float **qp = (const float **)(s + (most * g * chunk + 1) / 2 * 2);
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < units; u++) {
            int64_t e = 0;
            while (e + 1 < nruns && ubase[e + 1] <= u) e++;
            const int64_t *r = runs + 8 * e;
            int64_t h = (u - ubase[e]) / nch[e], c = (u - ubase[e]) % nch[e];
            int64_t t0 = c * chunk, n = r[6] - t0 < chunk ? r[6] - t0 : chunk;
            int64_t nq = nread[e] * g;
            for (int64_t x = 0; x < nread[e]; x++)
                for (int64_t j = 0; j < g; j++)
                    qp[x * g + j] = q + readers[r[7] + x] * q_row + (h * g + j) * d;
            const float *k = (const float *)(intptr_t)r[0] + layer * r[2] + h * r[4] + t0 * r[5];
            const float *v = (const float *)(intptr_t)r[1] + layer * r[3] + h * r[4] + t0 * r[5];
            unit(qp, nq, k, v, r[5], n, d, s, part + pbase[e] + (u - ubase[e]) * nq * (d + 2));
        }
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < rows * hkv; bh++) {
            int64_t b = bh / hkv, h = bh % hkv;
            float *o = out + bh * g * d;
            for (int64_t j = 0; j < g; j++) {
                float big = -INFINITY, den = 0.0f;
                for (int64_t a = rptr[b]; a < rptr[b + 1]; a++) {
                    int64_t e = pairs[2 * a], x = pairs[2 * a + 1], nq = nread[e] * g;
                    for (int64_t c = 0; c < nch[e]; c++) {
                        const float *p = part + pbase[e] + (h * nch[e] + c) * nq * (d + 2);
                        float m = p[nq * d + x * g + j];
                        big = m > big ? m : big;
                    }
                }
                float *oj = o + j * d;
                memset(oj, 0, sizeof(float) * (size_t)d);
                for (int64_t a = rptr[b]; a < rptr[b + 1]; a++) {
                    int64_t e = pairs[2 * a], x = pairs[2 * a + 1], nq = nread[e] * g;
                    for (int64_t c = 0; c < nch[e]; c++) {
                        const float *p = part + pbase[e] + (h * nch[e] + c) * nq * (d + 2);
                        float w = expf(p[nq * d + x * g + j] - big);
                        den += w * p[nq * d + nq + x * g + j];
                        axpy(oj, w, p + (x * g + j) * d, d);
                    }
                }
                if (den > 0.0f) {
                    float inv = 1.0f / den;
                    for (int64_t y = 0; y < d; y++) oj[y] *= inv;
                }
            }
        }
    }
    free(ubase);
    free(pairs);
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
    """Every run the rows of one step read, as the kernel's table: one entry per run (a cached
    prefix run with its readers, or a row's stretch of the step's buffer), made once per step and
    read by every layer's call. The tensors it points into are kept alive here."""

    def __init__(self) -> None:
        self.entries: list[list[int]] = []
        self.nread: list[int] = []
        self.readers: list[int] = []
        self.keep: list[torch.Tensor] = []

    def add(self, k: torch.Tensor, v: torch.Tensor, length: int, readers: list[int]) -> None:
        """A run read by `readers`: k and v [L, Hkv, >= length, d] views with the same head and
        token strides (d contiguous)."""
        sk, sv = k.stride(), v.stride()
        self.entries.append(
            [k.data_ptr(), v.data_ptr(), sk[0], sv[0], sk[1], sk[2], length, len(self.readers)]
        )
        self.nread.append(len(readers))
        self.readers += readers
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

    def done(self) -> None:
        """Freeze the table into the tensors the kernel reads."""
        self.table = torch.tensor(self.entries, dtype=torch.int64).reshape(-1, 8)
        self.nread_t = torch.tensor(self.nread, dtype=torch.int64)
        self.readers_t = torch.tensor(self.readers or [0], dtype=torch.int64)

    def attend(self, fn: Any, layer: int, q: torch.Tensor, out: torch.Tensor, threads: int) -> None:
        """Every row's attention over its runs into out [B, Hkv, g, d] (contiguous); q [B, Hkv,
        g, d], rows strided, each row's heads contiguous."""
        bsz, hkv, g, d = q.shape
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
