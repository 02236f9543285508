"""A small compiled kernel for the decode step: each row's attention over the K/V runs that it
reads apart from the other rows (its own runs, and runs only some rows read), merged into the
row's softmax over the runs every row reads.

Why: read with torch ops, every such run costs two small matrix products per row and layer (and
a run read by some rows a log-sum-exp merge), about 60 ops a layer at 16 rows, each paying
dispatch overhead far above its arithmetic (README, Performance: about 4 ms a row a step). This
kernel reads them all in one call per layer, in place (no K/V is copied, so it runs under a cache
budget too), from a table of pointers and strides made once per step. Its (row, kv head) pairs
are shared out over the step's torch threads with OpenMP, one parallel region per call (the
torch ops around it run on one thread: `SERIAL_ATTENTION` in the decoder); each pair is computed
whole by one thread, so the result is the same at any thread count.

It is C, compiled on first use by the machine's C compiler (`$CC`, else `cc`) into the treesearch
cache folder, and loaded with ctypes: no build step, no Python extension API (with -fopenmp where
the compiler takes it, else for one thread). Where no compiler works, or
`TREESEARCH_RUNS_KERNEL=0`, `load()` returns None and the decoder reads the runs with torch ops as
before (`reason()` says why). The math is the same softmax, summed in another order
(tests/engine/test_runs_kernel.py checks it against torch's to 1e-5).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path
from typing import Any

import torch

from treesearch.kernels.cbuild import build_openmp

# One row, one kv head: its g query heads' scores over every token of the row's runs, then the
# softmax merged with the row's joint part (normalised output o and log-normaliser l: the state
# m = l, sum = 1, acc = o of an online softmax), then the probabilities times V.
SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static inline float dot(const float *a, const float *b, int64_t d) {
    float s = 0.0f;
#pragma omp simd reduction(+:s)
    for (int64_t x = 0; x < d; x++) s += a[x] * b[x];
    return s;
}

/* One row b and kv head h: its g query heads' scores over the row's n run tokens (s: scratch of
   g n + g d + g floats), merged with the joint part, times V, written over the joint part. */
static void attend_head(const float *q, int64_t q_row, float *out, const float *lse, int64_t hkv,
                        int64_t g, int64_t d, const int64_t *table, int64_t e0, int64_t e1, int64_t n,
                        int64_t layer, int64_t b, int64_t h, float *s) {
    float *acc = s + g * n, *den = acc + g * d;
    const float *qh = q + b * q_row + h * g * d;
    float *oh = out + (b * hkv + h) * g * d;
    const float *lh = lse + (b * hkv + h) * g;
    int64_t t = 0;
    for (int64_t e = e0; e < e1; e++) {
        const int64_t *r = table + 6 * e;
        const float *k = (const float *)(intptr_t)r[0] + layer * r[1] + h * r[3];
        for (int64_t i = 0; i < r[5]; i++, t++, k += r[4])
            for (int64_t j = 0; j < g; j++) s[j * n + t] = dot(qh + j * d, k, d);
    }
    for (int64_t j = 0; j < g; j++) {
        float m = lh[j];
        for (int64_t i = 0; i < n; i++) m = s[j * n + i] > m ? s[j * n + i] : m;
        float w = isinf(lh[j]) ? 0.0f : expf(lh[j] - m), sum = w;
        for (int64_t i = 0; i < n; i++) {
            float p = expf(s[j * n + i] - m);
            s[j * n + i] = p;
            sum += p;
        }
        den[j] = sum;
        for (int64_t x = 0; x < d; x++) acc[j * d + x] = w * oh[j * d + x];
    }
    t = 0;
    for (int64_t e = e0; e < e1; e++) {
        const int64_t *r = table + 6 * e;
        const float *v = (const float *)(intptr_t)r[0] + r[2] + layer * r[1] + h * r[3];
        for (int64_t i = 0; i < r[5]; i++, t++, v += r[4])
            for (int64_t j = 0; j < g; j++) {
                float p = s[j * n + t];
                float *aj = acc + j * d;
#pragma omp simd
                for (int64_t x = 0; x < d; x++) aj[x] += p * v[x];
            }
    }
    for (int64_t j = 0; j < g; j++)
        for (int64_t x = 0; x < d; x++) oh[j * d + x] = acc[j * d + x] / den[j];
}

/* table: per run 6 int64 (address of K at layer 0, head 0, token 0; layer stride; V - K offset;
   head stride; token stride; length), strides in floats, runs sorted by row: row_ptr[b] ..
   row_ptr[b + 1]. q: [rows, hkv, g, d] with row stride q_row; out [rows, hkv, g, d] and
   lse [rows, hkv, g] (contiguous) hold the joint part and get the merged result. The (row, kv
   head) pairs are shared out over up to `threads` OpenMP threads (where built with OpenMP); each
   pair is computed whole by one thread, so the result does not depend on the thread count.
   Returns 0, or -1 when it could not allocate its scratch. */
int ts_attend_runs(const float *q, int64_t q_row, float *out, const float *lse, int64_t rows,
                   int64_t hkv, int64_t g, int64_t d, const int64_t *table, const int64_t *row_ptr,
                   int64_t layer, int64_t threads) {
    int64_t most = 0;
    for (int64_t b = 0; b < rows; b++) {
        int64_t n = 0;
        for (int64_t e = row_ptr[b]; e < row_ptr[b + 1]; e++) n += table[6 * e + 5];
        if (n > most) most = n;
    }
    if (most == 0) return 0;
#ifndef _OPENMP
    threads = 1;
#endif
    if (threads > rows * hkv) threads = rows * hkv;
    if (threads < 1) threads = 1;
    int64_t per = g * most + g * d + g;
    float *scratch = (float *)malloc(sizeof(float) * (size_t)(per * threads));
    if (!scratch) return -1;
#pragma omp parallel for num_threads((int)threads) schedule(dynamic, 1) if (threads > 1)
    for (int64_t u = 0; u < rows * hkv; u++) {
        int64_t b = u / hkv, e0 = row_ptr[b], e1 = row_ptr[b + 1], n = 0;
        for (int64_t e = e0; e < e1; e++) n += table[6 * e + 5];
#ifdef _OPENMP
        float *s = scratch + per * omp_get_thread_num();
#else
        float *s = scratch;
#endif
        if (n > 0) attend_head(q, q_row, out, lse, hkv, g, d, table, e0, e1, n, layer, b, u % hkv, s);
    }
    free(scratch);
    return 0;
}
"""

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_state: dict[str, Any] = {}


def _flags() -> list[str]:
    """-O3 and SIMD reductions; AVX2/FMA where this CPU has them, and AVX-512 F/VL too (no
    -march=native: a VM may advertise instructions it does not allow). The kernels' vectors stay
    eight floats wide: AVX-512 VL gives them 32 registers instead of 16 and folds broadcasts into
    the FMAs (the attention kernel over a 1,000-token prompt 17.1 -> 14.7 ms a layer on the AVX-512
    Xeon, two threads), the same operations in the same order, so the same bits."""
    flags = ["-O3", "-fopenmp-simd", "-fPIC", "-shared"]
    try:
        cpu = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpu = ""
    if " avx2" in cpu and " fma" in cpu:
        flags += ["-mavx2", "-mfma"]
        if " avx512f" in cpu and " avx512vl" in cpu:
            flags += ["-mavx512f", "-mavx512vl"]
    return flags


def build(source: str, stem: str, name: str, argtypes: list) -> tuple[ctypes.CDLL, bool]:
    """Compile C source once per source and flags into the cache folder (atomically) as
    `<stem>-<hash>.so`, then load it and type its function `name`: with OpenMP where the compiler
    has it (-fopenmp links libgomp, which torch's CPU builds load already), else for one thread.
    -> (library, built with OpenMP)."""
    dll, openmp = build_openmp(source, stem, _flags())
    fn = getattr(dll, name)
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return dll, openmp


_ARGS = [_PTR, _I64, _PTR, _PTR, _I64, _I64, _I64, _I64, _PTR, _PTR, _I64, _I64]


def load() -> Any:
    """The compiled `ts_attend_runs`, or None where it cannot be had (see `reason()`); built once
    per process."""
    return load_once(_state, SOURCE, "runs", "ts_attend_runs", _ARGS)


def load_once(state: dict[str, Any], source: str, name: str, symbol: str, args: list) -> Any:
    """A compiled kernel's function, built at the first call and kept in `state` with the reason it
    is or is not there (off with TREESEARCH_RUNS_KERNEL=0; None where it cannot be built)."""
    if "fn" not in state:
        if os.environ.get("TREESEARCH_RUNS_KERNEL", "1") == "0":
            state["fn"], state["reason"] = None, "off: TREESEARCH_RUNS_KERNEL=0"
        else:
            try:
                dll, openmp = build(source, name, symbol, args)
                state["fn"] = getattr(dll, symbol)
                state["reason"] = "compiled" if openmp else "compiled without OpenMP (one thread)"
            except (OSError, subprocess.SubprocessError) as e:
                state["fn"], state["reason"] = None, f"not available: {e}"
    return state["fn"]


def reason() -> str:
    """Why the kernel is or is not used in this process."""
    load()
    return str(_state["reason"])


class RunTable:
    """The runs that rows read apart, as the kernel's table: one entry per (row, run), sorted by
    row. Built once per step from the runs' K/V tensors [L, 2, Hkv, n, d] (kept alive here)."""

    def __init__(self, rows: int, runs: list[tuple[torch.Tensor, int, list[int]]]) -> None:
        per_row: list[list[list[int]]] = [[] for _ in range(rows)]
        self.keep = [kv for kv, _, _ in runs]
        for kv, used, readers in runs:
            s = kv.stride()
            entry = [kv.data_ptr(), s[0], s[1], s[2], s[3], used]
            for row in readers:
                per_row[row].append(entry)
        flat = [e for row in per_row for e in row]
        self.table = torch.tensor(flat, dtype=torch.int64).reshape(-1, 6)
        counts = torch.tensor([0] + [len(r) for r in per_row], dtype=torch.int64)
        self.row_ptr = torch.cumsum(counts, 0)

    @staticmethod
    def fits(kv: torch.Tensor) -> bool:
        """A run's K/V the kernel can read: float32 on the CPU, [L, 2, Hkv, n, d] with d contiguous."""
        return kv.dtype == torch.float32 and kv.device.type == "cpu" and kv.dim() == 5 and kv.stride(4) == 1

    def attend(
        self, fn: Any, layer: int, q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, threads: int = 1
    ) -> None:
        """Merge every row's runs into out [B, Hkv, g, d] (in place), given the joint part's out
        and log-normaliser lse [B, Hkv, g] (both contiguous); q [B, Hkv, g, d], rows strided. The
        (row, kv head) pairs are shared out over up to `threads` threads (same result at any count)."""
        bsz, hkv, g, d = q.shape
        rc = fn(
            q.data_ptr(),
            q.stride(0),
            out.data_ptr(),
            lse.data_ptr(),
            bsz,
            hkv,
            g,
            d,
            self.table.data_ptr(),
            self.row_ptr.data_ptr(),
            layer,
            threads,
        )
        if rc != 0:
            raise MemoryError("the runs kernel could not allocate its scratch")
