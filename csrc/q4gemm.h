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

/* One activation row quantized for the kernel; `nb` blocks of 32 (nb even), in pairs of blocks. */
typedef struct {
    int8_t *xq;  /* [nb/2][64]: per pair [b0 even k | b1 even k | b0 odd k | b1 odd k] */
    float *sx;   /* [nb/2][8]:  b0's scale x4, b1's scale x4 (the two 128-bit lanes) */
    int16_t *c8; /* [nb/2][16]: 8 * the pair sums maddubs forms, the zero point's share, precomputed */
} Q4Row;

/* Bytes of scratch one quantized row of K takes (K a multiple of 64). */
size_t q4_row_bytes(int64_t K);

/* Lay out row `r` of the scratch buffer (64-byte aligned) as a Q4Row. */
Q4Row q4_row_at(void *scratch, int64_t K, int64_t r);

/* Quantize `x` [K] into `row`. */
void q4_quantize_row(const float *x, int64_t K, Q4Row row);

/* y[r][n] for rows [0, m) (m <= 4) and columns [n0, n1): y row stride N. */
void q4_tile(const Q4Row *rows, int m, const uint8_t *B, const void *scales, int fp16_scales, int64_t K, int64_t N,
             int64_t n0, int64_t n1, float *y);

/* Nonzero when this CPU runs the kernel (AVX2, FMA and F16C). */
int q4_cpu_ok(void);

#endif
