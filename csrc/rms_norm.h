/* RMSNorm of one row for MatMulQ4/Q8/GGUF's rms_norm prologue and out_norm epilogue (matmul_op.c) and the
 * attention ops' head norms (ort_ops.c): what ONNX Runtime's SimplifiedLayerNormalization computes for float
 * rows, in fp32 with 8-lane partial sums by FMA added as hsum8 adds them, then (s * (1 / sqrt(mean + eps))) *
 * gamma: equal to ONNX Runtime 1.32's output bit for bit on 3,000 random rows each of 256, 640 and 1,152
 * (AMD EPYC, AVX-512; docs/decisions/folds-with-onnxruntime-rounding.md). */
#ifndef EDGE_RMS_NORM_H
#define EDGE_RMS_NORM_H

#include <stdint.h>

/* s = x + skip (skip may be NULL: s = x), stored to `sum` when it is not NULL;
 * y = s / sqrt(mean(s^2) + eps) * gamma. K a multiple of 8. */
void rms_norm_row(const float *x, const float *skip, const float *gamma, int64_t K, float eps, float *sum, float *y);

#endif
