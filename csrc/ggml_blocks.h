/* GGUF (ggml) weight blocks executed as stored, for edge-runtime's `MatMulGGUF` op (matmul_op.c): the
 * bytes of a GGUF tensor's rows are B, unchanged, and the kernel reads llama.cpp's block formats
 * (docs/guides/gguf-blocks.md has the bit layouts):
 *
 *   type  id  elements  bytes  weight w of code q (d, m, dmin fp16; sc, mn 6-bit; s6 int8)
 *   Q4_0   2     32       18   d * (q - 8)                q 4-bit
 *   Q4_1   3     32       20   d * q + m                  q 4-bit
 *   Q5_0   6     32       22   d * (q - 16)               q 5-bit (4 low bits + 1 in a 32-bit mask)
 *   Q5_1   7     32       24   d * q + m                  q 5-bit
 *   Q8_0   8     32       34   d * q                      q int8
 *   Q4_K  12    256      144   d*sc_j * q - dmin*mn_j     q 4-bit, 8 sub-blocks of 32
 *   Q5_K  13    256      176   d*sc_j * q - dmin*mn_j     q 5-bit, 8 sub-blocks of 32
 *   Q6_K  14    256      210   d*s6_j * (q - 32)          q 6-bit, 16 sub-blocks of 16
 *
 * Activations are quantized per row and block of 32 to int8 (quad.h's quantize_block, as MatMulQ4/Q8),
 * and each 32-block of weights is unpacked to its codes as bytes (ggml_kernel.h's codes) and met with the
 * activation codes in exact integer arithmetic, 8 blocks' sums converted to float together; the codes' offset
 * (8, 16, 128) comes off in integers and the minimum enters through each block's activation code sum
 * (ggml_kernel.h has the arithmetic). A column's float sum is closed every QGEMM_K_CHUNK_PAIRS pairs, where matmul_op.c splits a
 * prompt's K, so every row rounds alike at any row count (kernels.py's exact_rows: any). K is a multiple of the
 * type's block (32 for the legacy types: not necessarily of 64, as the other ops need). */
#ifndef EDGE_GGML_BLOCKS_H
#define EDGE_GGML_BLOCKS_H

#include "qgemm.h"

enum {
    GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
    GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14,
};

/* Elements and bytes of one block of `type`; 0 for a type the kernel does not execute. */
int ggml_block_elements(int64_t type);
int ggml_block_bytes(int64_t type);

/* The implementation for `type` (QImpl's `scales` and `fp16_scales` are unused): AVX-512 VNNI where MatMulQ4's
 * `isa` (EDGE_KERNELS_ISA, or NULL: the fastest) is VNNI or AMX, else AVX2 (ggml_kernel.h: the same integers
 * either way); NULL where the type is not executed or the CPU runs none. With `fp32_compute` the activations stay
 * float and each weight is formed in float32 as gguf-py dequantizes it (the export's accuracy_level 0 twin).
 * In ggml_avx2.c. */
const QImpl *ggml_impl(int64_t type, const char *isa, int fp32_compute);

/* Row `row` (K / block elements' blocks of `type`) as K floats, equal to gguf-py's dequantize bit for bit. */
void ggml_dequantize_row(int64_t type, const uint8_t *row, int64_t K, float *out);
/* Bytes of one row of K elements of `type`. */
static inline int64_t ggml_row_bytes(int64_t type, int64_t K) {
    return K / ggml_block_elements(type) * ggml_block_bytes(type);
}

#endif
