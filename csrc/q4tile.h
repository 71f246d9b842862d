/* The AVX2 kernel's quantized-activation layout and the helpers both kernel implementations share (the
 * VNNI kernel keeps each pair's xq in this order inside its own layout, q4gemm_vnni.c). */
#ifndef EDGE_Q4TILE_H
#define EDGE_Q4TILE_H

#include <immintrin.h>
#include <string.h>

#include "q4gemm.h"
#include "quad.h" /* quantize_block */

/* Quantized activations live in tiles of four consecutive rows (r0 % 4 == 0), interleaved per pair of
 * blocks so the kernel reaches all four rows from one pointer at fixed offsets (fewer address ops than
 * four rows' pointers: +11% at M = 128, bit-identical results). Per pair, m * 128 bytes for a tile of m
 * rows (4, or fewer for the last tile):
 *   xq int8  [m][64]  per row [b0 even k | b1 even k | b0 odd k | b1 odd k] (the weights' nibble order)
 *   sx float [m][8]   per row b0's scale x4, b1's scale x4 (the two 128-bit lanes)
 *   c int16  [m][16]  per row 8 * the pair sums maddubs forms: the zero point's share, precomputed
 */
#define Q4_TILE_PAIR 512

/* A tile of `m` rows (4, or fewer for the last) packs each pair into m * 128 bytes: at decode (m = 1) one
 * row's pair is two cache lines, as compact as a plain row. */
#define TILE_XQ(t, m, lane) ((int8_t *)(t) + (lane) * 64)
#define TILE_SX(t, m, lane) ((float *)((char *)(t) + (m) * 64 + (lane) * 32))
#define TILE_C(t, m, lane) ((int16_t *)((char *)(t) + (m) * 96 + (lane) * 32))

static inline char *tile_at(const void *scratch, int64_t K, int64_t r) {
    return (char *)scratch + (size_t)(r / 4 * (K / 64)) * Q4_TILE_PAIR;
}

/* [s_b0 x4 | s_b1 x4] (the two 128-bit lanes) from the pair's two consecutive block scales. */
static inline __m256 pair_scales_f32(const void *sn, int64_t p, __m256i lanes) {
    const float *s = (const float *)sn + 2 * p;
    return _mm256_permutevar8x32_ps(_mm256_castpd_ps(_mm256_broadcast_sd((const double *)s)), lanes);
}

static inline __m256 pair_scales_f16(const void *sn, int64_t p, __m256i lanes) {
    int32_t two;
    memcpy(&two, (const uint16_t *)sn + 2 * p, sizeof two);
    __m128 s = _mm_cvtph_ps(_mm_cvtsi32_si128(two)); /* [s0, s1, 0, 0] */
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s), lanes);
}

#endif
