/* RingAttention, over ring_attention.h: the full ring's attention in one node (exporters/blocks_ort.py).
 *
 *   inputs:  qkv [1, T, (Hq + 2 Hkv) * D], past_key, past_value [1, Hkv, C, D], write_index [1] int64,
 *            cos, sin, cos_sink, sin_sink [T, R/2], sink_rows [1] int64, attn_mask [T, C] (or [1, 1, T, C]),
 *            row_cache [B] int64 (optional; B = T, or empty),
 *            ring_full [] bool, seqlens_k [1] int32, cos_cache, sin_cache [C, R/2] (optional, together),
 *            q_norm, k_norm [D] (optional, together: per-head RMS norms before RoPE, attn_head_norms)
 *   outputs: out [1, T, Hq * D], present_key, present_value [1, Hkv, C, D]
 *   attributes: num_heads, kv_num_heads, scale, qk_norm_epsilon (with q_norm and k_norm)
 *
 * With ring_full given and false the ring is still linear (row r holds token r) and the node computes what
 * LinearAttention computes from qkv, past_*, seqlens_k and the rotary cache (the ring inputs unread): one
 * attention node a layer at every fill, so the graph holds each layer once instead of twice inside an If on
 * ring_full (docs/decisions/ring-attention-by-fill.md).
 *
 * With row_cache of T values the call is a batch: row i is one token of cache row_cache[i], past_* hold every
 * cache of the batch [caches, Hkv, C, D] and write_index gives each row's buffer row [T] (edge-serve's batched
 * decode: one row per sequence). Each row's result is then what it would be alone on its own cache.
 *   past_* and present_* are fp32, fp16 or q8 rows (one type; simd.h), the rest fp32.
 *
 * Every new key (rotated at its absolute position) and value is written at rows write_index.. first, then
 * each (row, head) attends the whole buffer under its mask row, so a row's result depends on the cache and
 * its own inputs only, never on how many rows share the call. Bound with present_* on past_*'s buffers, it
 * writes only the new rows. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "op_common.h"
#include "ring_attention.h"
#include "simd.h"

enum { IN_QKV, IN_PAST_K, IN_PAST_V, IN_WRITE, IN_COS, IN_SIN, IN_COS_SINK, IN_SIN_SINK, IN_SINKS, IN_MASK, IN_ROW_CACHE,
       IN_RING_FULL, IN_SEQLENS, IN_COS_CACHE, IN_SIN_CACHE, IN_Q_NORM, IN_K_NORM, N_IN };
enum { N_REQUIRED = IN_ROW_CACHE };


static const char *ring_name(const OrtCustomOp *op) { (void)op; return "RingAttention"; }
static size_t ring_inputs(const OrtCustomOp *op) { (void)op; return N_IN; }
static size_t ring_outputs(const OrtCustomOp *op) { (void)op; return 3; }
static int ring_input_type(const OrtCustomOp *op, size_t i) {
    (void)op;
    return i == IN_WRITE || i == IN_SINKS || i == IN_ROW_CACHE ? ONNX_INT64
           : i == IN_RING_FULL                                  ? ONNX_BOOL
           : i == IN_SEQLENS                                    ? ONNX_INT32
                                                                : ONNX_FLOAT;
}
static int ring_input_kind(const OrtCustomOp *op, size_t i) {
    (void)op;
    return i >= IN_ROW_CACHE ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}
static int ring_f16_input_type(const OrtCustomOp *op, size_t i) {
    return i == IN_PAST_K || i == IN_PAST_V ? ONNX_FLOAT16 : ring_input_type(op, i); /* op_common.h says why */
}
static int ring_q8_input_type(const OrtCustomOp *op, size_t i) {
    return i == IN_PAST_K || i == IN_PAST_V ? ONNX_UINT8 : ring_input_type(op, i);
}

static OrtStatus *ring_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **out) {
    (void)op, (void)api;
    return attn_heads_create(info, "RingAttention", out);
}

static int64_t g_cache_copies; /* calls that had to copy the cache (present_* not on past_*'s buffers) */

/* For tests (ctypes): how many RingAttention calls in this process copied a whole cache. */
__attribute__((visibility("default"))) int64_t edge_ring_attention_cache_copies(void) {
    return __atomic_load_n(&g_cache_copies, __ATOMIC_RELAXED);
}

/* Per-thread scratch: a row's scores and its unmasked columns, [capacity] each; the columns are of row t_row of
 * call t_call. Tasks run (row, head) in order and each thread takes a run of them, so a thread scans a row's mask
 * once for its heads. At short fills a scan per head cost more than the attention: 4 rows x 9 heads over 65 of
 * 2,111 columns, 44 us a call scanning per head against 20-25 us per row (AMD EPYC, 2 threads). */
static _Thread_local Grown t_scratch;
static _Thread_local int64_t t_call = -1, t_row = -1, t_n, t_n_sink;
static int64_t g_calls;

/* Query heads one task takes (attn_group_heads): a token's keys and values read once for them. */
static int64_t ring_heads(const RingArgs *a) { return attn_group_heads(a->hq, a->hkv, a->T == 1, RING_MAX_HEADS); }

static void ring_task(void *data, size_t index) {
    RingArgs *a = data;
    int64_t nh = ring_heads(a), groups = a->hq / nh;
    int64_t i = (int64_t)index / groups, h = (int64_t)index % groups * nh;
    size_t cap = (size_t)a->capacity, bytes = cap * ((size_t)nh * sizeof(float) + sizeof(int32_t));
    if (bytes > t_scratch.capacity) t_call = -1; /* regrown: the columns kept are gone */
    float *scores = grown(&t_scratch, bytes);
    if (!scores) {
        __atomic_store_n(&a->out_of_memory, 1, __ATOMIC_RELAXED);
        return;
    }
    int32_t *cols = (int32_t *)(scores + (size_t)nh * cap);
    if (t_call != a->call || t_row != i) {
        t_n = ring_columns(a, i, cols, &t_n_sink);
        t_call = a->call, t_row = i;
    }
    ring_head(a, i, h, nh, scores, cols, t_n, t_n_sink);
}

static int same_dims(const int64_t *a, const int64_t *b, size_t rank) {
    for (size_t i = 0; i < rank; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

static OrtStatus *ring_compute(void *kernel, OrtKernelContext *ctx) {
    const AttnHeads *k = kernel;
    const OrtValue *in[N_IN];
    for (size_t i = 0; i < N_IN; i++) TRY(ORT_KernelContext_GetInput(g_api)(ctx, i, &in[i])); /* absent: NULL */
    if (in[IN_RING_FULL]) { /* the linear mode's inputs: while ring_full is false, LinearAttention's computation */
        size_t n = 0;
        TRY(element_count(in[IN_RING_FULL], &n, NULL, NULL, NULL));
        if (n != 1 || !in[IN_SEQLENS] || !in[IN_COS_CACHE] || !in[IN_SIN_CACHE])
            return fail(ORT_INVALID_ARGUMENT, "RingAttention: ring_full must hold one value and come with seqlens_k, "
                                              "cos_cache and sin_cache");
        const bool *full;
        TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)in[IN_RING_FULL], (void **)&full));
        if (!*full) {
            if (in[IN_ROW_CACHE]) {
                size_t rows = 0;
                TRY(element_count(in[IN_ROW_CACHE], &rows, NULL, NULL, NULL));
                if (rows) return fail(ORT_INVALID_ARGUMENT, "RingAttention: a batch (row_cache) needs ring_full on");
            }
            const OrtValue *lin[8] = {in[IN_QKV],       in[IN_PAST_K],    in[IN_PAST_V], in[IN_SEQLENS],
                                      in[IN_COS_CACHE], in[IN_SIN_CACHE], in[IN_Q_NORM], in[IN_K_NORM]};
            return linear_attention_run(k, ctx, lin);
        }
    }
    int64_t dims[N_IN][8];
    size_t rank[N_IN], count[N_IN];
    count[IN_ROW_CACHE] = 0; /* absent: one cache */
    for (size_t i = 0; i < N_IN; i++)
        if (i < N_REQUIRED || in[i]) TRY(element_count(in[i], &count[i], dims[i], &rank[i], NULL));
    const int64_t *qd = dims[IN_QKV], *kd = dims[IN_PAST_K], *cd = dims[IN_COS], *md = dims[IN_MASK];
    int batch = count[IN_ROW_CACHE] > 0;
    if (rank[IN_QKV] != 3 || qd[0] != 1 || rank[IN_PAST_K] != 4 || kd[0] < 1 || (!batch && kd[0] != 1) ||
        kd[1] != k->hkv || rank[IN_PAST_V] != 4 || !same_dims(kd, dims[IN_PAST_V], 4))
        return fail(ORT_INVALID_ARGUMENT,
                    "RingAttention: expects qkv [1, T, W] and past_key, past_value of one shape [1, kv_num_heads, C, D] "
                    "([caches, kv_num_heads, C, D] with row_cache)");
    RingArgs a = {0};
    TRY(attn_cache_type(in[IN_PAST_K], in[IN_PAST_V], &a.kv_type));
    if (a.kv_type < 0)
        return fail(ORT_INVALID_ARGUMENT, "RingAttention: past_key and past_value must be of one type");
    a.T = qd[1], a.hq = k->hq, a.hkv = k->hkv, a.capacity = kd[2], a.scale = k->scale;
    a.d = kd[3] - (a.kv_type == KV_Q8 ? 4 : 0); /* a q8 row: its scale, then D codes */
    if (qd[2] != (a.hq + 2 * a.hkv) * a.d || a.d % 8 != 0 || a.d > 512)
        return fail(ORT_INVALID_ARGUMENT, "RingAttention: qkv width is not (num_heads + 2 kv_num_heads) * D, or D "
                                          "is not a multiple of 8 up to 512");
    int trig_ok = rank[IN_COS] == 2 && cd[0] == a.T && 2 * cd[1] <= a.d;
    for (size_t i = IN_SIN; i <= IN_SIN_SINK; i++) trig_ok = trig_ok && rank[i] == 2 && same_dims(cd, dims[i], 2);
    if (!trig_ok)
        return fail(ORT_INVALID_ARGUMENT, "RingAttention: cos, sin, cos_sink and sin_sink must all be [T, R/2] with "
                                          "R <= D");
    a.rot_half = cd[1];
    size_t mr = rank[IN_MASK];
    if (!((mr == 2 || (mr == 4 && md[0] == 1 && md[1] == 1)) && md[mr - 2] == a.T && md[mr - 1] == a.capacity))
        return fail(ORT_INVALID_ARGUMENT, "RingAttention: attn_mask must be [T, C] or [1, 1, T, C]");
    if (count[IN_SINKS] != 1 || (batch ? (int64_t)count[IN_WRITE] != a.T || (int64_t)count[IN_ROW_CACHE] != a.T
                                       : count[IN_WRITE] != 1))
        return fail(ORT_INVALID_ARGUMENT, "RingAttention: sink_rows must hold one value, and write_index one (T "
                                          "with row_cache, which then holds T)");
    int64_t *write_index, *sink_rows;
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)in[IN_WRITE], (void **)&write_index));
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)in[IN_SINKS], (void **)&sink_rows));
    a.write_index = write_index[0], a.sinks = sink_rows[0];
    if (batch) {
        int64_t *row_cache;
        TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)in[IN_ROW_CACHE], (void **)&row_cache));
        for (int64_t i = 0; i < a.T; i++) {
            if (row_cache[i] < 0 || row_cache[i] >= kd[0] || write_index[i] < 0 || write_index[i] >= a.capacity)
                return fail(ORT_INVALID_ARGUMENT, "RingAttention: a row's cache or write row is outside the batch");
            for (int64_t j = 0; j < i; j++) /* two rows writing one buffer row would race */
                if (row_cache[j] == row_cache[i] && write_index[j] == write_index[i])
                    return fail(ORT_INVALID_ARGUMENT, "RingAttention: two rows write one buffer row");
        }
        a.row_cache = row_cache, a.row_write = write_index;
    } else if (a.write_index < 0 || a.write_index > a.capacity - a.T)
        return fail(ORT_INVALID_ARGUMENT, "RingAttention: write_index puts the new rows outside the cache");
    if (a.sinks < 0 || a.sinks > a.capacity)
        return fail(ORT_INVALID_ARGUMENT, "RingAttention: sink_rows is outside the cache");
    int64_t out_dims[3] = {1, a.T, a.hq * a.d};
    OrtValue *out_v, *pk_v, *pv_v;
    TRY(ORT_KernelContext_GetOutput(g_api)(ctx, 0, out_dims, 3, &out_v));
    TRY(ORT_KernelContext_GetOutput(g_api)(ctx, 1, kd, 4, &pk_v));
    TRY(ORT_KernelContext_GetOutput(g_api)(ctx, 2, kd, 4, &pv_v));
    void *past_k, *past_v;
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)in[IN_QKV], (void **)&a.qkv));
    TRY(attn_head_norms(k, "RingAttention", in[IN_Q_NORM], in[IN_K_NORM], a.T, a.d, &a.qkv));
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)in[IN_PAST_K], &past_k));
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)in[IN_PAST_V], &past_v));
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)in[IN_COS], (void **)&a.cos));
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)in[IN_SIN], (void **)&a.sin));
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)in[IN_COS_SINK], (void **)&a.cos_sink));
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)in[IN_SIN_SINK], (void **)&a.sin_sink));
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)in[IN_MASK], (void **)&a.mask));
    TRY(ORT_GetTensorMutableData(g_api)(out_v, (void **)&a.out));
    TRY(ORT_GetTensorMutableData(g_api)(pk_v, &a.keys));
    TRY(ORT_GetTensorMutableData(g_api)(pv_v, &a.values));
    /* The host binds present_* to past_*'s buffers, so only the new rows are written; anywhere else the
     * cache is copied first (correct, but a full copy per call). */
    attn_cache_in_place(a.keys, past_k, a.values, past_v, count[IN_PAST_K], attn_cache_elem(a.kv_type),
                        &g_cache_copies);
    for (int64_t i = 0; i < a.T; i++) ring_write_kv(&a, i);
    a.call = __atomic_add_fetch(&g_calls, 1, __ATOMIC_RELAXED);
    size_t tasks = (size_t)(a.T * (a.hq / ring_heads(&a)));
    if (tasks == 0) return NULL;
    if (a.T == 1 && a.capacity < 64) { /* a few microseconds of work: less than waking the pool */
        for (size_t t = 0; t < tasks; t++) ring_task(&a, t);
    } else {
        TRY(ORT_KernelContext_ParallelFor(g_api)(ctx, ring_task, tasks, 0, &a));
    }
    if (__atomic_load_n(&a.out_of_memory, __ATOMIC_RELAXED))
        return fail(ORT_FAIL, "RingAttention: out of memory for the attention scores");
    return NULL;
}

const OrtCustomOp edge_ring_attention_op = EDGE_OP(ring_create, ring_compute, ring_name, ring_inputs, ring_input_type,
                                                   ring_input_kind, ring_outputs, float_type, op_required);
const OrtCustomOp edge_ring_attention_f16_op = EDGE_OP(ring_create, ring_compute, ring_name, ring_inputs,
                                                       ring_f16_input_type, ring_input_kind, ring_outputs,
                                                       attn_f16_output_type, op_required);
const OrtCustomOp edge_ring_attention_q8_op = EDGE_OP(ring_create, ring_compute, ring_name, ring_inputs,
                                                      ring_q8_input_type, ring_input_kind, ring_outputs,
                                                      attn_q8_output_type, op_required);
