/* The gated activations of an MLP's fused gate|up row x = [gate | up] of 2 * inter floats, y [inter]. */
#ifndef EDGE_SILU_MUL_H
#define EDGE_SILU_MUL_H

#include <stdint.h>

/* y[i] = silu(gate[i]) * up[i] */
void silu_mul_row(const float *gate_up, int64_t inter, float *y);

/* y[i] = gelu_tanh(gate[i]) * up[i], rounded as ONNX Runtime's com.microsoft FastGelu followed by Mul round it
 * (Gemma 3's GeGLU; silu_mul_avx2.c says how that was established). */
void gelu_mul_row(const float *gate_up, int64_t inter, float *y);

#endif
