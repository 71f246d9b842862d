/* RMSNorm of one row for MatMulQ4/Q8's rms_norm prologue (matmul_op.c): what ONNX Runtime's
 * (Skip)SimplifiedLayerNormalization computes, in fp32 with 8-lane partial sums. */
#ifndef EDGE_RMS_NORM_H
#define EDGE_RMS_NORM_H

#include <stdint.h>

/* s = x + skip (skip may be NULL: s = x), stored to `sum` when it is not NULL;
 * y = s / sqrt(mean(s^2) + eps) * gamma. K a multiple of 8. */
void rms_norm_row(const float *x, const float *skip, const float *gamma, int64_t K, float eps, float *sum, float *y);

#endif
