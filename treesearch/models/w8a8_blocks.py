"""The w8a8 prototype's weight layout and its C (`treesearch.models.w8a8_kernel` compiles it and
holds the maths in its docstring).

Layout (`layout`): an int8 weight [N, K] in blocks of 16 output channels, 4 consecutive k per
channel, biased to unsigned: [ceil(N/16), Kp/4, 16, 4] uint8 = w + 128, channel n's k-th weight at
[n // 16, k // 4, n % 16, k % 4], Kp = K rounded up to a multiple of 32; channels past N and k past
K hold 128 (w = 0). One 64-byte row of it (16 channels x 4 k) is one AVX-512 vector, the operand
of `vpdpbusd` (unsigned x signed bytes, 4 products summed per int32 lane), or two AVX2 vectors of 8
channels.

Tiles (measured on the 0.5B's layer shapes, Xeon, 2 threads): VNNI 6 rows x 2 vectors (12 int32
block sums and 12 float32 accumulators) was the best of 6 x 2, 8 x 2, 4 x 3, 6 x 3, 8 x 3, 4 x 4
and 12 x 1 at 16-256 rows (8 x 2 and 4 x 3 2-9% slower, the others 9-38%); AVX2 6 x 1 of 2 x 2,
3 x 2, 4 x 1, 4 x 2, 6 x 1, 8 x 1 and 12 x 1 (the others 3-25% slower at 64-256 rows).
"""

from __future__ import annotations

import torch

QB = 32  # activations per scale (and weights per block of the dot products)
BLOCK = 16  # output channels per weight block


def padded(k: int) -> int:
    """K rounded up to whole blocks of QB."""
    return -(-k // QB) * QB


def layout(q: torch.Tensor) -> torch.Tensor:
    """An int8 weight [N, K] in the kernel's layout: uint8 [ceil(N/16), Kp/4, 16, 4] = w + 128,
    channel n's k-th weight at [n // 16, k // 4, n % 16, k % 4]; channels past N and k past K hold
    128 (w = 0)."""
    n, k = q.shape
    nb, kp = -(-n // BLOCK) * BLOCK, padded(k)
    biased = torch.full((nb, kp), 128, dtype=torch.uint8)
    biased[:n, :k] = q.contiguous().view(torch.uint8) ^ 0x80  # w + 128 is w's byte with its top bit flipped
    return biased.view(nb // BLOCK, BLOCK, kp // 4, 4).transpose(1, 2).contiguous()


def unlayout(wl: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The plain int8 weight [n, k] of a laid-out one (`layout`): a new tensor."""
    plain = wl.transpose(1, 2).reshape(wl.shape[0] * BLOCK, wl.shape[1] * 4)[:n, :k]
    return (plain ^ 0x80).view(torch.int8).contiguous()


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
