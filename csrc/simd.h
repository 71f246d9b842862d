/* AVX2 helpers shared by the kernels: horizontal sum and max of 8 floats, a vectorized exp (SiluMul's
 * sigmoid, LinearAttention's softmax), and the attention ops' K/V row access in fp32, fp16 or q8. */
#ifndef EDGE_SIMD_H
#define EDGE_SIMD_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

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
    /* The clamp's constants first: max_ps/min_ps return their second operand when either is NaN, so a NaN
     * score stays NaN (and the softmax with it) instead of becoming exp(-87.3), a silent zero weight. */
    x = _mm256_min_ps(_mm256_set1_ps(88.3f), _mm256_max_ps(_mm256_set1_ps(-87.3f), x));
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

/* K/V caches hold fp32, fp16, or q8 rows (a bundle's kv dtype): each q8 row is its fp32 scale followed by
 * its D int8 codes, value = code * scale (llama.cpp's q8_0 scheme with one block a row). The attention
 * kernels take the type `t` as a constant of an always-inlined body, so each type gets its own loops
 * with the same arithmetic order: a cache of fp16 or q8 rows computes exactly what an fp32 cache holding
 * the rows' values does. */
enum { KV_F32 = 0, KV_F16 = 1, KV_Q8 = 2 };

static inline int64_t kv_row_bytes(int64_t d, int t) { return t == KV_F32 ? 4 * d : t == KV_F16 ? 2 * d : d + 4; }

/* Row `row` of a [rows, d] cache. */
static inline const void *kv_row(const void *base, int64_t row, int64_t d, int t) {
    return (const char *)base + row * kv_row_bytes(d, t);
}

/* Elements e..e+7 of a K/V row as fp32 (F16C widens fp16 exactly; q8: code * scale, one rounding). */
static inline __m256 kv_load8(const void *row, int64_t e, int t) {
    if (t == KV_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + e)));
    if (t == KV_Q8) {
        float scale;
        memcpy(&scale, row, sizeof scale);
        __m256i c = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)row + 4 + e)));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(c), _mm256_set1_ps(scale));
    }
    return _mm256_loadu_ps((const float *)row + e);
}

/* Store x [d] as a K/V row: fp16 rounds to nearest even (numpy's astype); q8 takes scale = max|x| / 127
 * and codes round(x * 127 / max|x|), to nearest even (0 codes and scale for a zero row). */
static inline void kv_store_row(void *row, const float *x, int64_t d, int t) {
    if (t == KV_Q8) {
        float amax = 0.0f;
        for (int64_t e = 0; e < d; e++) amax = fabsf(x[e]) > amax ? fabsf(x[e]) : amax;
        float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        memcpy(row, &scale, sizeof scale);
        int8_t *codes = (int8_t *)row + 4;
        for (int64_t e = 0; e < d; e++) {
            float q = nearbyintf(x[e] * inv);
            codes[e] = (int8_t)(q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q);
        }
        return;
    }
    for (int64_t e = 0; e < d; e += 8) {
        __m256 v = _mm256_loadu_ps(x + e);
        if (t == KV_F16)
            _mm_storeu_si128((__m128i *)((uint16_t *)row + e), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
        else
            _mm256_storeu_ps((float *)row + e, v);
    }
}

#endif
