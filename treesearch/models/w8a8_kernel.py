"""A prototype w8a8 product: y = x (W s)^T (+ b) (+ other) with int8 weights W [N, K] (a float32
scale s per output channel) and float32 activations x [rows, K] rounded to int8 a block of 32 at a
time, the products summed by integer dot-product instructions (issue 42: the float32-activation int8
kernel, `treesearch.models.int8_kernel`, is arithmetic bound from ~16 rows).

The maths, per row r and output channel n, with K padded with zeros to Kp = 32 ceil(K / 32):

    s_x[r, b] = max_{k in block b} |x[r, k]| / 127          (float32; a block of zeros: 0)
    q[r, k]   = round_half_even(x[r, k] / s_x[r, b])         (int8, clamped to +-127; 0 where s_x = 0)
    d[r, n, b] = sum_{k in block b} q[r, k] w[n, k]          (exact, int32)
    acc = 0;  for b = 0, 1, ...:  acc = acc + s_x[r, b] * float(d[r, n, b])   (mul, then add)
    y[r, n] = ((acc * s[n]) + bias[n]) + other[r, n]          (each operation rounded once)

`float(d)` is exact (|d| <= 32 * 127 * 127 < 2^24) and no operation is fused (the C is compiled
with -ffp-contract=off), so the torch path (`_torch_linear`) computes the same bits as the C. A
row is quantized alone and its blocks summed in one order, whatever the tile, batch or thread
count: a row's result is the same bits in any batch.

Weight layout (`layout`): blocks of 16 output channels, 4 consecutive k per channel, biased to
unsigned: [ceil(N/16), Kp/4, 16, 4] uint8 = w + 128 (channels past N and k past K: w = 0). One
64-byte row of it is one AVX-512 vector of 16 channels x 4 k (two AVX2 vectors of 8 channels).

Builds (chosen from /proc/cpuinfo, like `int8_kernel.variant`):
- "vnni" (AVX-512 F/BW/VL + VNNI): `vpdpbusd` multiplies the unsigned weights by the signed
  activations, 4 products per int32 lane; each block's sum starts at -128 sum_k q[r, k] (the bias
  taken back; computed once per row and block when quantizing).
- "avx2" (+FMA, no VNNI): the weights unbiased (xor 0x80), `vpmaddubsw` of |w| (unsigned) with q
  carrying w's sign (`vpsignb`; pairs at most 2 * 127 * 127, never saturating int16), then
  `vpmaddwd` with ones to int32.
Where neither builds (or `TREESEARCH_INT8_KERNEL=0`), `linear` computes the same through torch.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from treesearch.models.int8_kernel import cpu_flags
from treesearch.models.paths import cache_dir

QB = 32  # activations per scale (and weights per block of the dot products)
BLOCK = 16  # output channels per weight block

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QB 32 /* activations per scale */
#define BL 16 /* output channels per weight block; a block's 4 k of 16 channels: 64 bytes */
#define PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#ifndef TS_PF
#define TS_PF 4 /* k blocks (of 32) ahead that each weight stream is prefetched */
#endif

#if defined(TS_VNNI)
#define W 16
typedef __m512 vf;
typedef __m512i vi;
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VST(p, v) _mm512_storeu_ps(p, v)
#define VSET1(a) _mm512_set1_ps(a)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VCVT(a) _mm512_cvtepi32_ps(a)
#define ISET1(a) _mm512_set1_epi32(a)
#define IINIT(c) _mm512_set1_epi32(-(c)) /* the weights' bias of 128 taken back */
#define WVARS(V) vi wv[V]
#define WLOAD(j, p) wv[j] = _mm512_loadu_si512((const void *)(p))
#define DOT(a, j, xb) a = _mm512_dpbusd_epi32(a, wv[j], xb)
#else
#define W 8
typedef __m256 vf;
typedef __m256i vi;
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VST(p, v) _mm256_storeu_ps(p, v)
#define VSET1(a) _mm256_set1_ps(a)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VCVT(a) _mm256_cvtepi32_ps(a)
#define ISET1(a) _mm256_set1_epi32(a)
#define IINIT(c) _mm256_setzero_si256()
#define WVARS(V) vi ws[V], aw[V]; const vi k80 = _mm256_set1_epi8((char)0x80), one = _mm256_set1_epi16(1)
#define WLOAD(j, p) (ws[j] = _mm256_xor_si256(_mm256_loadu_si256((const vi *)(p)), k80), \
                     aw[j] = _mm256_abs_epi8(ws[j]))
#define DOT(a, j, xb) a = _mm256_add_epi32(a, _mm256_madd_epi16(                                     \
                              _mm256_maddubs_epi16(aw[j], _mm256_sign_epi8(xb, ws[j])), one))
#endif

/* ---- Activations: one row at a time, each block of 32 alone ---------------------------------- */

/* x [K] -> q [Kp] int8, sx [nb] (max |x| / 127 per block), cx [nb] (128 times the block's q sum). */
static void quant_row(const float *x, int64_t K, int8_t *q, float *sx, int32_t *cx) {
    int64_t nb = (K + QB - 1) / QB;
    for (int64_t b = 0; b < nb; b++) {
        float buf[QB];
        const float *p = x + b * QB;
        if (K - b * QB < QB) { /* the last block, padded with zeros */
            memset(buf, 0, sizeof buf);
            memcpy(buf, p, (size_t)(K - b * QB) * 4);
            p = buf;
        }
#if defined(TS_VNNI)
        __m512 a[2] = {_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16)};
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a[0]), _mm512_abs_ps(a[1])));
        float s = amax / 127.0f;
        sx[b] = s;
        __m512i sum = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            __m512i v = _mm512_setzero_si512();
            if (s > 0) {
                v = _mm512_cvtps_epi32(_mm512_div_ps(a[h], _mm512_set1_ps(s))); /* nearest even */
                v = _mm512_max_epi32(_mm512_min_epi32(v, ISET1(127)), ISET1(-127));
            }
            _mm_storeu_si128((__m128i *)(q + b * QB + 16 * h), _mm512_cvtepi32_epi8(v));
            sum = _mm512_add_epi32(sum, v);
        }
        cx[b] = 128 * _mm512_reduce_add_epi32(sum);
#else
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 a[4], m = _mm256_setzero_ps();
        for (int h = 0; h < 4; h++) {
            a[h] = _mm256_loadu_ps(p + 8 * h);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, a[h]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        float s = _mm_cvtss_f32(m4) / 127.0f;
        sx[b] = s;
        cx[b] = 0; /* the AVX2 product takes signed weights: no bias to take back */
        vi v[4];
        for (int h = 0; h < 4; h++) {
            v[h] = _mm256_setzero_si256();
            if (s > 0) {
                v[h] = _mm256_cvtps_epi32(_mm256_div_ps(a[h], _mm256_set1_ps(s)));
                v[h] = _mm256_max_epi32(_mm256_min_epi32(v[h], ISET1(127)), ISET1(-127));
            }
        }
        vi p16 = _mm256_packs_epi32(v[0], v[1]), p23 = _mm256_packs_epi32(v[2], v[3]);
        vi order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* the packs' lanes back in k order */
        vi p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16, p23), order);
        _mm256_storeu_si256((vi *)(q + b * QB), p8);
#endif
    }
}

/* ---- The product ------------------------------------------------------------------------------ */

/* Vector v's (W channels) first weight byte: block v W / 16, lane offset (v W % 16) 4 bytes. */
static inline const uint8_t *vbase(const uint8_t *w, int64_t nb, int64_t v) {
    int64_t n = v * W;
    return w + (n / BL) * nb * QB * BL + (n % BL) * 4;
}

/* y[n..] = ((acc * s) + b) + o for the channels n, n+1, ... < N of one vector. */
static void put(vf acc, float *y, const float *o, const float *s, const float *b, int64_t n, int64_t N) {
    if (n + W <= N) {
        acc = VMUL(acc, VLOAD(s + n));
        if (b) acc = VADD(acc, VLOAD(b + n));
        if (o) acc = VADD(acc, VLOAD(o + n));
        VST(y + n, acc);
        return;
    }
    float t[W];
    VST(t, acc);
    for (int64_t j = 0; n + j < N; j++) {
        float a = t[j] * s[n + j];
        if (b) a = a + b[n + j];
        if (o) a = a + o[n + j];
        y[n + j] = a;
    }
}

/* A row's quantized operands: q (Kp bytes), sx and cx (nb each). */
typedef struct {
    const int8_t *q;
    const float *sx;
    const int32_t *cx;
} qrow;

/* R rows x V vectors from vector v0. Per k block: R V int32 sums of 8 dot steps (4 k each), then
   acc = acc + s_x * float(sum). */
#define WTILE(NAME, R, V)                                                                         \
static void NAME(const qrow *xr, float *const *yr, const float *const *orow,                      \
                            const uint8_t *w, int64_t nb, int64_t v0, const float *s,             \
                            const float *b, int64_t N) {                                          \
    vf acc[R][V];                                                                                 \
    const uint8_t *wp[V];                                                                         \
    for (int j = 0; j < V; j++) wp[j] = vbase(w, nb, v0 + j);                                     \
    for (int i = 0; i < R; i++)                                                                   \
        for (int j = 0; j < V; j++) acc[i][j] = VZERO();                                          \
    for (int64_t kb = 0; kb < nb; kb++) {                                                         \
        vi ia[R][V];                                                                              \
        WVARS(V);                                                                                 \
        for (int i = 0; i < R; i++) {                                                             \
            vi c = IINIT(xr[i].cx[kb]);                                                           \
            for (int j = 0; j < V; j++) ia[i][j] = c;                                             \
        }                                                                                         \
        for (int g = 0; g < QB / 4; g++) {                                                        \
            const int64_t off = (kb * (QB / 4) + g) * BL * 4;                                     \
            for (int j = 0; j < V; j++) PREFETCH(wp[j] + off + TS_PF * QB * BL);                  \
            for (int j = 0; j < V; j++) WLOAD(j, wp[j] + off);                                    \
            for (int i = 0; i < R; i++) {                                                         \
                int32_t x4;                                                                       \
                memcpy(&x4, xr[i].q + kb * QB + 4 * g, 4);                                        \
                vi xb = ISET1(x4);                                                                \
                for (int j = 0; j < V; j++) DOT(ia[i][j], j, xb);                                 \
            }                                                                                     \
        }                                                                                         \
        for (int i = 0; i < R; i++) {                                                             \
            vf sc = VSET1(xr[i].sx[kb]);                                                          \
            for (int j = 0; j < V; j++) acc[i][j] = VADD(acc[i][j], VMUL(VCVT(ia[i][j]), sc));   \
        }                                                                                         \
    }                                                                                             \
    for (int i = 0; i < R; i++)                                                                   \
        if (yr[i])                                                                                \
            for (int j = 0; j < V; j++) put(acc[i][j], yr[i], orow[i], s, b, (v0 + j) * W, N);   \
}

typedef void (*wtile_fn)(const qrow *, float *const *, const float *const *, const uint8_t *, int64_t,
                         int64_t, const float *, const float *, int64_t);
#if defined(TS_VNNI)
#ifndef R_WIDE
#define R_WIDE 6
#define V_WIDE 2
#endif
#define R_MID 4
#define V_MID 4
#define V_ONE 8
WTILE(wide1, R_WIDE, 1) WTILE(wide2, R_WIDE, 2)
#if V_WIDE > 2
WTILE(wide3, R_WIDE, 3)
#endif
#if V_WIDE > 3
WTILE(wide4, R_WIDE, 4)
#endif
WTILE(mid1, 4, 1) WTILE(mid2, 4, 2) WTILE(mid3, 4, 3) WTILE(mid4, 4, 4)
WTILE(one1, 1, 1) WTILE(one2, 1, 2) WTILE(one3, 1, 3) WTILE(one4, 1, 4)
WTILE(one5, 1, 5) WTILE(one6, 1, 6) WTILE(one7, 1, 7) WTILE(one8, 1, 8)
static const wtile_fn wide_t[] = {0, wide1, wide2,
#if V_WIDE > 2
                                  wide3,
#endif
#if V_WIDE > 3
                                  wide4,
#endif
};
static const wtile_fn mid_t[] = {0, mid1, mid2, mid3, mid4};
static const wtile_fn one_t[] = {0, one1, one2, one3, one4, one5, one6, one7, one8};
#else
#ifndef R_WIDE
#define R_WIDE 6
#define V_WIDE 1
#endif
#define R_MID 4
#define V_MID 2
#define V_ONE 4
WTILE(wide1, R_WIDE, 1) WTILE(wide2, R_WIDE, 2)
#if V_WIDE > 2
WTILE(wide3, R_WIDE, 3)
#endif
WTILE(mid1, 4, 1) WTILE(mid2, 4, 2)
WTILE(one1, 1, 1) WTILE(one2, 1, 2) WTILE(one3, 1, 3) WTILE(one4, 1, 4)
static const wtile_fn wide_t[] = {0, wide1, wide2,
#if V_WIDE > 2
                                  wide3,
#endif
};
static const wtile_fn mid_t[] = {0, mid1, mid2};
static const wtile_fn one_t[] = {0, one1, one2, one3, one4};
#endif

/* Rows r0 .. r0+m-1 (m <= R) through an R-row tile: its rows past m repeat the last and write nothing. */
static void wgroup(int R, wtile_fn fn, const qrow *rows, const float *o, int64_t ldo, float *y, int64_t ldy,
                   int64_t r0, int64_t m, const uint8_t *w, int64_t nb, int64_t v0, const float *s,
                   const float *b, int64_t N) {
    qrow xr[16];
    const float *orow[16];
    float *yr[16];
    for (int i = 0; i < R; i++) {
        int64_t r = r0 + (i < m ? i : m - 1);
        xr[i] = rows[r];
        orow[i] = o ? o + r * ldo : 0;
        yr[i] = i < m ? y + r * ldy : 0;
    }
    fn(xr, yr, orow, w, nb, v0, s, b, N);
}

/* Rows [0, rows) of vectors [va, vb): one row by 1 x V_ONE tiles, up to R_MID rows by R_MID x V_MID,
   more by R_WIDE x V_WIDE tiles for every row of a vector chunk, the last rows by narrower tiles. */
static void wrange(const qrow *xs, int64_t rows, const uint8_t *w, int64_t nb, const float *s,
                   const float *b, const float *o, int64_t ldo, float *y, int64_t ldy, int64_t N,
                   int64_t va, int64_t vb) {
    if (rows <= R_MID) {
        int64_t C = rows == 1 ? V_ONE : V_MID;
        for (int64_t v = va; v < vb; v += C) {
            int64_t V = vb - v < C ? vb - v : C;
            if (rows == 1) wgroup(1, one_t[V], xs, o, ldo, y, ldy, 0, 1, w, nb, v, s, b, N);
            else wgroup(R_MID, mid_t[V], xs, o, ldo, y, ldy, 0, rows, w, nb, v, s, b, N);
        }
        return;
    }
    for (int64_t v = va; v < vb; v += V_WIDE) {
        int64_t V = vb - v < V_WIDE ? vb - v : V_WIDE, r = 0;
        for (; r + R_WIDE <= rows; r += R_WIDE)
            wgroup(R_WIDE, wide_t[V], xs, o, ldo, y, ldy, r, R_WIDE, w, nb, v, s, b, N);
        int64_t m = rows - r;
        if (m > R_MID) wgroup(R_WIDE, wide_t[V], xs, o, ldo, y, ldy, r, m, w, nb, v, s, b, N);
        else if (m > 1) wgroup(R_MID, mid_t[V], xs, o, ldo, y, ldy, r, m, w, nb, v, s, b, N);
        else if (m == 1) wgroup(1, one_t[V], xs, o, ldo, y, ldy, r, 1, w, nb, v, s, b, N);
    }
}

/* x [rows, K] (row stride ldx) -> q [rows, Kp], sx [rows, nb], cx [rows, nb]. */
void ts_w8a8_quantize(const float *x, int64_t ldx, int64_t rows, int64_t K, int8_t *q, float *sx,
                      int32_t *cx, int64_t threads) {
    int64_t nb = (K + QB - 1) / QB;
#ifndef _OPENMP
    threads = 1;
#endif
#pragma omp parallel for num_threads((int)threads) schedule(static) if (threads > 1 && rows > 1)
    for (int64_t r = 0; r < rows; r++) quant_row(x + r * ldx, K, q + r * nb * QB, sx + r * nb, cx + r * nb);
}

/* A projection: up to 3 weights side by side (q, k, v; gate, up), each laid out as above with its
   channel scale and bias (or NULL), all over the same K inputs. */
typedef struct {
    int64_t nparts, K;
    const uint8_t *w[3];
    const float *scale[3];
    const float *bias[3];
    int64_t n[3];
} w8a8_proj;

/* y [rows, sum n_i] (row stride ldy) = [x (W_i s_i)^T + b_i]_i (+ other), x's rows quantized once
   into q, sx, cx (scratch: [rows, Kp], [rows, nb], [rows, nb]). Threads quantize whole rows, then
   share out every part's blocks of 16 channels in contiguous ranges. */
void ts_w8a8_proj(const w8a8_proj *p, const float *x, int64_t ldx, int64_t rows, const float *other,
                  int64_t ldo, float *y, int64_t ldy, int64_t threads, int8_t *q, float *sx, int32_t *cx) {
    int64_t K = p->K, nb = (K + QB - 1) / QB, per = BL / W;
    int64_t first[4], col[4];
    first[0] = col[0] = 0;
    for (int64_t i = 0; i < p->nparts; i++) {
        first[i + 1] = first[i] + (p->n[i] + BL - 1) / BL * per;
        col[i + 1] = col[i] + p->n[i];
    }
    int64_t blocks = first[p->nparts] / per;
    qrow *xs = malloc(sizeof(qrow) * (size_t)(rows ? rows : 1));
    for (int64_t r = 0; r < rows; r++) xs[r] = (qrow){q + r * nb * QB, sx + r * nb, cx + r * nb};
#ifndef _OPENMP
    threads = 1;
#endif
    if (threads > blocks) threads = blocks;
    if (threads < 1) threads = 1;
#pragma omp parallel num_threads((int)threads) if (threads > 1)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            quant_row(x + r * ldx, K, q + r * nb * QB, sx + r * nb, cx + r * nb);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < threads; t++) {
            int64_t a = blocks * t / threads * per, e = blocks * (t + 1) / threads * per;
            for (int64_t i = 0; i < p->nparts; i++) {
                int64_t lo = a > first[i] ? a : first[i], hi = e < first[i + 1] ? e : first[i + 1];
                int64_t last = first[i] + (p->n[i] + W - 1) / W; /* vectors wholly past n_i: none */
                if (hi > last) hi = last;
                if (lo < hi)
                    wrange(xs, rows, p->w[i], nb, p->scale[i], p->bias[i], other ? other + col[i] : 0, ldo,
                           y + col[i], ldy, p->n[i], lo - first[i], hi - first[i]);
            }
        }
    }
    free(xs);
}
"""

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_state: dict[str, Any] = {}


def variant(flags: set[str] | None = None) -> str | None:
    """Which build fits this CPU: "vnni" (AVX-512 F/BW/VL with VNNI), "avx2" (with FMA), or None."""
    flags = cpu_flags() if flags is None else flags
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "fma"} <= flags:
        return "vnni"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return None


def _cflags(which: str, defines: tuple[str, ...] = ()) -> list[str]:
    base = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-mavx2", "-mfma", *defines]
    if which == "vnni":
        return [*base, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-DTS_VNNI"]
    return base


def _compile(cc: str, flags: list[str]) -> ctypes.CDLL:
    """SOURCE compiled with flags (cached by source, flags and compiler) and loaded."""
    key = hashlib.sha256((SOURCE + " ".join(flags) + cc).encode()).hexdigest()[:16]
    folder = cache_dir() / "kernels"
    lib = folder / f"w8a8-{key}.so"
    if not lib.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            src, out = Path(tmp) / "w8a8.c", Path(tmp) / "w8a8.so"
            src.write_text(SOURCE)
            done = subprocess.run(
                [cc, *flags, "-o", str(out), str(src)], capture_output=True, text=True, timeout=120
            )
            if done.returncode != 0:
                raise OSError(f"{cc} failed: {done.stderr.strip()[-300:]}")
            os.replace(out, lib)
    dll = ctypes.CDLL(str(lib))
    dll.ts_w8a8_proj.argtypes = [_PTR, _PTR, _I64, _I64, _PTR, _I64, _PTR, _I64, _I64, _PTR, _PTR, _PTR]
    dll.ts_w8a8_proj.restype = None
    dll.ts_w8a8_quantize.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR, _I64]
    dll.ts_w8a8_quantize.restype = None
    return dll


def build(which: str, cc: str | None = None, defines: tuple[str, ...] = ()) -> tuple[Any, bool]:
    """The library built for variant which ("vnni" or "avx2") by cc (default: $CC, cc or gcc), with
    extra -D defines (tile shapes, for measuring): (the library, whether it has OpenMP). Raises
    OSError where it does not build."""
    cc = cc or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise OSError("no C compiler found (set CC, or install gcc)")
    try:
        return _compile(cc, [*_cflags(which, defines), "-fopenmp"]), True
    except OSError:
        return _compile(cc, _cflags(which, defines)), False


def load() -> Any:
    """This CPU's build, or None (see `reason()`); built once per process, its absence warned once."""
    if "dll" not in _state:
        which = variant()
        if os.environ.get("TREESEARCH_INT8_KERNEL", "1") == "0":
            _state["dll"], _state["reason"] = None, "off: TREESEARCH_INT8_KERNEL=0"
        elif which is None:
            _state["dll"], _state["reason"] = None, "not available: this CPU has neither AVX2+FMA nor AVX-512"
        else:
            try:
                dll, omp = build(which)
                _state["dll"] = dll
                _state["reason"] = f"compiled ({which}{'' if omp else ', without OpenMP: one thread'})"
            except (OSError, subprocess.SubprocessError) as e:
                _state["dll"], _state["reason"] = None, f"not available: {e}"
        if _state["dll"] is None:
            warnings.warn(
                f"the w8a8 kernel is {_state['reason']}; w8a8 layers multiply through torch (slower)",
                RuntimeWarning,
                stacklevel=2,
            )
    return _state["dll"]


def reason() -> str:
    """Why the kernel is or is not used in this process."""
    load()
    return str(_state["reason"])


def padded(k: int) -> int:
    """K rounded up to whole blocks of QB."""
    return -(-k // QB) * QB


def layout(q: torch.Tensor) -> torch.Tensor:
    """An int8 weight [N, K] in the kernel's layout: uint8 [ceil(N/16), Kp/4, 16, 4] = w + 128,
    channel n's k-th weight at [n // 16, k // 4, n % 16, k % 4]; channels past N and k past K hold
    128 (w = 0)."""
    n, k = q.shape
    nb, kp = -(-n // BLOCK) * BLOCK, padded(k)
    full = torch.zeros(nb, kp, dtype=torch.int16)
    full[:n, :k] = q.to(torch.int16)
    biased = (full + 128).to(torch.uint8)
    return biased.view(nb // BLOCK, BLOCK, kp // 4, 4).transpose(1, 2).contiguous()


def unlayout(wl: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The plain int8 weight [n, k] of a laid-out one (`layout`): a new tensor."""
    plain = wl.transpose(1, 2).reshape(wl.shape[0] * BLOCK, wl.shape[1] * 4)[:n, :k]
    return (plain.to(torch.int16) - 128).to(torch.int8).contiguous()


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, K] float32 -> (q int8 [rows, Kp], s_x float32 [rows, Kp/32]): the module docstring's
    rounding, through torch (the C computes the same bits)."""
    rows, k = x.shape
    nb = padded(k) // QB
    xp = torch.zeros(rows, nb * QB)
    xp[:, :k] = x
    blocks = xp.view(rows, nb, QB)
    sx = blocks.abs().amax(dim=2) / 127.0
    safe = torch.where(sx > 0, sx, torch.ones_like(sx))
    q = torch.round(blocks / safe[:, :, None]).clamp_(-127, 127)
    q = torch.where(sx[:, :, None] > 0, q, torch.zeros_like(q))
    return q.to(torch.int8).view(rows, nb * QB), sx


def quantize_c(x: torch.Tensor, dll: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize` through the C (dll: `load()` or `build()`'s library)."""
    x = x.contiguous().float()
    rows, k = x.shape
    q, sx, cx = _scratch(rows, k)
    if rows:
        ptrs = (q.data_ptr(), sx.data_ptr(), cx.data_ptr())
        dll.ts_w8a8_quantize(x.data_ptr(), k, rows, k, *ptrs, torch.get_num_threads())
    return q, sx


def _scratch(rows: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The C's buffers for rows rounded: q int8 [rows, Kp], s_x [rows, nb], 128 sum(q) [rows, nb]."""
    nb = padded(k) // QB
    return (
        torch.empty(rows, nb * QB, dtype=torch.int8),
        torch.empty(rows, nb),
        torch.empty(rows, nb, dtype=torch.int32),
    )


class Proj(ctypes.Structure):
    """C's `w8a8_proj`: up to three laid-out weights side by side over the same inputs, each with
    its channel scale and bias (0: none). `proj()` keeps the tensors it points at (`keep`)."""

    _fields_ = [
        ("nparts", _I64),
        ("K", _I64),
        ("w", _PTR * 3),
        ("scale", _PTR * 3),
        ("bias", _PTR * 3),
        ("n", _I64 * 3),
    ]


def proj(parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]], k: int) -> Proj:
    """The `Proj` of up to three (weight laid out by `layout`, scale [n], bias [n] or None) parts
    over the same k inputs."""
    if not 1 <= len(parts) <= 3:
        raise ValueError("a projection is 1 to 3 weights over the same number of inputs")
    p = Proj(len(parts), k)
    for i, (w, scale, bias) in enumerate(parts):
        n = scale.shape[0]
        if w.dtype != torch.uint8 or w.shape != (-(-n // BLOCK), padded(k) // 4, BLOCK, 4):
            raise ValueError(
                f"a w8a8 weight of {n} channels over {k} inputs is laid out [{-(-n // BLOCK)}, "
                f"{padded(k) // 4}, 16, 4] uint8, not {tuple(w.shape)} {w.dtype}"
            )
        for t in (w, scale, bias):
            if t is not None and not t.is_contiguous():
                raise ValueError("a projection's weights, scales and biases must be contiguous")
        p.w[i], p.scale[i], p.n[i] = w.data_ptr(), scale.data_ptr(), n
        p.bias[i] = None if bias is None else bias.data_ptr()
    p.keep = parts  # the addresses above stay valid as long as this Proj lives
    return p


def project(x: torch.Tensor, p: Proj, other: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, K] -> [the module docstring's y of part i]_i (+ other) [rows, sum n_i], x rounded
    once for all parts; through torch where nothing builds (the same bits)."""
    rows, k = x.shape
    if k != p.K:
        raise ValueError(f"this projection takes {p.K} inputs, not {k}")
    if x.stride(1) != 1 or x.dtype != torch.float32:
        x = x.contiguous().float()
    if other is not None and (other.stride(1) != 1 or other.dtype != torch.float32):
        other = other.contiguous().float()
    dll = load()
    if dll is None:
        ys = [_torch_linear(x, w, s, b, None) for w, s, b in p.keep]
        y = torch.cat(ys, dim=-1) if len(ys) > 1 else ys[0]
        return y if other is None else y + other
    y = torch.empty(rows, sum(p.n[i] for i in range(p.nparts)))
    if rows == 0:
        return y
    q, sx, cx = _scratch(rows, k)
    o, ldo = (None, 0) if other is None else (other.data_ptr(), other.stride(0))
    dll.ts_w8a8_proj(
        ctypes.addressof(p), x.data_ptr(), x.stride(0), rows, o, ldo, y.data_ptr(), y.stride(0),
        torch.get_num_threads(), q.data_ptr(), sx.data_ptr(), cx.data_ptr(),
    )  # fmt: skip
    return y


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    other: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [rows, K] float32, weight laid out by `layout` ([ceil(N/16), Kp/4, 16, 4] uint8), scale [N]
    -> the module docstring's y [rows, N] (`project` of one part)."""
    return project(x, proj([(weight, scale, bias)], x.shape[1]), other)


def _torch_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    other: torch.Tensor | None,
) -> torch.Tensor:
    """The C's result through torch, bit for bit: each block's integer sums exactly (float64 holds
    them), then acc = acc + s_x * float(sum) block by block, times the scale, plus bias, plus other."""
    rows, k = x.shape
    n = scale.shape[0]
    q, sx = quantize(x.float())
    w = unlayout(weight, n, padded(k)).double()  # [n, Kp]
    acc = torch.zeros(rows, n)
    for b in range(sx.shape[1]):
        d = (q[:, b * QB : (b + 1) * QB].double() @ w[:, b * QB : (b + 1) * QB].T).float()
        acc = acc + sx[:, b : b + 1] * d
    y = acc * scale
    if bias is not None:
        y = y + bias
    return y if other is None else y + other
