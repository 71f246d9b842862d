/* MatMulQ8 with fp32_compute=1 (q8gemm.h): the activations stay float and each weight code is widened to
 * float, so the product is what MatMulNBits computes at accuracy_level 0 (up to float rounding order):
 *   y[n] = scales[n] * sum_k (B[n, k] - 128) * x_k
 * without MatMulNBits' float copy of all of B on every call. The export's fp32 twin of an INT8 per-channel
 * graph runs it (exporters/export.py): the same weight bytes with float activations.
 * "Quantizing" a row copies it into the scratch, after the op's silu_mul / rms_norm prologue. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "qgemm.h"
#include "simd.h"

#define ROWS 4

static size_t scratch_bytes(int64_t K, int64_t M) { return (size_t)(K * M) * sizeof(float); }

static void quantize_row(const float *x, int64_t K, int64_t M, void *scratch, int64_t r) {
    (void)M;
    memcpy((float *)scratch + r * K, x, (size_t)K * sizeof(float));
}

static void tile(const void *scratch, int64_t r0, int m, const uint8_t *B, const void *scales, int fp16_scales,
                 int64_t K, int64_t N, int64_t n0, int64_t n1, int64_t p0, int64_t p1, float *y, int64_t M) {
    (void)fp16_scales, (void)M;
    const float *x = (const float *)scratch + r0 * K, *s = scales;
    const __m256i zero_point = _mm256_set1_epi32(128);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *b = B + n * K;
        __m256 acc[ROWS] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t k = p0 * 64; k < p1 * 64; k += 8) {
            __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + k)));
            __m256 w = _mm256_cvtepi32_ps(_mm256_sub_epi32(c, zero_point)); /* exact: |code| <= 128 */
            for (int r = 0; r < m; r++) acc[r] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + r * K + k), acc[r]);
        }
        for (int r = 0; r < m; r++) {
            float v = s[n] * hsum8(acc[r]);
            y[r * N + n] = p0 == 0 ? v : y[r * N + n] + v;
        }
    }
}

const QImpl q8_fp32 = {"fp32", ROWS, scratch_bytes, quantize_row, tile};
