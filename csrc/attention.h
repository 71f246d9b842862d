/* Causal attention over a linear KV cache with RoPE, GroupQueryAttention's decode/prefill semantics for
 * edge-runtime's `LinearAttention` op (the ring while it is still linear: row r holds token r). */
#ifndef EDGE_ATTENTION_H
#define EDGE_ATTENTION_H

#include <stdint.h>

typedef struct {
    int64_t T, hq, hkv, d, rot_half, capacity, past; /* rot_half: R/2 columns of the cos/sin cache */
    float scale;
    const float *qkv;                                 /* [T, (hq + 2 hkv) * d] */
    void *keys, *values;                              /* [hkv, capacity, d] rows of kv_type (simd.h), rows
                                                         [past, past + T) written */
    int kv_type;                                      /* KV_F32, KV_F16 or KV_Q8: rows read widened, new ones rounded */
    const float *cos, *sin;                           /* [capacity, rot_half] */
    float *out;                                       /* [T, hq * d] */
    int out_of_memory;                                /* set by a task that could not get its scratch */
} AttnArgs;

/* Rotate token i's key and write it and its value into row past + i. */
void attn_write_kv(const AttnArgs *a, int64_t i);

/* Most tokens one attn_rows call takes: a verification chunk's (the pending token and up to 7 proposals). */
#define ATTN_MAX_ROWS 8

/* Output of query heads [h0, h0 + nh) (of one KV head) for tokens [i0, i0 + n) (n * nh <= ATTN_MAX_ROWS; token i
 * reads cache rows 0..past + i), using `scratch` [n * nh * (d + capacity)] floats. The tokens and heads share each
 * block of keys and values as it is read (a chunk's rows used to read the whole cache once each, and a decode
 * step's heads once each); each token's and head's result is bit for bit what it is alone (n = nh = 1). */
void attn_rows(const AttnArgs *a, int64_t i0, int64_t n, int64_t h0, int64_t nh, float *scratch);

#endif
