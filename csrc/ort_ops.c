/* edge-runtime's ONNX Runtime custom ops (domain ai.edge_runtime; README, "edge-runtime's own kernels").
 *
 * MatMulQ4 and MatMulQ8: matmul_op.c. RingAttention (the full ring's attention): ring_attention_op.c.
 *
 * SiluMul, over silu_mul.h:  X [..., 2I] = gate | up  ─► Y [..., I] = silu(gate) * up
 *
 * LinearAttention, over attention.h: GroupQueryAttention's packed-qkv form (inputs qkv, past_key,
 * past_value, seqlens_k, cos_cache, sin_cache; outputs out, present_key, present_value; attributes
 * num_heads, kv_num_heads, scale), plus the optional per-head norms q_norm, k_norm [D] with attribute
 * qk_norm_epsilon (attn_head_norms, op_common.h). Bound with present_* on past_*'s buffers, it writes only
 * the new rows.
 * The cache (past_*, present_*) is fp32, fp16 or q8 rows (uint8 [1, Hkv, C, 4 + D]: simd.h), the rest
 * fp32.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "op_common.h"
#include "qgemm.h"
#include "rms_norm.h"
#include "silu_mul.h"
#include "simd.h"

const OrtApi *g_api;

/* Element count of `v`; also its dims (when `dims`) and element type (when `type`). */
OrtStatus *element_count(const OrtValue *v, size_t *count, int64_t *dims, size_t *rank, int *type) {
    OrtTensorTypeAndShapeInfo *info = NULL;
    TRY(ORT_GetTensorTypeAndShape(g_api)(v, &info));
    OrtStatus *s = ORT_GetTensorShapeElementCount(g_api)(info, count);
    if (!s && type) s = ORT_GetTensorElementType(g_api)(info, type);
    if (!s && dims) {
        s = ORT_GetDimensionsCount(g_api)(info, rank);
        if (!s && *rank > 8) s = fail(ORT_INVALID_ARGUMENT, "edge-runtime op: an input has more than 8 dimensions");
        if (!s) s = ORT_GetDimensions(g_api)(info, dims, *rank);
    }
    ORT_ReleaseTensorTypeAndShapeInfo(g_api)(info);
    return s;
}

static const char *silu_name(const OrtCustomOp *op) { (void)op; return "SiluMul"; }
static size_t one_io(const OrtCustomOp *op) { (void)op; return 1; }

/* ---- SiluMul ------------------------------------------------------------------------------------ */

static OrtStatus *silu_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **out) {
    (void)op, (void)api, (void)info;
    *out = malloc(1); /* stateless; ORT wants a non-null kernel */
    return *out ? NULL : fail(ORT_FAIL, "SiluMul: out of memory");
}

typedef struct {
    const float *x;
    float *y;
    int64_t inter;
} SiluWork;

static void silu_task(void *data, size_t r) {
    const SiluWork *w = data;
    silu_mul_row(w->x + (int64_t)r * 2 * w->inter, w->inter, w->y + (int64_t)r * w->inter);
}

static OrtStatus *silu_compute(void *kernel, OrtKernelContext *ctx) {
    (void)kernel;
    const OrtValue *x_v;
    TRY(ORT_KernelContext_GetInput(g_api)(ctx, 0, &x_v));
    int64_t dims[8];
    size_t rank = 0, count = 0;
    TRY(element_count(x_v, &count, dims, &rank, NULL));
    if (rank < 1 || dims[rank - 1] % 2 != 0) return fail(ORT_INVALID_ARGUMENT, "SiluMul: X's last dimension is odd");
    SiluWork w = {0};
    w.inter = dims[rank - 1] / 2;
    dims[rank - 1] = w.inter;
    OrtValue *y_v;
    TRY(ORT_KernelContext_GetOutput(g_api)(ctx, 0, dims, rank, &y_v));
    int64_t rows = w.inter ? (int64_t)count / (2 * w.inter) : 0;
    if (rows == 0) return NULL;
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)x_v, (void **)&w.x));
    TRY(ORT_GetTensorMutableData(g_api)(y_v, (void **)&w.y));
    if (rows == 1) {  /* a decode step: a few microseconds, less than waking the pool */
        silu_task(&w, 0);
        return NULL;
    }
    return ORT_KernelContext_ParallelFor(g_api)(ctx, silu_task, (size_t)rows, 0, &w);
}

/* ---- LinearAttention ---------------------------------------------------------------------------- */


static const char *attn_name(const OrtCustomOp *op) { (void)op; return "LinearAttention"; }
static size_t attn_inputs(const OrtCustomOp *op) { (void)op; return 8; }
static int attn_input_kind(const OrtCustomOp *op, size_t i) { /* q_norm, k_norm: optional */
    (void)op;
    return i >= 6 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}
static size_t attn_outputs(const OrtCustomOp *op) { (void)op; return 3; }
static int attn_input_type(const OrtCustomOp *op, size_t i) { (void)op; return i == 3 ? ONNX_INT32 : ONNX_FLOAT; }
static int attn_f16_input_type(const OrtCustomOp *op, size_t i) {
    return i == 1 || i == 2 ? ONNX_FLOAT16 : attn_input_type(op, i); /* the fp16-cache registration */
}
static int attn_q8_input_type(const OrtCustomOp *op, size_t i) {
    return i == 1 || i == 2 ? ONNX_UINT8 : attn_input_type(op, i); /* q8 rows */
}

OrtStatus *attn_heads_create(const OrtKernelInfo *info, const char *op, void **out) {
    char msg[120];
    AttnHeads k = {0, 0, 0.0f, 0.0f};
    TRY(ORT_KernelInfoGetAttribute_int64(g_api)(info, "num_heads", &k.hq));
    TRY(ORT_KernelInfoGetAttribute_int64(g_api)(info, "kv_num_heads", &k.hkv));
    TRY(ORT_KernelInfoGetAttribute_float(g_api)(info, "scale", &k.scale));
    OrtStatus *absent = ORT_KernelInfoGetAttribute_float(g_api)(info, "qk_norm_epsilon", &k.qk_norm_eps);
    if (absent) { /* no head norms: the attribute is only read with q_norm and k_norm */
        ORT_ReleaseStatus(g_api)(absent);
        k.qk_norm_eps = 0.0f;
    }
    if (k.hq <= 0 || k.hkv <= 0 || k.hq % k.hkv != 0) {
        snprintf(msg, sizeof msg, "%s: num_heads must be a positive multiple of kv_num_heads", op);
        return fail(ORT_INVALID_ARGUMENT, msg);
    }
    AttnHeads *p = malloc(sizeof *p);
    if (!p) {
        snprintf(msg, sizeof msg, "%s: out of memory", op);
        return fail(ORT_FAIL, msg);
    }
    *p = k;
    *out = p;
    return NULL;
}

void attn_cache_in_place(void *keys, const void *past_k, void *values, const void *past_v, size_t count, size_t elem,
                         int64_t *copies) {
    if (keys != past_k || values != past_v) __atomic_add_fetch(copies, 1, __ATOMIC_RELAXED);
    if (keys != past_k) memcpy(keys, past_k, count * elem);
    if (values != past_v) memcpy(values, past_v, count * elem);
}

OrtStatus *attn_cache_type(const OrtValue *past_k, const OrtValue *past_v, int *type) {
    int tk = 0, tv = 0;
    size_t n = 0;
    TRY(element_count(past_k, &n, NULL, NULL, &tk));
    TRY(element_count(past_v, &n, NULL, NULL, &tv));
    *type = tk != tv                ? -1
            : tk == ONNX_FLOAT      ? KV_F32
            : tk == ONNX_FLOAT16    ? KV_F16
            : tk == ONNX_UINT8      ? KV_Q8
                                    : -1;
    return NULL;
}

static _Thread_local Grown t_normed; /* attn_head_norms' copy of a call's qkv (the calling thread's) */

OrtStatus *attn_head_norms(const AttnHeads *k, const char *op, const OrtValue *q_norm, const OrtValue *k_norm,
                           int64_t T, int64_t d, const float **qkv) {
    char msg[160];
    if (!q_norm && !k_norm) return NULL;
    size_t qn = 0, kn = 0;
    int qt = 0, kt = 0;
    if (q_norm) TRY(element_count(q_norm, &qn, NULL, NULL, &qt));
    if (k_norm) TRY(element_count(k_norm, &kn, NULL, NULL, &kt));
    if (!q_norm || !k_norm || (int64_t)qn != d || (int64_t)kn != d || qt != ONNX_FLOAT || kt != ONNX_FLOAT) {
        snprintf(msg, sizeof msg, "%s: q_norm and k_norm come together, each float [D]", op);
        return fail(ORT_INVALID_ARGUMENT, msg);
    }
    const float *wq, *wk;
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)q_norm, (void **)&wq));
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)k_norm, (void **)&wk));
    int64_t heads = k->hq + 2 * k->hkv, width = heads * d;
    float *dst = grown(&t_normed, (size_t)(T * width) * sizeof(float));
    if (!dst) {
        snprintf(msg, sizeof msg, "%s: out of memory for the normalized heads", op);
        return fail(ORT_FAIL, msg);
    }
    const float *src = *qkv;
    for (int64_t i = 0; i < T; i++)
        for (int64_t h = 0; h < heads; h++) {
            const float *x = src + i * width + h * d;
            float *y = dst + i * width + h * d;
            if (h >= k->hq + k->hkv) { /* a value head */
                memcpy(y, x, (size_t)d * sizeof(float));
                continue;
            }
            /* SimplifiedLayerNormalization's float arithmetic (rms_norm.h), which the graph ran before */
            rms_norm_row(x, NULL, h < k->hq ? wq : wk, d, k->qk_norm_eps, NULL, y);
        }
    *qkv = dst;
    return NULL;
}

static OrtStatus *attn_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **out) {
    (void)op, (void)api;
    return attn_heads_create(info, "LinearAttention", out);
}

static int64_t g_cache_copies; /* calls that had to copy the cache (present_* not on past_*'s buffers) */

/* For tests (ctypes): how many LinearAttention calls in this process copied a whole cache. */
__attribute__((visibility("default"))) int64_t edge_linear_attention_cache_copies(void) {
    return __atomic_load_n(&g_cache_copies, __ATOMIC_RELAXED);
}

static _Thread_local float *t_scores;
static _Thread_local size_t t_scores_len;

/* Query heads one decode task takes (attn_group_heads); prefill chunks keep one head a task: their tokens share the
 * blocks already. At Gemma 3 270M's shape (4 query heads on 1 KV head of 256, 2,000 cached tokens, fp16; AMD EPYC,
 * 2 threads) the op alone went from 143-149 to 94 us a call with its cache in L2/L3; inside a decode step, where the
 * cache comes from memory after the weights streamed through, from 280 to 255 us a layer (one profile each). */
static int64_t decode_heads(const AttnArgs *a) { return attn_group_heads(a->hq, a->hkv, 1, ATTN_MAX_ROWS); }

static void attn_task(void *data, size_t index) {
    AttnArgs *a = data;
    int64_t nh = a->T == 1 ? decode_heads(a) : 1, tasks_per_block = a->hq / nh;
    int64_t b = (int64_t)index / tasks_per_block, h = (int64_t)index % tasks_per_block * nh, i0 = b * ATTN_MAX_ROWS;
    int64_t n = a->T - i0 < ATTN_MAX_ROWS ? a->T - i0 : ATTN_MAX_ROWS;
    size_t need = (size_t)ATTN_MAX_ROWS * (size_t)(a->d + a->capacity);
    if (need > t_scores_len) { /* grows to the cache capacity once per thread, then never again */
        free(t_scores);
        /* 64-byte aligned: the rotated queries at its start are read 32 bytes at a time, and a load that
         * straddles two cache lines costs two (malloc aligns to 16) */
        t_scores = aligned_alloc(64, (need * sizeof(float) + 63) & ~(size_t)63);
        t_scores_len = t_scores ? need : 0;
        if (!t_scores) {
            __atomic_store_n(&a->out_of_memory, 1, __ATOMIC_RELAXED);
            return;
        }
    }
    attn_rows(a, i0, n, h, nh, t_scores);
}

static OrtStatus *attn_compute(void *kernel, OrtKernelContext *ctx) {
    const OrtValue *in[8];
    for (size_t i = 0; i < 8; i++) TRY(ORT_KernelContext_GetInput(g_api)(ctx, i, &in[i])); /* absent: NULL */
    return linear_attention_run(kernel, ctx, in);
}

OrtStatus *linear_attention_run(const AttnHeads *k, OrtKernelContext *ctx, const OrtValue *const in[8]) {
    int64_t qd[8], kd[8], cd[8];
    size_t qr = 0, kr = 0, cr = 0, qn = 0, kn = 0, cn = 0, sn = 0;
    TRY(element_count(in[0], &qn, qd, &qr, NULL));
    TRY(element_count(in[1], &kn, kd, &kr, NULL));
    TRY(element_count(in[4], &cn, cd, &cr, NULL));
    TRY(element_count(in[3], &sn, NULL, NULL, NULL));
    size_t vn = 0, sin_n = 0;
    TRY(element_count(in[2], &vn, NULL, NULL, NULL));
    TRY(element_count(in[5], &sin_n, NULL, NULL, NULL));
    if (qr != 3 || kr != 4 || cr != 2 || sn != 1 || qd[0] != 1 || kd[0] != 1 || kd[1] != k->hkv || vn != kn ||
        sin_n != cn)
        return fail(ORT_INVALID_ARGUMENT,
                    "LinearAttention: expects qkv [1, T, W], past_key and past_value [1, Hkv, C, D], seqlens_k [1], "
                    "cos_cache and sin_cache of one shape");
    AttnArgs a = {0};
    TRY(attn_cache_type(in[1], in[2], &a.kv_type));
    if (a.kv_type < 0)
        return fail(ORT_INVALID_ARGUMENT, "LinearAttention: past_key and past_value must be of one type");
    a.T = qd[1], a.hq = k->hq, a.hkv = k->hkv, a.capacity = kd[2], a.scale = k->scale;
    a.d = kd[3] - (a.kv_type == KV_Q8 ? 4 : 0); /* a q8 row: its scale, then D codes */
    a.rot_half = cd[1];
    if (qd[2] != (a.hq + 2 * a.hkv) * a.d || a.d % 8 != 0 || a.d > 512 || 2 * a.rot_half > a.d || cd[0] < a.capacity)
        return fail(ORT_INVALID_ARGUMENT, "LinearAttention: qkv width, head size (multiple of 8, <= 512) or cos_cache shape");
    int32_t *seqlens;
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)in[3], (void **)&seqlens));
    a.past = (int64_t)seqlens[0] + 1 - a.T;
    if (a.past < 0 || a.past + a.T > a.capacity)
        return fail(ORT_INVALID_ARGUMENT, "LinearAttention: seqlens_k puts the new rows outside the cache");
    int64_t out_dims[3] = {1, a.T, a.hq * a.d};
    OrtValue *out_v, *pk_v, *pv_v;
    TRY(ORT_KernelContext_GetOutput(g_api)(ctx, 0, out_dims, 3, &out_v));
    TRY(ORT_KernelContext_GetOutput(g_api)(ctx, 1, kd, 4, &pk_v));
    TRY(ORT_KernelContext_GetOutput(g_api)(ctx, 2, kd, 4, &pv_v));
    void *past_k, *past_v;
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)in[0], (void **)&a.qkv));
    TRY(attn_head_norms(k, "LinearAttention", in[6], in[7], a.T, a.d, &a.qkv));
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)in[1], &past_k));
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)in[2], &past_v));
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)in[4], (void **)&a.cos));
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)in[5], (void **)&a.sin));
    TRY(ORT_GetTensorMutableData(g_api)(out_v, (void **)&a.out));
    TRY(ORT_GetTensorMutableData(g_api)(pk_v, &a.keys));
    TRY(ORT_GetTensorMutableData(g_api)(pv_v, &a.values));
    /* The host binds present_* to past_*'s buffers, so only the new rows are written; anywhere else the
     * cache is copied first (correct, but a full copy per call). */
    attn_cache_in_place(a.keys, past_k, a.values, past_v, kn, attn_cache_elem(a.kv_type), &g_cache_copies);
    for (int64_t i = 0; i < a.T; i++) attn_write_kv(&a, i);
    /* a block of tokens per head; a decode step's heads in groups (decode_heads) */
    size_t tasks = (size_t)(a.T == 1 ? a.hq / decode_heads(&a) : ((a.T + ATTN_MAX_ROWS - 1) / ATTN_MAX_ROWS) * a.hq);
    if (a.T == 1 && a.past < 64) { /* a few microseconds of work: less than waking the pool */
        for (size_t t = 0; t < tasks; t++) attn_task(&a, t);
    } else {
        TRY(ORT_KernelContext_ParallelFor(g_api)(ctx, attn_task, tasks, 0, &a));
    }
    if (__atomic_load_n(&a.out_of_memory, __ATOMIC_RELAXED))
        return fail(ORT_FAIL, "LinearAttention: out of memory for the attention scores");
    return NULL;
}

static const OrtCustomOp silu_op =
    EDGE_OP(silu_create, silu_compute, silu_name, one_io, float_type, op_required, one_io, float_type, op_required);
static const OrtCustomOp attn_op = EDGE_OP(attn_create, attn_compute, attn_name, attn_inputs, attn_input_type,
                                           attn_input_kind, attn_outputs, float_type, op_required);
static const OrtCustomOp attn_f16_op = EDGE_OP(attn_create, attn_compute, attn_name, attn_inputs, attn_f16_input_type,
                                               attn_input_kind, attn_outputs, attn_f16_output_type, op_required);
static const OrtCustomOp attn_q8_op = EDGE_OP(attn_create, attn_compute, attn_name, attn_inputs, attn_q8_input_type,
                                              attn_input_kind, attn_outputs, attn_q8_output_type, op_required);
static const OrtCustomOp *const g_ops[] = {
    &edge_matmul_q4_op, &edge_matmul_q8_op, &edge_matmul_gguf_op, &silu_op, &attn_op, &attn_f16_op, &attn_q8_op,
    &edge_ring_attention_op, &edge_ring_attention_f16_op, &edge_ring_attention_q8_op, &edge_gather_gguf_op};

/* The MatMulQ4 implementation sessions created now would run ("avx2", "avx512vnni"), or NULL where
 * EDGE_KERNELS_ISA names one this CPU lacks or the CPU runs none (kernels.isa(), for reports). */
__attribute__((visibility("default"))) const char *EdgeKernelsIsa(void) {
    const QImpl *impl = q4_impl(getenv("EDGE_KERNELS_ISA")); /* MatMulQ8 has the same set */
    return impl ? impl->isa : NULL;
}

/* Nonzero when this CPU runs the implementation named `isa` (kernels.py lists them in errors). */
__attribute__((visibility("default"))) int EdgeKernelsIsaRuns(const char *isa) { return isa && *isa && q4_impl(isa) != NULL; }

/* Called by SessionOptions.register_custom_ops_library for each SessionOptions. */
__attribute__((visibility("default"))) OrtStatus *RegisterCustomOps(OrtSessionOptions *options,
                                                                     const OrtApiBase *base) {
    static OrtCustomOpDomain *domain; /* one per process, shared by every session (ORT does not own it) */
    const OrtApi *api = base->GetApi(EDGE_ORT_API_VERSION);
    if (!api) return NULL; /* older than 1.17: nothing registered, sessions report the missing op */
    g_api = api;
    if (!q4_impl(NULL)) return fail(ORT_FAIL, "edge-runtime's kernels need a CPU with AVX2, FMA and F16C");
    if (!domain) {
        OrtCustomOpDomain *d = NULL;
        TRY(ORT_CreateCustomOpDomain(api)("ai.edge_runtime", &d));
        for (size_t i = 0; i < sizeof g_ops / sizeof g_ops[0]; i++) TRY(ORT_CustomOpDomain_Add(api)(d, g_ops[i]));
        domain = d;
    }
    return ORT_AddCustomOpDomain(api)(options, domain);
}
