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

#include "qgemm.h" /* QImpl, q4_impl */

#endif
