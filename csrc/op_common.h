/* What edge-runtime's ONNX Runtime ops share (ort_ops.c registers them; matmul_op.c holds MatMulQ4/Q8/GGUF,
 * ring_attention_op.c RingAttention): the API table, status helpers, per-thread growing buffers and the op
 * description boilerplate. */
#ifndef EDGE_OP_COMMON_H
#define EDGE_OP_COMMON_H

#include <stdlib.h>

#include "ort_abi.h"

extern const OrtApi *g_api; /* set by RegisterCustomOps before any op runs */

static inline OrtStatus *fail(int code, const char *msg) { return ORT_CreateStatus(g_api)(code, msg); }

#define TRY(call)                       \
    do {                                \
        OrtStatus *status_ = (call);    \
        if (status_) return status_;    \
    } while (0)

/* Element count of `v`; also its dims (when `dims`, at most 8) and element type (when `type`). In ort_ops.c. */
OrtStatus *element_count(const OrtValue *v, size_t *count, int64_t *dims, size_t *rank, int *type);

/* Per-thread buffers that only grow: no allocation per token. */
typedef struct {
    void *data;
    size_t capacity;
} Grown;

static inline void *grown(Grown *g, size_t bytes) {
    if (bytes > g->capacity) {
        free(g->data);
        size_t cap = (bytes + 63) / 64 * 64;
        g->data = aligned_alloc(64, cap);
        g->capacity = g->data ? cap : 0;
    }
    return g->data;
}

/* ---- op description ---------------------------------------------------------------------------- */

static inline int float_type(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return ONNX_FLOAT; }
static inline const char *op_ep(const OrtCustomOp *op) { (void)op; return NULL; } /* CPU */
static inline int op_required(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return INPUT_OUTPUT_REQUIRED; }
static inline int op_mem_default(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return ORT_MEM_TYPE_DEFAULT; }
static inline int op_one(const OrtCustomOp *op) { (void)op; return 1; }
static inline void kernel_destroy(void *k) { free(k); }

#define EDGE_OP(create, compute, name, n_inputs, input_type, input_kind, n_outputs, output_type, output_kind) \
    {                                                                                                 \
        .version = EDGE_CUSTOM_OP_VERSION, .GetName = name, .GetExecutionProviderType = op_ep,        \
        .GetInputType = input_type, .GetInputTypeCount = n_inputs, .GetOutputType = output_type,      \
        .GetOutputTypeCount = n_outputs, .KernelDestroy = kernel_destroy,                             \
        .GetInputCharacteristic = input_kind, .GetOutputCharacteristic = output_kind,                 \
        .GetInputMemoryType = op_mem_default, .GetVariadicInputMinArity = op_one,                     \
        .GetVariadicInputHomogeneity = op_one, .GetVariadicOutputMinArity = op_one,                   \
        .GetVariadicOutputHomogeneity = op_one, .CreateKernelV2 = create, .KernelComputeV2 = compute, \
    }

/* ---- what the two attention ops share (ort_ops.c) ----------------------------------------------- */

/* The attributes both take: num_heads, kv_num_heads (a divisor of it), scale, and qk_norm_epsilon (optional: the
 * epsilon of the per-head RMS norms given as the q_norm and k_norm inputs). */
typedef struct {
    int64_t hq, hkv;
    float scale, qk_norm_eps;
} AttnHeads;

/* Read them into a new AttnHeads at *out (freed by kernel_destroy); `op` names the op in errors. */
OrtStatus *attn_heads_create(const OrtKernelInfo *info, const char *op, void **out);

/* present_* bound on past_*'s buffers (what the host does) need nothing; anywhere else the cache (`count`
 * elements of `elem` bytes) is copied first (correct, but a whole cache per call) and `*copies` counts it. */
void attn_cache_in_place(void *keys, const void *past_k, void *values, const void *past_v, size_t count, size_t elem,
                         int64_t *copies);

/* Each attention op is registered once per cache type under its name: fp32, fp16 and q8 rows (uint8
 * [1, Hkv, C, 4 + D], simd.h) for past_key, past_value, present_key and present_value, the rest fp32 in
 * all three. ONNX Runtime picks the registration by the graph's input types and infers present_*'s type
 * from it, which a dynamically typed cache (two inputs) would need a shape-inference function for. One
 * compute serves all three. */
static inline int attn_f16_output_type(const OrtCustomOp *op, size_t i) {
    (void)op;
    return i == 0 ? ONNX_FLOAT : ONNX_FLOAT16;
}
static inline int attn_q8_output_type(const OrtCustomOp *op, size_t i) {
    (void)op;
    return i == 0 ? ONNX_FLOAT : ONNX_UINT8;
}

/* The cache type (simd.h KV_F32, KV_F16, KV_Q8) of past_key and past_value; -1 for mixed or other types. */
OrtStatus *attn_cache_type(const OrtValue *past_k, const OrtValue *past_v, int *type);

/* LinearAttention's computation (ort_ops.c) on its inputs qkv, past_key, past_value, seqlens_k, cos_cache,
 * sin_cache, q_norm, k_norm (the last two NULL when absent), into the node's outputs 0-2: RingAttention runs it
 * while its ring_full input is false. */
OrtStatus *linear_attention_run(const AttnHeads *k, OrtKernelContext *ctx, const OrtValue *const in[8]);

/* Qwen3's and Gemma 3's per-head RMS norms, before RoPE: with q_norm and k_norm ([D] each) given, *qkv (the op's
 * [T, (hq + 2 hkv) * D] input) is pointed at a per-thread copy whose query and key heads are RMS-normalized
 * (the values copied as they are) with the arithmetic ONNX Runtime's SimplifiedLayerNormalization uses for them
 * on the CPUs measured (rms_norm.h), so a graph that folds those nodes into its attention op computes what it did
 * with them. Neither given: *qkv is left as it is. `op` names the op in errors. */
OrtStatus *attn_head_norms(const AttnHeads *k, const char *op, const OrtValue *q_norm, const OrtValue *k_norm,
                           int64_t T, int64_t d, const float **qkv);

/* Bytes of one cache element as ONNX Runtime counts them (a q8 row is 4 + D uint8). */
static inline size_t attn_cache_elem(int type) { return type == 0 ? 4 : type == 1 ? 2 : 1; }

/* Query heads one attention task takes for one token: its KV head's group of hq / hkv, so that the token's keys
 * and values are read once rather than once a query head; halved where a lone token on one KV head would leave the
 * second thread idle (`one_token`); at most `most`, and a divisor of the group. LinearAttention's decode and
 * RingAttention (attention.h, ring_attention.h) share the rule. */
static inline int64_t attn_group_heads(int64_t hq, int64_t hkv, int one_token, int64_t most) {
    int64_t g = hq / hkv, per = one_token && hkv < 2 && g % 2 == 0 ? g / 2 : g;
    while (per > most || g % per) per--;
    return per;
}

/* In matmul_op.c. */
extern const OrtCustomOp edge_matmul_q4_op, edge_matmul_q8_op, edge_matmul_gguf_op;
/* In ring_attention_op.c. */
extern const OrtCustomOp edge_ring_attention_op, edge_ring_attention_f16_op, edge_ring_attention_q8_op;
extern const OrtCustomOp edge_gather_gguf_op; /* gather_gguf_op.c */

#endif
