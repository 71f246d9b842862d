/* The per-block activation quantizer every kernel uses, and the "quad" activation layout the VNNI int4
 * kernel and both int8 kernels share: K in quads of 4 pairs of blocks (256 values), rows in tiles of 4.
 *
 *   scratch: tile 0 [quad 0: row 0 | row 1 | row 2 | row 3][quad 1: ...] ... tile 1 ...
 *   one row's quad (QUAD_ROW bytes): xq int8 [256] | zp int32 [8] | sx float [8]
 *
 * The order of the 256 codes, and what zp holds, are the kernel's own (q4gemm_vnni.c, q8kernel.h); the
 * last tile holds fewer than 4 rows (the rows past M take no space), and a pair of the last, partial quad
 * beyond K is zero. */
#ifndef EDGE_QUAD_H
#define EDGE_QUAD_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "simd.h"

#define QUAD_ROW 320

static inline int64_t quads_of(int64_t K) { return (K / 64 + 3) / 4; }

/* Where the tile holding row r starts. */
static inline char *quad_tile(const void *scratch, int64_t K, int64_t r) {
    return (char *)scratch + (size_t)(r / 4 * quads_of(K)) * 4 * QUAD_ROW;
}

static inline size_t quad_scratch_bytes(int64_t K, int64_t M) {
    return (size_t)((M + 3) / 4 * quads_of(K)) * 4 * QUAD_ROW;
}

/* Row r's quad `q` (rows: how many rows its tile holds). */
static inline char *quad_row(const void *scratch, int64_t K, int64_t M, int64_t r, int64_t q) {
    int64_t lane = r % 4, rows = M - (r - lane) < 4 ? M - (r - lane) : 4;
    return quad_tile(scratch, K, r) + (q * rows + lane) * QUAD_ROW;
}

/* One block of 32 activations to int8 codes `q` (round to nearest even, as MLAS does); returns its scale
 * (block max / 127). A NaN or infinite activation gives codes 0 and a NaN scale, so every product with the
 * block is NaN, as float arithmetic would make it: max_ps drops a NaN in its first operand, and a NaN
 * swallowed here would reach the logits as finite garbage that the runtime's check (logits_check.py)
 * cannot tell from an answer. */
static inline float quantize_block(const float *xb, int32_t q[32]) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_and_ps(_mm256_loadu_ps(xb), abs_mask);
    __m256 bad = _mm256_cmp_ps(m, m, _CMP_UNORD_Q);
    for (int i = 8; i < 32; i += 8) {
        __m256 a = _mm256_and_ps(_mm256_loadu_ps(xb + i), abs_mask);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
        m = _mm256_max_ps(m, a);
    }
    float amax = hmax8(m);
    if (_mm256_movemask_ps(bad) || amax == INFINITY) {
        memset(q, 0, 32 * sizeof *q);
        return NAN;
    }
    __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    for (int i = 0; i < 32; i += 8)
        _mm256_storeu_si256((__m256i *)(q + i), _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i), inv)));
    return amax / 127.0f;
}

/* MatMulQ8's pairs of blocks (q8kernel.h): the two blocks at w and w + 32 as [w 0-15 | w+32 0-15] and [w 16-31 | w+32 16-31]. */
static inline void q8_pair_halves(const uint8_t *w, __m256i *lo, __m256i *hi) {
    __m256i b0 = _mm256_loadu_si256((const __m256i *)w), b1 = _mm256_loadu_si256((const __m256i *)(w + 32));
    *lo = _mm256_permute2x128_si256(b0, b1, 0x20);
    *hi = _mm256_permute2x128_si256(b0, b1, 0x31);
}

#endif
