/* AVX2 helpers shared by the kernels: horizontal sum and max of 8 floats, a vectorized exp (SiluMul's
 * sigmoid, LinearAttention's softmax), and the attention ops' K/V element access in fp32 or fp16. */
#ifndef EDGE_SIMD_H
#define EDGE_SIMD_H

#include <immintrin.h>
#include <stdint.h>

static inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

static inline float hmax8(__m256 v) {
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_max_ss(a, _mm_movehdup_ps(a)));
}

/* exp(x) for x in [-88, 88], Cephes' expf polynomial (relative error ~2e-7 over the range). */
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  /* ln 2 in two parts: exact n*hi */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* K/V caches hold fp32 or fp16 (a bundle's kv dtype). The attention kernels take `f16` as a constant of an
 * always-inlined body, so each element type gets its own loop with the same arithmetic order: an fp16 cache
 * computes exactly what an fp32 cache holding the same (fp16-representable) values does. */
static inline const void *kv_at(const void *base, int64_t elems, int f16) {
    return (const char *)base + elems * (f16 ? 2 : 4);
}

/* Elements e..e+7 of a K/V row as fp32 (F16C widens fp16 exactly). */
static inline __m256 kv_load8(const void *row, int64_t e, int f16) {
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + e)))
               : _mm256_loadu_ps((const float *)row + e);
}

/* Store x as elements e..e+7 of a K/V row: fp16 rounds to nearest even (what numpy's astype does). */
static inline void kv_store8(void *row, int64_t e, __m256 x, int f16) {
    if (f16)
        _mm_storeu_si128((__m128i *)((uint16_t *)row + e), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    else
        _mm256_storeu_ps((float *)row + e, x);
}

#endif
