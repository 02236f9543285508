"""y = x (W s)^T (+ b) (+ other) for int8 weights W [N, K] with a float32 scale per output channel
s [N], float32 activations x [rows, K] -> float32 [rows, N]: the product of every int8 linear layer.

Why: a decode step reads every weight once, so its time is the weights' bytes over memory bandwidth;
int8 weights are a quarter of float32's. No ready torch op is fast at every batch size on both CPU
families (AVX2 EPYC, AVX-512 Xeon) with float32 activations (docs/guide/precision.md), so this is a
small C kernel compiled at first use (as `treesearch.kernels.runs_kernel` is): each weight byte is
widened to float32 in registers (AVX2 `cvtepi8_epi32` + `cvtepi32_ps`, 8 lanes, or AVX-512's 16
where the CPU has AVX-512F/BW/VL) and multiplied into FMA accumulators.

int8 weights are held in blocks of 16 output channels, k-major (`treesearch.models.int8_blocks`,
with that product's C): channels in the lanes, each (row, channel) dot product one lane's FMA chain
over k in order, then times the scale, plus the bias, plus other. float32 weights (`float_linear`)
keep their row-major layout and the tiles below (K in the lanes, summed across them at the end).

Batch invariance: a row's result never depends on the other rows of the call. Activations are not
quantized, and each (row, channel) dot product accumulates in the same lanes in the same order
whatever the number of rows, the tile it falls in, or the thread count (threads share out output
channels; each channel's dot products are whole in one thread).

Where no compiler works, or `TREESEARCH_INT8_KERNEL=0`, `linear()` dequantizes the weights in blocks
of channels and calls torch's `F.linear` (correct, slower, and not batch invariant: oneDNN may sum
a row differently at another batch size); `reason()` says which, once.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import string
import subprocess
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from treesearch.kernels.cbuild import compile_library, compiler
from treesearch.kernels.simd import VEC8
from treesearch.models.int8_blocks import BLOCK, BLOCKED, blocks
from treesearch.models.layer_kernel import LAYER, STEP_HEAD, type_layer_calls

_HEAD = (
    r"""
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
"""
    + VEC8
    + r"""

#if defined(TS_AVX512)
#define W 16
typedef __m512 vf;
#define VZERO() _mm512_setzero_ps()
#define VLOADX(p) _mm512_loadu_ps(p)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
static inline float hsum(vf v) {
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}
#else
#define W 8
typedef __m256 vf;
#define VZERO() _mm256_setzero_ps()
#define VLOADX(p) _mm256_loadu_ps(p)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
static inline float hsum(vf v) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}
#endif
#define VLOADW_f32(p) VLOADX(p)

/* The next tile's weight lines, fetched while this tile computes: the hardware prefetcher does not
   follow C channel rows K bytes apart well, and without this the one-row product ran at about half
   the machine's read bandwidth (a hint only: it changes no arithmetic; past the end it is a no-op). */
#define PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)

#define NB 16 /* channels per tile: its weights (NB K values) stay in cache while every row reads them */

/* A projection: up to TS_PARTS weights side by side (q, k, v; gate, up), each with its channel
   scale (or NULL: 1) and bias (or NULL), all over the same K inputs. */
#define TS_PARTS 3
typedef struct {
    int64_t nparts, K;
    const void *w[TS_PARTS];
    const float *scale[TS_PARTS];
    const float *bias[TS_PARTS];
    int64_t n[TS_PARTS];
} ts_proj;

/* h = silu(g) u = g / (1 + e^-g) u, eight at a time (`exp8`). */
static void silu_mul(const float *g, const float *u, float *h, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8 x = ld(g + i);
        st(h + i, x / (splat(1.0f) + exp8(-x)) * ld(u + i));
    }
    for (; i < n; i++) h[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* out = x / sqrt(mean(x^2) + eps) * w: an RMSNorm (the sum of squares in double). */
static void rms_norm(const float *x, int64_t K, const float *w, float eps, float *out) {
    double ss = 0;
    for (int64_t k = 0; k < K; k++) ss += (double)x[k] * x[k];
    float r = 1.0f / sqrtf((float)(ss / (double)K) + eps);
    for (int64_t k = 0; k < K; k++) out[k] = x[k] * r * w[k];
}
"""
)

# The float32 product over row-major weights (T f32, WT float; PF masks k so that the next tile's
# weights are prefetched once per 64-byte line).
_PRODUCT = string.Template(r"""
/* Every (row, channel) dot product is: W lanes accumulated by FMA over k < K - K % W in order,
   summed across lanes (hsum), then the tail k >= K - K % W added one by one; then times the
   channel's scale, plus its bias, plus other. The tiles below only change which dot products run
   side by side, never this order. */
static inline float finish_$T(float acc, const float *x, const $WT *w, int64_t k0, int64_t K,
                           const float *s, const float *bias, int64_t n, const float *other) {
    for (int64_t k = k0; k < K; k++) acc += x[k] * (float)w[k];
    float y = s ? acc * s[n] : acc;
    if (bias) y += bias[n];
    if (other) y += other[n];
    return y;
}


/* R rows x C channels at a time, R*C accumulators in registers. */
#define TILE_$T(NAME, R, C)                                                                            \
static void NAME(const float *x, int64_t ldx, const $WT *w, int64_t K, const float *scale,       \
                 const float *bias, const float *other, int64_t ldo, float *y, int64_t ldy,          \
                 int64_t r0, int64_t n0) {                                                          \
    vf acc[R][C];                                                                                   \
    for (int i = 0; i < R; i++)                                                                     \
        for (int j = 0; j < C; j++) acc[i][j] = VZERO();                                            \
    int64_t kv = K - K % W;                                                                         \
    for (int64_t k = 0; k < kv; k += W) {                                                           \
        if ((k & $PF) == 0)                                                                          \
            for (int j = 0; j < C; j++) PREFETCH(w + (n0 + C + j) * K + k);                         \
        vf wv[C];                                                                                   \
        for (int j = 0; j < C; j++) wv[j] = VLOADW_$T(w + (n0 + j) * K + k);                          \
        for (int i = 0; i < R; i++) {                                                               \
            vf xv = VLOADX(x + (r0 + i) * ldx + k);                                                 \
            for (int j = 0; j < C; j++) acc[i][j] = VFMA(xv, wv[j], acc[i][j]);                     \
        }                                                                                           \
    }                                                                                               \
    for (int i = 0; i < R; i++)                                                                     \
        for (int j = 0; j < C; j++) {                                                               \
            int64_t n = n0 + j, r = r0 + i;                                                         \
            y[r * ldy + n] = finish_$T(hsum(acc[i][j]), x + r * ldx, w + n * K, kv, K, scale, bias, \
                                    n, other ? other + r * ldo : 0);                                \
        }                                                                                           \
}

TILE_$T(tile_6x2_$T, 6, 2)
TILE_$T(tile_4x2_$T, 4, 2)
TILE_$T(tile_1x4_$T, 1, 4)
TILE_$T(tile_4x1_$T, 4, 1)
TILE_$T(tile_1x1_$T, 1, 1)


/* Rows [0, rows) of channels [n0, n1) of one product: the widest tiles first (6 rows x 2 channels,
   4 x 2, then one row x 4), the same tiles for a channel whatever the other tiles of the call. */
static void tiles_$T(const float *x, int64_t ldx, int64_t rows, int64_t K, const $WT *w,
                     const float *scale, const float *bias, const float *other, int64_t ldo, float *y,
                     int64_t ldy, int64_t n0, int64_t n1) {
    int64_t r = 0;
    for (; r + 6 <= rows; r += 6) {
        int64_t n = n0;
        for (; n + 2 <= n1; n += 2) tile_6x2_$T(x, ldx, w, K, scale, bias, other, ldo, y, ldy, r, n);
        for (; n < n1; n++) tile_4x1_$T(x, ldx, w, K, scale, bias, other, ldo, y, ldy, r, n),
                            tile_1x1_$T(x, ldx, w, K, scale, bias, other, ldo, y, ldy, r + 4, n),
                            tile_1x1_$T(x, ldx, w, K, scale, bias, other, ldo, y, ldy, r + 5, n);
    }
    for (; r + 4 <= rows; r += 4) {
        int64_t n = n0;
        for (; n + 2 <= n1; n += 2) tile_4x2_$T(x, ldx, w, K, scale, bias, other, ldo, y, ldy, r, n);
        for (; n < n1; n++) tile_4x1_$T(x, ldx, w, K, scale, bias, other, ldo, y, ldy, r, n);
    }
    for (; r < rows; r++) {
        int64_t n = n0;
        for (; n + 4 <= n1; n += 4) tile_1x4_$T(x, ldx, w, K, scale, bias, other, ldo, y, ldy, r, n);
        for (; n < n1; n++) tile_1x1_$T(x, ldx, w, K, scale, bias, other, ldo, y, ldy, r, n);
    }
}


/* A projection's parts side by side: y[:, part i's columns] = x W_i^T s_i + b_i (+ other), every
   part's tiles of NB channels shared out over the threads in one parallel loop. */
static void proj_$T(const ts_proj *p, const float *x, int64_t ldx, int64_t rows, const float *other,
                    int64_t ldo, float *y, int64_t ldy, int64_t threads) {
    int64_t first[TS_PARTS + 1], col[TS_PARTS + 1];
    first[0] = col[0] = 0;
    for (int64_t i = 0; i < p->nparts; i++) {
        first[i + 1] = first[i] + (p->n[i] + NB - 1) / NB;
        col[i + 1] = col[i] + p->n[i];
    }
    int64_t tiles = first[p->nparts];
#ifndef _OPENMP
    threads = 1;
#endif
    if (threads > tiles) threads = tiles;
    if (threads < 1) threads = 1;
#pragma omp parallel for num_threads((int)threads) schedule(static) if (threads > 1)
    for (int64_t t = 0; t < tiles; t++) {
        int64_t i = 0;
        while (t >= first[i + 1]) i++;
        int64_t n0 = (t - first[i]) * NB, n1 = n0 + NB < p->n[i] ? n0 + NB : p->n[i];
        tiles_$T(x, ldx, rows, p->K, (const $WT *)p->w[i], p->scale[i], p->bias[i],
                 other ? other + col[i] : 0, ldo, y + col[i], ldy, n0, n1);
    }
}

""")

_LINEAR = string.Template(r"""
/* x [rows, K] (row stride ldx), w [N, K] (float32: row-major; int8: blocked, [ceil(N/16)][K][16]),
   scale [N] or NULL (1), bias [N] or NULL, other [rows, N] (row stride ldo) or NULL, y [rows, N]
   (row stride ldy). Channels are shared out over up to `threads` OpenMP threads. */
void ts_${T}_linear(const float *x, int64_t ldx, int64_t rows, int64_t K, const $WT *w,
                    const float *scale, const float *bias, const float *other, int64_t ldo, float *y,
                    int64_t ldy, int64_t N, int64_t threads) {
    ts_proj p = {1, K, {w, 0, 0}, {scale, 0, 0}, {bias, 0, 0}, {N, 0, 0}};
    proj_$T(&p, x, ldx, rows, other, ldo, y, ldy, threads);
}
""")

SOURCE = (
    _HEAD
    + _PRODUCT.substitute(T="f32", WT="float", PF="15")
    + BLOCKED
    + _LINEAR.substitute(T="int8", WT="int8_t")
    + _LINEAR.substitute(T="f32", WT="float")
    + STEP_HEAD
    + LAYER.substitute(T="int8", WT="int8_t")
    + LAYER.substitute(T="f32", WT="float")
)

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_state: dict[str, Any] = {}
FALLBACK_BLOCK = 1024  # output channels dequantized at a time by the torch path (4 MB at K = 1024)


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def variant(flags: set[str] | None = None) -> str | None:
    """Which build fits this CPU: "avx512" (F, BW, VL), "avx2" (with FMA), or None (no SIMD kernel).
    No -march=native: a VM may advertise instructions it does not allow."""
    flags = cpu_flags() if flags is None else flags
    if {"avx512f", "avx512bw", "avx512vl", "fma"} <= flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return None


def _cflags(which: str) -> list[str]:
    base = ["-O3", "-fPIC", "-shared"]
    if which == "avx512":
        return [*base, "-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-DTS_AVX512"]
    return [*base, "-mavx2", "-mfma"]


def _compile(cc: str, flags: list[str]) -> ctypes.CDLL:
    """SOURCE compiled with flags (cached, `treesearch.kernels.cbuild`), loaded and typed."""
    dll = compile_library(SOURCE, "int8", flags, cc)
    for name in ("ts_int8_linear", "ts_f32_linear"):
        fn = getattr(dll, name)
        fn.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _PTR, _I64, _I64, _I64]
        fn.restype = None
    dll.ts_int8_proj.argtypes = [_PTR, _PTR, _I64, _I64, _PTR, _I64, _PTR, _I64, _I64]
    dll.ts_int8_proj.restype = None
    dll.ts_int8_rows.argtypes = [_PTR, _I64, _PTR, _PTR, _I64, _PTR]
    dll.ts_int8_rows.restype = None
    type_layer_calls(dll)
    return dll


def build(which: str, cc: str | None = None) -> tuple[Any, bool]:
    """The library built for variant which ("avx512" or "avx2", `variant`) by cc (default: $CC, cc
    or gcc): (the loaded library, whether it has OpenMP). Raises OSError where it does not build.
    `load` builds this CPU's variant; tests build both where the CPU runs both."""
    cc = compiler(cc)
    try:
        return _compile(cc, [*_cflags(which), "-fopenmp"]), True
    except OSError:
        return _compile(cc, _cflags(which)), False


def load() -> Any:
    """The compiled library (`ts_int8_linear`, `ts_int8_rows`), or None where it cannot be had (see
    `reason()`); built once per process, and its absence logged once."""
    if "dll" not in _state:
        which = variant()
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if os.environ.get("TREESEARCH_INT8_KERNEL", "1") == "0":
            _state["dll"], _state["reason"] = None, "off: TREESEARCH_INT8_KERNEL=0"
        elif which is None:
            _state["dll"], _state["reason"] = None, "not available: this CPU has neither AVX2+FMA nor AVX-512"
        elif not cc:
            _state["dll"], _state["reason"] = (
                None,
                "not available: no C compiler found (set CC, or install gcc)",
            )
        else:
            try:
                dll, omp = build(which, cc)
                _state["dll"] = dll
                _state["reason"] = f"compiled ({which}{'' if omp else ', without OpenMP: one thread'})"
            except (OSError, subprocess.SubprocessError) as e:
                _state["dll"], _state["reason"] = None, f"not available: {e}"
        if _state["dll"] is None:
            warnings.warn(
                f"the int8 kernel is {_state['reason']}; int8 layers multiply through torch on dequantized "
                "blocks (slower)",
                RuntimeWarning,
                stacklevel=2,
            )
    return _state["dll"]


class Proj(ctypes.Structure):
    """C's `ts_proj`: a projection's parts side by side (q, k, v; gate, up; or one), each a weight
    [n_i, K] with its channel scale and bias (0: none), for the layer calls (`ts_*_attn_in`,
    `ts_*_mlp`). `proj()` keeps the tensors it points at (`keep`), so a weight or bias replaced on
    its owner later cannot leave it pointing at freed memory."""

    _fields_ = [
        ("nparts", _I64),
        ("K", _I64),
        ("w", _PTR * 3),
        ("scale", _PTR * 3),
        ("bias", _PTR * 3),
        ("n", _I64 * 3),
    ]


def proj(parts: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]) -> Proj:
    """The `Proj` of up to three (weight, scale or None, bias or None) parts over the same inputs
    (contiguous float32 weights [n, K], or int8 ones blocked [ceil(n/16), K, 16] with their scale
    [n]; float32 scales and biases)."""
    if not 1 <= len(parts) <= 3 or len({w.shape[1] for w, _, _ in parts}) != 1:
        raise ValueError("a projection is 1 to 3 weights over the same number of inputs")
    p = Proj(len(parts), parts[0][0].shape[1])
    for i, (w, scale, bias) in enumerate(parts):
        for t in (w, scale, bias):
            if t is not None and not t.is_contiguous():
                raise ValueError("a projection's weights, scales and biases must be contiguous")
        p.w[i] = w.data_ptr()
        p.scale[i] = None if scale is None else scale.data_ptr()
        p.bias[i] = None if bias is None else bias.data_ptr()
        if w.dtype == torch.int8:
            if scale is None or w.dim() != 3 or w.shape[0] != blocks(scale.shape[0]):
                raise ValueError("an int8 part is a blocked weight [ceil(n/16), K, 16] with its scale [n]")
            p.n[i] = scale.shape[0]
        else:
            p.n[i] = w.shape[0]
    p.keep = parts  # the addresses above stay valid as long as this Proj lives
    return p


def project(x: torch.Tensor, p: Proj, other: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, K] -> [x W_i^T s_i + b_i]_i (+ other) [rows, sum n_i] for the int8 parts of p
    (`proj`) side by side in one kernel call; through torch (`linear`'s path) where it does not
    build."""
    n = sum(p.n[i] for i in range(p.nparts))
    if x.stride(1) != 1 or x.dtype != torch.float32:
        x = x.contiguous().float()
    if other is not None and (other.stride(1) != 1 or other.dtype != torch.float32):
        other = other.contiguous().float()
    dll = load()
    if dll is None:
        ys = [_torch_linear(x, w, s, b, None) for w, s, b in p.keep]
        y = torch.cat(ys, dim=-1) if len(ys) > 1 else ys[0]
        return y if other is None else y + other
    y = torch.empty(x.shape[0], n)
    if x.shape[0]:
        o, ldo = (None, 0) if other is None else (other.data_ptr(), other.stride(0))
        xp, ldx, yp, threads = x.data_ptr(), x.stride(0), y.data_ptr(), torch.get_num_threads()
        dll.ts_int8_proj(ctypes.addressof(p), xp, ldx, x.shape[0], o, ldo, yp, n, threads)
    return y


def reason() -> str:
    """Why the kernel is or is not used in this process."""
    load()
    return str(_state["reason"])


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    other: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [rows, K] float32, weight W [N, K] int8 in blocks (`int8_blocks.block`: [ceil(N/16), K,
    16]), scale [N] -> x (W * scale[:, None])^T (+ bias) (+ other [rows, N]) as float32 [rows, N],
    through the kernel where it builds."""
    n = scale.shape[0]
    if weight.dim() != 3 or weight.shape[0] != blocks(n) or weight.shape[2] != BLOCK:
        raise ValueError(
            f"an int8 weight of {n} channels is blocked [{blocks(n)}, K, {BLOCK}], not {tuple(weight.shape)}"
        )
    dll = load()
    if dll is None:
        return _torch_linear(x, weight, scale, bias, other)
    return _call(dll.ts_int8_linear, x, weight, n, scale, bias, other, None)


def float_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    other: torch.Tensor | None = None,
    *,
    scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [rows, K] float32, weight [N, K] float32 (contiguous) -> x weight^T (* scale [N]) (+ bias)
    (+ other) through the same tiles as `linear` (batch invariant, the weight read once per call),
    written into out [rows, N] (rows may be strided: a column slice of a wider result) when given;
    torch's `F.linear` where the kernel does not build."""
    dll = load()
    if dll is None:
        y = F.linear(x, weight)
        y = y if scale is None else y * scale
        y = y if bias is None else y + bias
        y = y if other is None else y + other
        return y if out is None else out.copy_(y)
    return _call(dll.ts_f32_linear, x, weight, weight.shape[0], scale, bias, other, out)


def _call(
    fn: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    n: int,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    other: torch.Tensor | None,
    out: torch.Tensor | None,
) -> torch.Tensor:
    rows, k = x.shape
    if x.stride(1) != 1 or x.dtype != torch.float32:
        x = x.contiguous().float()
    if other is not None and (other.stride(1) != 1 or other.dtype != torch.float32):
        other = other.contiguous().float()
    y = torch.empty(rows, n) if out is None else out
    if y.stride(1) != 1 or y.shape != (rows, n):
        raise ValueError(f"out must be [{rows}, {n}] with unit column stride, not {tuple(y.shape)}")
    if rows == 0:
        return y
    fn(
        x.data_ptr(),
        x.stride(0),
        rows,
        k,
        weight.data_ptr(),
        None if scale is None else scale.data_ptr(),
        None if bias is None else bias.data_ptr(),
        None if other is None else other.data_ptr(),
        0 if other is None else other.stride(0),
        y.data_ptr(),
        y.stride(0),
        n,
        torch.get_num_threads(),
    )
    return y


def rows(ids: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Rows ids (any shape) of the int8 table weight [V, K] (blocked, `int8_blocks.block`) with per-row scale,
    as float32 [*ids.shape, K] (an embedding lookup that keeps no float32 copy of the table)."""
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    k = weight.shape[1]
    dll = load()
    if dll is None:
        picked = weight[flat // BLOCK, :, flat % BLOCK]  # [n, K]: each id's lane of its block
        out = picked.float() * scale.index_select(0, flat)[:, None]
    else:
        out = torch.empty(flat.shape[0], k)
        dll.ts_int8_rows(
            flat.data_ptr(), flat.shape[0], weight.data_ptr(), scale.data_ptr(), k, out.data_ptr()
        )
    return out.view(*ids.shape, k)


def _torch_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    other: torch.Tensor | None,
) -> torch.Tensor:
    """The kernel's result through torch: FALLBACK_BLOCK channels (FALLBACK_BLOCK / 16 blocks)
    dequantized at a time (no float32 copy of the whole weight is kept)."""
    x = x.float()
    n = scale.shape[0]
    parts = []
    step = FALLBACK_BLOCK // BLOCK
    for b0 in range(0, weight.shape[0], step):
        n0, n1 = b0 * BLOCK, min(n, (b0 + step) * BLOCK)
        w = weight[b0 : b0 + step].transpose(1, 2).reshape(-1, weight.shape[1])[: n1 - n0]
        w = w.float() * scale[n0:n1, None]
        parts.append(F.linear(x, w, None if bias is None else bias[n0:n1]))
    y = torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]
    return y if other is None else y + other
