/* INT8 x INT8 matrix product for edge-runtime's `MatMulQ8` ONNX Runtime op (README: edge-runtime's own kernels).
 *
 *   B      uint8 [N, K] (any shape of N x K bytes: MatMulNBits' 8-bit [N, K/blk, blk] is the same bytes)
 *          codes + 128, symmetric (zero point 128), one scale per output channel
 *   scales float [N]
 * Activations are quantized per row and block of 32 to int8 (scale = block max / 127, round to nearest
 * even), as MatMulQ4 does; MatMulNBits at accuracy_level 4 uses its (larger) block instead, so results
 * differ from it by that quantization, not by the weights:
 *   y[n] = scales[n] * sum_b sx_b * sum_{k in b} (B[n, k] - 128) * xq_k
 * The per-channel weight scale leaves the loop: per block, only the activation scale multiplies the exact
 * int32 dot product. Implementations: q8gemm_avx2.c, q8gemm_vnni.c (both through q8kernel.h).
 * With the attribute fp32_compute=1 the activations are not quantized (q8fp32_avx2.c, q8_fp32 below).
 */
#ifndef EDGE_Q8GEMM_H
#define EDGE_Q8GEMM_H

#include "qgemm.h" /* QImpl, q8_impl */

extern const QImpl q8_fp32; /* float activations, each code widened to float: MatMulNBits' accuracy_level 0 */

#endif
