/* INT4 x INT8 matrix product for edge-runtime's `MatMulQ4` ONNX Runtime op (README: edge-runtime's own kernels).
 *
 * B uses MatMulNBits' layout exactly (4 bits, block 32, symmetric, zero point 8); its fp32 scales are
 * accepted too, so MatMulNBits' own inputs run unchanged (scripts/kernel_bench.py):
 *   B      uint8 [N, K/32, 16]  byte j of a block holds k = 2j (low nibble) and 2j+1 (high nibble)
 *   scales float or float16 [N, K/32]  (fp16 is what exports write: the scales are fp16-representable by
 *                                       construction, and 2 bytes instead of 4 cut the bytes read per
 *                                       weight from 5 to 4.5 bits, which decode streams)
 * Activations are quantized per row and block of 32 to int8 (scale = block max / 127, round to
 * nearest even): the same arithmetic as MatMulNBits at accuracy_level 4.
 */
#ifndef EDGE_Q4GEMM_H
#define EDGE_Q4GEMM_H

#include <stddef.h>
#include <stdint.h>

/* Quantized activations live in tiles of four consecutive rows (r0 % 4 == 0), interleaved per pair of
 * blocks so the kernel reaches all four rows from one pointer at fixed offsets (fewer address ops than
 * four rows' pointers: +11% at M = 128, bit-identical results). Per pair, m * 128 bytes for a tile of m
 * rows (4, or fewer for the last tile):
 *   xq int8  [m][64]  per row [b0 even k | b1 even k | b0 odd k | b1 odd k] (the weights' nibble order)
 *   sx float [m][8]   per row b0's scale x4, b1's scale x4 (the two 128-bit lanes)
 *   c8 int16 [m][16]  per row 8 * the pair sums maddubs forms: the zero point's share, precomputed
 */
#define Q4_TILE_PAIR 512

/* Bytes of scratch M quantized rows of K take (K a multiple of 64). */
size_t q4_scratch_bytes(int64_t K, int64_t M);

/* Quantize `x` [K] as row `r` of M in `scratch` (64-byte aligned); rows may be quantized concurrently. */
void q4_quantize_row(const float *x, int64_t K, int64_t M, void *scratch, int64_t r);

/* y[r][n] for rows [r0, r0 + m) (r0 % 4 == 0, m = min(8, M - r0): one or two tiles) and columns [n0, n1),
 * over the pairs of blocks [p0, p1) of K: stored when p0 == 0, added to y otherwise (K in chunks keeps a
 * prompt's rows in L1 across columns). y points at row r0, stride N. */
void q4_tile(const void *scratch, int64_t r0, int m, const uint8_t *B, const void *scales, int fp16_scales,
             int64_t K, int64_t N, int64_t n0, int64_t n1, int64_t p0, int64_t p1, float *y);

/* Nonzero when this CPU runs the kernel (AVX2, FMA and F16C). */
int q4_cpu_ok(void);

#endif
