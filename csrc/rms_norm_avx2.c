/* rms_norm.h: two passes over a row of K (2-8 KB, in L1 after the first). */
#include "rms_norm.h"

#include <immintrin.h>
#include <math.h>

#include "simd.h"

void rms_norm_row(const float *x, const float *skip, const float *gamma, int64_t K, float eps, float *sum, float *y) {
    __m256 sq = _mm256_setzero_ps();
    for (int64_t i = 0; i < K; i += 8) {
        __m256 s = _mm256_loadu_ps(x + i);
        if (skip) s = _mm256_add_ps(s, _mm256_loadu_ps(skip + i));
        if (sum) _mm256_storeu_ps(sum + i, s);
        _mm256_storeu_ps(y + i, s); /* y holds s until the scale is known */
        sq = _mm256_fmadd_ps(s, s, sq);
    }
    __m256 inv = _mm256_set1_ps(1.0f / sqrtf(hsum8(sq) / (float)K + eps));
    for (int64_t i = 0; i < K; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(y + i), inv), _mm256_loadu_ps(gamma + i)));
}
