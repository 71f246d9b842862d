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

/* One implementation of the kernel (q4gemm_avx2.c, q4gemm_vnni.c): quantize and tile share its own scratch
 * layout, so they are always used as a pair. */
typedef struct {
    const char *isa; /* "avx2" or "avx512vnni": what EDGE_KERNELS_ISA names and edge_kernels_isa() reports */
    int rows;        /* most rows one `tile` call takes (a multiple of 4) */

    /* Bytes of scratch M quantized rows of K take (K a multiple of 64). */
    size_t (*scratch_bytes)(int64_t K, int64_t M);

    /* Quantize `x` [K] as row `r` of M in `scratch` (64-byte aligned, scratch_bytes(K, M)); rows may
     * be quantized concurrently. */
    void (*quantize_row)(const float *x, int64_t K, int64_t M, void *scratch, int64_t r);

    /* y[r][n] for rows [r0, r0 + m) (r0 % rows == 0, m = min(rows, M - r0)) and columns [n0, n1), over
     * the pairs of blocks [p0, p1) of K: stored when p0 == 0, added to y otherwise (K in chunks keeps a
     * prompt's rows in L1 across columns). y points at row r0, stride N. */
    void (*tile)(const void *scratch, int64_t r0, int m, const uint8_t *B, const void *scales, int fp16_scales,
                 int64_t K, int64_t N, int64_t n0, int64_t n1, int64_t p0, int64_t p1, float *y);
} Q4Impl;

/* The implementation named `isa` ("avx2", "avx512vnni"), or the fastest this CPU runs when `isa` is NULL
 * or empty; NULL when this CPU cannot run the one asked for (AVX2, FMA and F16C at least; AVX-512 F, BW,
 * VL and VNNI for avx512vnni). In q4gemm.c. */
const Q4Impl *q4_impl(const char *isa);

#endif
