/* y[i] = silu(x[i]) * x[inter + i] for one row x = [gate | up] of 2 * inter floats. */
#ifndef EDGE_SILU_MUL_H
#define EDGE_SILU_MUL_H

#include <stdint.h>

void silu_mul_row(const float *gate_up, int64_t inter, float *y);

#endif
