/* Attention over the StreamingLLM ring (edge_runtime/ring.py) for edge-runtime's `RingAttention` op: any
 * fill, wrapped rows, sinks and the window given by an additive mask, the sink columns seeing the query
 * rotated at its cache-logical position. */
#ifndef EDGE_RING_ATTENTION_H
#define EDGE_RING_ATTENTION_H

#include <stdint.h>

/* A mask entry at or below this skips its column: it would contribute exactly 0 (ring.MASKED is -1e30). */
#define RING_MASKED_BELOW (-1e29f)

typedef struct {
    int64_t T, hq, hkv, d, rot_half, capacity;
    int64_t write_index;                      /* buffer row of token 0 of the call; rows never wrap inside it */
    /* A batch of caches (edge-serve's batched decode): row i is a token of cache row_cache[i] of the batch,
     * written at its buffer row row_write[i]. NULL: every row is of cache 0, written at write_index + i. */
    const int64_t *row_cache, *row_write;
    int64_t sinks;                            /* columns [0, sinks) take the sink-rotated query */
    float scale;
    const float *qkv;                         /* [T, (hq + 2 hkv) * d] */
    void *keys, *values;                      /* [caches, hkv, capacity, d] rows of kv_type (simd.h) */
    int kv_type;                              /* KV_F32, KV_F16 or KV_Q8: rows read widened, new ones rounded */
    const float *cos, *sin;                   /* [T, rot_half] at each row's absolute position */
    const float *cos_sink, *sin_sink;         /* [T, rot_half] at its cache-logical position */
    const float *mask;                        /* [T, capacity] additive */
    int64_t call;                             /* this call's number: a thread's columns of row i are its own */
    float *out;                               /* [T, hq * d] */
    int out_of_memory;                        /* set by a task that could not get its scratch */
} RingArgs;

/* The first row of token i's cache in keys/values: its cache's offset in rows. */
static inline int64_t ring_cache_rows(const RingArgs *a, int64_t i) {
    return a->row_cache ? a->row_cache[i] * a->hkv * a->capacity : 0;
}

/* Rotate token i's key at its absolute position and write it and its value into row write_index + i
 * (row_write[i] of cache row_cache[i] in a batch). */
void ring_write_kv(const RingArgs *a, int64_t i);

/* Token i's unmasked buffer rows, in order, into `cols` [capacity]: returns their count, and in *n_sink how many
 * of them are sink rows (the first). One scan of the mask row serves all of the token's heads. */
int64_t ring_columns(const RingArgs *a, int64_t i, int32_t *cols, int64_t *n_sink);

/* Most query heads one ring_head call takes (they share a KV head). */
#define RING_MAX_HEADS 4

/* Output of query heads [h0, h0 + nh) of token `i` (nh <= RING_MAX_HEADS, all on one KV head) over its n unmasked
 * buffer rows `cols` (ring_columns), using `scores` [nh * capacity] as scratch: each head's result bit for bit
 * what it is alone (nh = 1), the heads sharing each block of keys and values. Reads nothing of the other tokens of
 * the call but the rows the mask shows. */
void ring_head(const RingArgs *a, int64_t i, int64_t h0, int64_t nh, float *scores, const int32_t *cols, int64_t n,
               int64_t n_sink);

#endif
