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

/* Output of query head `h` of token `i` (rows 0..past + i), using `scores` [past + i + 1] as scratch. */
void attn_head(const AttnArgs *a, int64_t i, int64_t h, float *scores);

#endif
