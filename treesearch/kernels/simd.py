"""Eight-float vectors for the compiled kernels (GCC vector extensions, AVX2 registers where the
build has -mavx2): load, store, splat, select and e^x (`exp8`), shared by the attention kernel
(`treesearch.kernels.attend_kernel`) and the layer calls (`treesearch.models.int8_kernel`)."""

VEC8 = r"""
typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));

static inline v8 ld(const float *p) { return *(const v8u *)p; }
static inline void st(float *p, v8 x) { *(v8u *)p = x; }
static inline v8 splat(float a) { v8 r = {a, a, a, a, a, a, a, a}; return r; }
static inline v8 sel(v8i m, v8 a, v8 b) { return (v8)(((v8i)a & m) | ((v8i)b & ~m)); }

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
"""
