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

CHUNK = 128  # tokens per work unit: 1,000 cached tokens over 3 kv heads make 24 units

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));

static inline v8 ld(const float *p) { return *(const v8u *)p; }
static inline void st(float *p, v8 x) { *(v8u *)p = x; }
static inline v8 splat(float a) { v8 r = {a, a, a, a, a, a, a, a}; return r; }
static inline v8 sel(v8i m, v8 a, v8 b) { return (v8)(((v8i)a & m) | ((v8i)b & ~m)); }
static inline float hsum(v8 a) {
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

/* e^x for 8 floats: x = n ln2 + r (n rounded, |r| <= ln2/2), e^r by its degree-6 Taylor
   polynomial (relative error below 2e-7), times 2^n through the exponent bits; below -87 gives 0. */
static inline v8 exp8(v8 x) {
    const v8 magic = splat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    v8 lo = splat(-87.0f), hi = splat(88.0f);
    v8i under = x < lo;
    x = sel(under, lo, x);
    x = sel(x > hi, hi, x);
    v8 t = x * splat(1.44269504088896341f) + magic;
    v8i n = (v8i)t - (v8i)magic;
    v8 fn = t - magic;
    v8 r = x - fn * splat(0.693359375f) - fn * splat(-2.12194440e-4f);
    v8 p = splat(1.0f / 720);
    p = p * r + splat(1.0f / 120);
    p = p * r + splat(1.0f / 24);
    p = p * r + splat(1.0f / 6);
    p = p * r + splat(0.5f);
    p = p * r + splat(1.0f);
    p = p * r + splat(1.0f);
    v8i bits = (n + 127) << 23;
    v8 y = p * (v8)bits;
    return sel(under, splat(0.0f), y);
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

/* One work unit: run e's kv head h over tokens [t0, t0 + n), for the nq queries at qp[]:
   scores into s (nq x n), then per query its m, l and acc (d floats) at part (nq (d + 2) floats:
   acc [nq][d], m [nq], l [nq]). */
static void unit(const float *const *qp, int64_t nq, const float *k, const float *v, int64_t tok,
                 int64_t n, int64_t d, float *s, float *part) {
    float *acc = part, *mm = part + nq * d, *ll = mm + nq;
    for (int64_t i = 0; i < n; i++) {
        const float *ki = k + i * tok;
        for (int64_t j = 0; j < nq; j++) s[j * n + i] = dot(qp[j], ki, d);
    }
    for (int64_t j = 0; j < nq; j++) {
        float *sj = s + j * n, m = sj[0];
        for (int64_t i = 1; i < n; i++) m = sj[i] > m ? sj[i] : m;
        int64_t i = 0;
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
