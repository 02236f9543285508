"""The C of a decode step's layer calls, for the fused step (`treesearch.engine.fused_step`):
`ts_*_attn_in` (RMSNorm, the q/k/v projection, RoPE and the K/V write), `ts_*_mlp` (the output
projection and its residual, RMSNorm, gate/up, SiLU x up, down and its residual), and `ts_*_step`,
which runs every layer of a step, the attention kernel between the two calls of each
(`treesearch.kernels.attend_kernel`, called through its address), then the final RMSNorm and the
LM head, in one call from Python.

Why one call: a one-row step of the default model (30 layers) made 91 ctypes calls from a Python
loop, each a few microseconds, with the interpreter's code and data out of cache after every
layer's weights streamed past; the step's products and attention are what should take its time.

Compiled into `treesearch.models.int8_kernel`'s library (its products `proj_*`, `rms_norm` and
`silu_mul` come from there); `type_layer_calls` gives ctypes the functions' signatures.
"""

from __future__ import annotations

import ctypes
import string
from typing import Any

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_F32 = ctypes.c_float

# Once, before the per-type calls: the attention kernel's signature and `ts_step`, a step's facts.
STEP_HEAD = r"""
/* `treesearch.kernels.attend_kernel`'s ts_attend: 0, or -1 when out of memory. */
typedef int (*ts_attend_fn)(const float *q, int64_t q_row, float *out, int64_t rows, int64_t hkv,
                            int64_t g, int64_t d, const int64_t *runs, const int64_t *nread,
                            const int64_t *readers, int64_t nruns, int64_t layer, int64_t threads,
                            int64_t chunk);

/* A step over `rows` rows (ctypes: `StepArgs`). layer: per layer six addresses (its q/k/v
   `ts_proj`, the first RMSNorm's weight, o's `ts_proj`, the second norm's weight, gate/up's and
   down's `ts_proj`); k, v: layer 0's slot for the new K/V, the layers kl (vl) floats apart;
   cos, sin: [rows, d]; q, out [rows, heads d], xs [rows, K], qkv, gu, h: scratch; the attention's
   run table as `ts_attend` takes it; head (NULL: none), its norm's weight and logits [rows, N]. */
typedef struct {
    int64_t rows, heads, hkv, d, layers, threads;
    const int64_t *layer;
    const float *cos, *sin;
    float *k, *v;
    int64_t kl, kb, kh, vl, vb, vh;
    float *q, *out, *xs, *qkv, *gu, *h;
    void *attend;
    const int64_t *runs, *nread, *readers;
    int64_t nruns, chunk;
    const ts_proj *head;
    const float *head_ln;
    float *logits;
    float eps;
} ts_step;
"""

# The per-type calls (T int8 or f32, WT its weight type).
LAYER = string.Template(
    r"""/* A decoder layer up to its attention, for rows at once: RMSNorm of x (times ln, its weight),
   the q/k/v projection, RoPE on q and k (cos, sin' [rows, d]: sin with its first half negated),
   the new k and v written at (row b, kv head h) k + b kb + h kh (v likewise), q [rows, heads d].
   xs [rows, K] and qkv [rows, (heads + 2 hkv) d] are scratch. */
void ts_${T}_attn_in(const float *x, int64_t rows, const float *ln, float eps, const ts_proj *p,
                     const float *cos, const float *sin, int64_t heads, int64_t hkv, int64_t d,
                     float *k, int64_t kb, int64_t kh, float *v, int64_t vb, int64_t vh, float *q,
                     float *xs, float *qkv, int64_t threads) {
    int64_t K = p->K, n = (heads + 2 * hkv) * d, half = d / 2;
    for (int64_t r = 0; r < rows; r++) rms_norm(x + r * K, K, ln, eps, xs + r * K);
    proj_$T(p, xs, K, rows, 0, 0, qkv, n, threads);
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos + r * d, *s = sin + r * d, *src = qkv + r * n;
        for (int64_t h = 0; h < heads + hkv; h++) {
            const float *a = src + h * d;
            float *dst = h < heads ? q + (r * heads + h) * d : k + r * kb + (h - heads) * kh;
            for (int64_t i = 0; i < d; i++) dst[i] = a[i] * c[i] + a[i < half ? i + half : i - half] * s[i];
        }
        for (int64_t h = 0; h < hkv; h++) memcpy(v + r * vb + h * vh, src + (heads + hkv + h) * d, d * 4);
    }
}

/* A decoder layer after its attention, x [rows, K] updated in place: x += attn o^T; then
   x += silu(g) u down^T, [g u] = RMSNorm(x) ln gate_up^T. xs [rows, K], gu [rows, 2 inter] and
   h [rows, inter] are scratch. */
void ts_${T}_mlp(float *x, const float *attn, int64_t rows, const ts_proj *o, const float *ln,
                 float eps, const ts_proj *gate_up, const ts_proj *down, float *xs, float *gu, float *h,
                 int64_t threads) {
    int64_t K = down->n[0], inter = down->K;
    proj_$T(o, attn, o->K, rows, x, K, x, K, threads);
    for (int64_t r = 0; r < rows; r++) rms_norm(x + r * K, K, ln, eps, xs + r * K);
    proj_$T(gate_up, xs, K, rows, 0, 0, gu, 2 * inter, threads);
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * 2 * inter;
        silu_mul(g, g + inter, h + r * inter, inter);
    }
    proj_$T(down, h, inter, rows, x, K, x, K, threads);
}

/* Every layer of a step, then the final RMSNorm and the head: x [rows, K] (the embeddings,
   updated in place) -> logits. Returns 0, or the attention kernel's -1 (out of memory). */
int ts_${T}_step(const ts_step *s, float *x) {
    ts_attend_fn attend = (ts_attend_fn)s->attend;
    int64_t rows = s->rows, heads = s->heads, hkv = s->hkv, d = s->d, threads = s->threads;
    for (int64_t i = 0; i < s->layers; i++) {
        const int64_t *a = s->layer + 6 * i;
        const ts_proj *qkv = (const ts_proj *)(intptr_t)a[0], *o = (const ts_proj *)(intptr_t)a[2];
        const ts_proj *gu = (const ts_proj *)(intptr_t)a[4], *down = (const ts_proj *)(intptr_t)a[5];
        ts_${T}_attn_in(x, rows, (const float *)(intptr_t)a[1], s->eps, qkv, s->cos, s->sin, heads, hkv,
                        d, s->k + i * s->kl, s->kb, s->kh, s->v + i * s->vl, s->vb, s->vh, s->q, s->xs,
                        s->qkv, threads);
        int rc = attend(s->q, heads * d, s->out, rows, hkv, heads / hkv, d, s->runs, s->nread,
                        s->readers, s->nruns, i, threads, s->chunk);
        if (rc) return rc;
        ts_${T}_mlp(x, s->out, rows, o, (const float *)(intptr_t)a[3], s->eps, gu, down, s->xs, s->gu,
                    s->h, threads);
    }
    if (s->head) {
        int64_t K = s->head->K, n = 0;
        for (int64_t i = 0; i < s->head->nparts; i++) n += s->head->n[i];
        for (int64_t r = 0; r < rows; r++) rms_norm(x + r * K, K, s->head_ln, s->eps, s->xs + r * K);
        proj_$T(s->head, s->xs, K, rows, 0, 0, s->logits, n, threads);
    }
    return 0;
}
"""
)


class StepArgs(ctypes.Structure):
    """C's `ts_step`: what `ts_*_step` reads (see STEP_HEAD)."""

    _fields_ = [
        *((name, _I64) for name in ("rows", "heads", "hkv", "d", "layers", "threads")),
        ("layer", _PTR),
        ("cos", _PTR),
        ("sin", _PTR),
        ("k", _PTR),
        ("v", _PTR),
        *((name, _I64) for name in ("kl", "kb", "kh", "vl", "vb", "vh")),
        *((name, _PTR) for name in ("q", "out", "xs", "qkv", "gu", "h")),
        *((name, _PTR) for name in ("attend", "runs", "nread", "readers")),
        ("nruns", _I64),
        ("chunk", _I64),
        ("head", _PTR),
        ("head_ln", _PTR),
        ("logits", _PTR),
        ("eps", _F32),
    ]


def type_layer_calls(dll: Any) -> None:
    """The layer calls' ctypes signatures on the compiled library."""
    for t in ("int8", "f32"):
        fn = getattr(dll, f"ts_{t}_attn_in")
        fn.argtypes = [_PTR, _I64, _PTR, _F32, _PTR, _PTR, _PTR, _I64, _I64, _I64]
        fn.argtypes += [_PTR, _I64, _I64, _PTR, _I64, _I64, _PTR, _PTR, _PTR, _I64]
        fn.restype = None
        fn = getattr(dll, f"ts_{t}_mlp")
        fn.argtypes = [_PTR, _PTR, _I64, _PTR, _PTR, _F32, _PTR, _PTR, _PTR, _PTR, _PTR, _I64]
        fn.restype = None
        fn = getattr(dll, f"ts_{t}_step")
        fn.argtypes = [ctypes.POINTER(StepArgs), _PTR]
        fn.restype = ctypes.c_int
