/* edge-runtime's MatMulQ4 and MatMulQ8 ONNX Runtime ops (README, "edge-runtime's own kernels").
 *
 * MatMulQ4, over q4gemm.h:
 *   A [..., K] float ─┐
 *   B [N, K/32, 16] u8 ├─► quantize A per row/block to int8 ─► q4_tile over column chunks ─► Y [..., N]
 *   scales [N, K/32]  ─┘   (rows in parallel when M > 1)       (ONNX Runtime's intra-op pool)
 *
 * Attributes K, N as MatMulNBits'; bits 4, block 32 and zero point 8 are fixed. scales are float16 (what
 * exports write) or float (MatMulNBits' own input), checked when the op runs. An optional second output,
 * argmax int64 [..., 1], is each row's first largest column (numpy.argmax's answer, a NaN counting as
 * largest): each task scans the columns it just wrote, so greedy decoding never reads the logits back
 * from the other core's cache (55-69 us a 135M step from Python, 1% of the step).
 *
 * MatMulQ8, over q8gemm.h: the same, with B N x K bytes (codes + 128) and scales float [N], one per
 * output channel (edge-runtime's INT8 weights); the same attributes and optional argmax output.
 *
 * MatMulQ8 takes fp32_compute (0 or 1): with 1 the activations stay float (q8fp32_avx2.c), the arithmetic of
 * MatMulNBits at accuracy_level 0 over the same bytes; the export's fp32 twin of INT8 graphs runs it.
 *
 * Both take an optional attribute silu_mul (0 or 1): with 1, A is [..., 2K] = gate | up and the product
 * is over silu(gate) * up, formed row by row as the rows are quantized (SiluMul folded into the MLP's
 * down projection: one node and one pass over the activations less per layer). gelu_mul (0 or 1) is the same
 * with gelu_tanh(gate) * up (FastGelu and Mul folded: Gemma 3's GeGLU; silu_mul.h).
 * And rms_norm (0 or 1) with epsilon: the product is over (Skip)SimplifiedLayerNormalization of A, the
 * norm folded in the same way (rms_norm.h):
 *   inputs  A [..., K], B, scales, skip [..., K] (optional: s = A + skip, else s = A), gamma [K]
 *   outputs Y, argmax (optional), sum [..., K] (optional: s, the residual stream's next value)
 * And out_norm_epsilon (float, optional): Y is the product's SimplifiedLayerNormalization with weight out_gamma
 * [N] (input 5), the norm after the product folded in the same way (Gemma 3's post-attention and
 * post-feed-forward norms); not with the argmax output.
 */
#include <stdio.h>
#include <string.h>

#include "ggml_blocks.h"
#include "op_common.h"
#include "q4gemm.h"
#include "q8gemm.h"
#include "rms_norm.h"
#include "silu_mul.h"

enum { GLU_SILU = 1, GLU_GELU = 2 }; /* the gated activation folded in (silu_mul, gelu_mul) */

typedef struct {
    int64_t K, N;
    int bits;     /* 4: MatMulQ4, 8: MatMulQ8, 0: MatMulGGUF */
    int64_t type; /* MatMulGGUF: the ggml block type (ggml_blocks.h) */
    int glu;      /* GLU_SILU, GLU_GELU: A is gate | up [..., 2K], the product over act(gate) * up; 0: none */
    int rms_norm; /* the product is over RMSNorm(A (+ skip)) * gamma */
    float eps;
    int out_norm; /* Y is RMSNorm(product) * out_gamma, with out_eps */
    float out_eps;
    const QImpl *impl;
} QKernel;

static const char *q4_name(const OrtCustomOp *op) { (void)op; return "MatMulQ4"; }
static const char *q8_name(const OrtCustomOp *op) { (void)op; return "MatMulQ8"; }
static const char *gguf_name(const OrtCustomOp *op) { (void)op; return "MatMulGGUF"; }
static const char *op_name(int bits) { return bits == 4 ? "MatMulQ4" : bits == 8 ? "MatMulQ8" : "MatMulGGUF"; }
static size_t q_inputs(const OrtCustomOp *op) { (void)op; return 6; } /* A, B, scales, skip, gamma, out_gamma */
static int q_input_type(const OrtCustomOp *op, size_t i) {
    (void)op;
    return i == 1 ? ONNX_UINT8 : i == 2 ? ONNX_UNDEFINED : ONNX_FLOAT; /* scales: float16 or float */
}
static int q_input_kind(const OrtCustomOp *op, size_t i) {
    (void)op;
    return i < 3 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
}
/* MatMulGGUF: the same positions (skip and gamma stay inputs 3 and 4 for the fused norm), with input 2 (the
 * other ops' scales: a GGUF block holds its own) optional and unread. */
static int gguf_input_type(const OrtCustomOp *op, size_t i) {
    (void)op;
    return i == 1 ? ONNX_UINT8 : i == 2 ? ONNX_UNDEFINED : ONNX_FLOAT;
}
static int gguf_input_kind(const OrtCustomOp *op, size_t i) {
    (void)op;
    return i < 2 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
}
static size_t q_outputs(const OrtCustomOp *op) { (void)op; return 3; } /* Y, argmax, sum */
static int q_output_type(const OrtCustomOp *op, size_t i) { (void)op; return i == 1 ? ONNX_INT64 : ONNX_FLOAT; }
static int q_output_kind(const OrtCustomOp *op, size_t i) {
    (void)op;
    return i == 0 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
}

static OrtStatus *q_create(const OrtKernelInfo *info, int bits, void **out) {
    const char *op = op_name(bits);
    char msg[200];
    int64_t K = 0, N = 0, type = 0;
    TRY(ORT_KernelInfoGetAttribute_int64(g_api)(info, "K", &K));
    TRY(ORT_KernelInfoGetAttribute_int64(g_api)(info, "N", &N));
    if (K <= 0 || K % (bits ? 64 : 32) != 0 || N <= 0) { /* MatMulGGUF: whole blocks of 32 (its type checks more) */
        snprintf(msg, sizeof msg, "%s: K must be a positive multiple of %d and N positive", op, bits ? 64 : 32);
        return fail(ORT_INVALID_ARGUMENT, msg);
    }
    if (bits == 0) {
        TRY(ORT_KernelInfoGetAttribute_int64(g_api)(info, "type", &type));
        if (!ggml_block_elements(type) || K % ggml_block_elements(type)) {
            snprintf(msg, sizeof msg, "MatMulGGUF: type %lld is not an executed GGUF block type, or K is not a "
                     "multiple of its block", (long long)type);
            return fail(ORT_INVALID_ARGUMENT, msg);
        }
    }
    int64_t silu_mul = 0;
    OrtStatus *absent = ORT_KernelInfoGetAttribute_int64(g_api)(info, "silu_mul", &silu_mul);
    if (absent) { /* optional: absent means 0 */
        ORT_ReleaseStatus(g_api)(absent);
        silu_mul = 0;
    }
    int64_t gelu_mul = 0;
    if ((absent = ORT_KernelInfoGetAttribute_int64(g_api)(info, "gelu_mul", &gelu_mul))) {
        ORT_ReleaseStatus(g_api)(absent);
        gelu_mul = 0;
    }
    int64_t rms_norm = 0;
    if ((absent = ORT_KernelInfoGetAttribute_int64(g_api)(info, "rms_norm", &rms_norm))) {
        ORT_ReleaseStatus(g_api)(absent);
        rms_norm = 0;
    }
    float eps = 0.0f;
    if (rms_norm && (absent = ORT_KernelInfoGetAttribute_float(g_api)(info, "epsilon", &eps))) {
        ORT_ReleaseStatus(g_api)(absent);
        snprintf(msg, sizeof msg, "%s: rms_norm needs its epsilon attribute", op);
        return fail(ORT_INVALID_ARGUMENT, msg);
    }
    if ((silu_mul != 0 && silu_mul != 1) || (gelu_mul != 0 && gelu_mul != 1) || (rms_norm != 0 && rms_norm != 1) ||
        silu_mul + gelu_mul + rms_norm > 1) {
        snprintf(msg, sizeof msg, "%s: silu_mul, gelu_mul and rms_norm are 0 or 1, and at most one is 1", op);
        return fail(ORT_INVALID_ARGUMENT, msg);
    }
    float out_eps = 0.0f;
    int out_norm = 0;
    if ((absent = ORT_KernelInfoGetAttribute_float(g_api)(info, "out_norm_epsilon", &out_eps)))
        ORT_ReleaseStatus(g_api)(absent);
    else
        out_norm = 1;
    if (out_norm && N % 8) {
        snprintf(msg, sizeof msg, "%s: out_norm_epsilon needs N a multiple of 8", op);
        return fail(ORT_INVALID_ARGUMENT, msg);
    }
    int64_t fp32_compute = 0;
    if ((absent = ORT_KernelInfoGetAttribute_int64(g_api)(info, "fp32_compute", &fp32_compute))) {
        ORT_ReleaseStatus(g_api)(absent);
        fp32_compute = 0;
    }
    if ((fp32_compute != 0 && fp32_compute != 1) || (fp32_compute && bits == 4)) {
        snprintf(msg, sizeof msg, "%s: fp32_compute is 0 or 1, and only MatMulQ8 and MatMulGGUF take 1", op);
        return fail(ORT_INVALID_ARGUMENT, msg);
    }
    /* EDGE_KERNELS_ISA pins the implementation (A/B runs, tests); unset, the fastest this CPU has runs. */
    const char *isa = getenv("EDGE_KERNELS_ISA");
    const QImpl *impl = bits == 4 ? q4_impl(isa) : bits == 8 ? q8_impl(isa) : ggml_impl(type, isa, 0);
    if (impl && fp32_compute) /* still needs a CPU the quantized kernels run on: AVX2 */
        impl = bits ? &q8_fp32 : ggml_impl(type, isa, 1);
    if (!impl) {
        snprintf(msg, sizeof msg, "%s: EDGE_KERNELS_ISA=%s is not an implementation this CPU runs "
                 "(avx2, avx512vnni or amx; unset it to pick the fastest)", op, isa ? isa : "");
        return fail(ORT_INVALID_ARGUMENT, msg);
    }
    QKernel *k = malloc(sizeof *k);
    if (!k) return fail(ORT_FAIL, "MatMulQ4/Q8/GGUF: out of memory");
    k->K = K;
    k->N = N;
    k->bits = bits;
    k->type = type;
    k->glu = silu_mul ? GLU_SILU : gelu_mul ? GLU_GELU : 0;
    k->rms_norm = (int)rms_norm;
    k->eps = eps;
    k->out_norm = out_norm;
    k->out_eps = out_eps;
    k->impl = impl;
    *out = k;
    return NULL;
}

static OrtStatus *q4_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **out) {
    (void)op, (void)api;
    return q_create(info, 4, out);
}

static OrtStatus *q8_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **out) {
    (void)op, (void)api;
    return q_create(info, 8, out);
}

static OrtStatus *gguf_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **out) {
    (void)op, (void)api;
    return q_create(info, 0, out);
}

/* ---- compute ------------------------------------------------------------------------------------ */

static _Thread_local Grown t_scratch; /* the quantized activations */
static _Thread_local Grown t_best;    /* the argmax output's per-task partials */
static _Thread_local Grown t_act;     /* silu(gate) * up of the row being quantized */

typedef struct {
    const float *a;
    float *y;
    const uint8_t *b;
    const void *scales;
    int fp16_scales;
    const QImpl *impl;
    void *scratch;
    int glu, rms_norm;
    float eps;
    const float *skip, *gamma; /* rms_norm: skip may be NULL */
    float *sum;                /* rms_norm: the optional sum output, or NULL */
    const float *out_gamma;    /* out_norm: Y's norm weight [N], else NULL */
    float out_eps;
    int64_t M, K, N, cols_per_task;
    float *best;      /* with the argmax output: [tasks][M] each task's largest value of each row, */
    int64_t *best_at; /* and its column */
    int out_of_memory;
} Work;

/* `v` beats the best so far `b` (numpy.argmax's order: a NaN beats everything, then the first wins). */
static inline int beats(float v, float b) { return v > b || (v != v && b == b); }

static void quantize_task(void *data, size_t r) {
    Work *w = data;
    const float *row = w->a + (int64_t)r * w->K * (w->glu ? 2 : 1);
    if (w->glu || w->rms_norm) {
        float *act = grown(&t_act, (size_t)w->K * sizeof(float));
        if (!act) {
            __atomic_store_n(&w->out_of_memory, 1, __ATOMIC_RELAXED);
            return;
        }
        if (w->glu == GLU_SILU)
            silu_mul_row(row, w->K, act);
        else if (w->glu == GLU_GELU)
            gelu_mul_row(row, w->K, act);
        else
            rms_norm_row(row, w->skip ? w->skip + (int64_t)r * w->K : NULL, w->gamma, w->K, w->eps,
                         w->sum ? w->sum + (int64_t)r * w->K : NULL, act);
        row = act;
    }
    w->impl->quantize_row(row, w->K, w->M, w->scratch, (int64_t)r);
}

/* Row r of Y normalized in place (out_norm): after every column task, as the row is whole only then. */
static void out_norm_task(void *data, size_t r) {
    const Work *w = data;
    float *y = w->y + (int64_t)r * w->N;
    rms_norm_row(y, NULL, w->out_gamma, w->N, w->out_eps, NULL, y);
}

/* One chunk of columns against every row, eight rows at a time: the chunk's weights stay in cache
 * while the rows stream past (prefill); at M = 1 it is a plain slice of the GEMV. */
static void column_task(void *data, size_t i) {
    const Work *w = data;
    int64_t n0 = (int64_t)i * w->cols_per_task;
    int64_t n1 = n0 + w->cols_per_task < w->N ? n0 + w->cols_per_task : w->N;
    /* A prompt's rows meet the columns 16 pairs of blocks (1024 of K) at a time, so eight rows' share stays
     * in L1 across the chunk's columns: +27% at K = 8192 single-threaded. Decode has one row: K in one go. */
    int64_t pairs = (w->K + 63) / 64; /* MatMulGGUF's K may end in half a pair */
    int64_t step = w->M > 4 && pairs > QGEMM_K_CHUNK_PAIRS ? QGEMM_K_CHUNK_PAIRS : pairs;
    for (int64_t p0 = 0; p0 < pairs; p0 += step) {
        int64_t p1 = p0 + step < pairs ? p0 + step : pairs;
        for (int64_t r0 = 0; r0 < w->M; r0 += w->impl->rows) {
            int m = w->M - r0 < w->impl->rows ? (int)(w->M - r0) : w->impl->rows;
            w->impl->tile(w->scratch, r0, m, w->b, w->scales, w->fp16_scales, w->K, w->N, n0, n1, p0, p1,
                          w->y + r0 * w->N, w->M);
        }
    }
    if (w->best) /* the chunk's columns are still in this core's cache */
        for (int64_t r = 0; r < w->M; r++) {
            const float *y = w->y + r * w->N;
            int64_t at = n0;
            for (int64_t n = n0 + 1; n < n1; n++)
                if (beats(y[n], y[at])) at = n;
            w->best[i * w->M + r] = y[at];
            w->best_at[i * w->M + r] = at;
        }
}

static OrtStatus *q_compute(void *kernel, OrtKernelContext *ctx) {
    const QKernel *k = kernel;
    const char *op = op_name(k->bits);
    char msg[200];
    const OrtValue *a_v, *b_v, *s_v = NULL;
    TRY(ORT_KernelContext_GetInput(g_api)(ctx, 0, &a_v));
    TRY(ORT_KernelContext_GetInput(g_api)(ctx, 1, &b_v));
    if (k->bits) TRY(ORT_KernelContext_GetInput(g_api)(ctx, 2, &s_v));
    int64_t dims[8];
    size_t rank = 0, a_count = 0, b_count = 0, s_count = 0;
    TRY(element_count(a_v, &a_count, dims, &rank, NULL));
    TRY(element_count(b_v, &b_count, NULL, NULL, NULL));
    int s_type = ONNX_FLOAT;
    if (s_v) TRY(element_count(s_v, &s_count, NULL, NULL, &s_type));
    /* MatMulQ4: B [N, K/32, 16], scales float16 or float [N, K/32]; MatMulQ8: B N x K bytes, scales float [N];
     * MatMulGGUF: B the N rows' GGUF blocks, no scales */
    int scales_ok = s_type == ONNX_FLOAT || (k->bits == 4 && s_type == ONNX_FLOAT16);
    int64_t b_want = k->bits == 4 ? k->N * k->K / 2 : k->bits == 8 ? k->N * k->K : 0,
            s_want = k->bits == 4 ? k->N * k->K / 32 : k->N;
    if (!k->bits) b_want = k->N * (k->K / ggml_block_elements(k->type)) * ggml_block_bytes(k->type), s_want = 0;
    if (!scales_ok) {
        snprintf(msg, sizeof msg, "%s: scales must be %s", op, k->bits == 4 ? "float16 or float" : "float");
        return fail(ORT_INVALID_ARGUMENT, msg);
    }
    int64_t width = k->glu ? 2 * k->K : k->K;
    if (rank < 1 || dims[rank - 1] != width) {
        snprintf(msg, sizeof msg, "%s: A's last dimension is not %s", op, k->glu ? "2K (silu_mul or gelu_mul)" : "K");
        return fail(ORT_INVALID_ARGUMENT, msg);
    }
    if ((int64_t)b_count != b_want || (int64_t)s_count != s_want) {
        snprintf(msg, sizeof msg, "%s: B or scales do not hold %s", op,
                 k->bits == 4 ? "N x K/32 blocks" : k->bits == 8 ? "N x K bytes and N scales"
                                                               : "N rows of K / block GGUF blocks (and no scales)");
        return fail(ORT_INVALID_ARGUMENT, msg);
    }
    int64_t M = (int64_t)a_count / width;
    int64_t a_dims[8];
    memcpy(a_dims, dims, sizeof a_dims);
    const float *skip = NULL, *gamma = NULL;
    if (k->rms_norm) { /* skip (input 3) optional, gamma (input 4) required */
        const OrtValue *skip_v = NULL, *gamma_v = NULL;
        size_t skip_count = 0, gamma_count = 0;
        TRY(ORT_KernelContext_GetInput(g_api)(ctx, 3, &skip_v));
        TRY(ORT_KernelContext_GetInput(g_api)(ctx, 4, &gamma_v));
        if (gamma_v) TRY(element_count(gamma_v, &gamma_count, NULL, NULL, NULL));
        if (skip_v) TRY(element_count(skip_v, &skip_count, NULL, NULL, NULL));
        if (!gamma_v || (int64_t)gamma_count != k->K || (skip_v && skip_count != a_count)) {
            snprintf(msg, sizeof msg, "%s: rms_norm needs gamma [K] (input 4) and a skip (input 3) shaped as A", op);
            return fail(ORT_INVALID_ARGUMENT, msg);
        }
        TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)gamma_v, (void **)&gamma));
        if (skip_v) TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)skip_v, (void **)&skip));
    }
    dims[rank - 1] = k->N;
    OrtValue *y_v;
    TRY(ORT_KernelContext_GetOutput(g_api)(ctx, 0, dims, rank, &y_v));
    size_t outputs = 1;
    TRY(ORT_KernelContext_GetOutputCount(g_api)(ctx, &outputs));
    int64_t *argmax = NULL;
    float *sum = NULL;
    if (outputs > 1) { /* an output the node leaves out ("") comes back NULL */
        dims[rank - 1] = 1;
        OrtValue *arg_v = NULL;
        TRY(ORT_KernelContext_GetOutput(g_api)(ctx, 1, dims, rank, &arg_v));
        if (arg_v) TRY(ORT_GetTensorMutableData(g_api)(arg_v, (void **)&argmax));
    }
    const float *out_gamma = NULL;
    if (k->out_norm) {
        const OrtValue *g_v = NULL;
        size_t g_count = 0;
        TRY(ORT_KernelContext_GetInput(g_api)(ctx, 5, &g_v));
        if (g_v) TRY(element_count(g_v, &g_count, NULL, NULL, NULL));
        if (!g_v || (int64_t)g_count != k->N || argmax) {
            snprintf(msg, sizeof msg, "%s: out_norm_epsilon needs out_gamma [N] (input 5) and no argmax output", op);
            return fail(ORT_INVALID_ARGUMENT, msg);
        }
        TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)g_v, (void **)&out_gamma));
    }
    if (outputs > 2 && !k->rms_norm) { /* the sum output exists only with the norm */
        snprintf(msg, sizeof msg, "%s: a third output (the sum) needs rms_norm=1", op);
        return fail(ORT_INVALID_ARGUMENT, msg);
    }
    if (outputs > 2) {
        OrtValue *sum_v = NULL;
        TRY(ORT_KernelContext_GetOutput(g_api)(ctx, 2, a_dims, rank, &sum_v));
        if (sum_v) TRY(ORT_GetTensorMutableData(g_api)(sum_v, (void **)&sum));
    }
    if (M == 0) return NULL;

    Work w = {0};
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)a_v, (void **)&w.a));
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)b_v, (void **)&w.b));
    if (s_v) TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)s_v, (void **)&w.scales));
    TRY(ORT_GetTensorMutableData(g_api)(y_v, (void **)&w.y));
    w.M = M, w.K = k->K, w.N = k->N, w.glu = k->glu;
    w.rms_norm = k->rms_norm, w.eps = k->eps, w.skip = skip, w.gamma = gamma, w.sum = sum;
    w.out_gamma = out_gamma, w.out_eps = k->out_eps;
    w.fp16_scales = s_type == ONNX_FLOAT16;
    w.impl = k->impl;
    w.scratch = grown(&t_scratch, k->impl->scratch_bytes(k->K, M));
    if (!w.scratch) return fail(ORT_FAIL, "MatMulQ4/Q8/GGUF: out of memory for the quantized activations");
    if (M == 1)
        quantize_task(&w, 0);
    else
        TRY(ORT_KernelContext_ParallelFor(g_api)(ctx, quantize_task, (size_t)M, 0, &w));
    if (w.out_of_memory) return fail(ORT_FAIL, "MatMulQ4/Q8/GGUF: out of memory for the prologue's row");
    /* Chunks: 32 columns at least (a multiple of 4), at most ~64 tasks, so two to eight threads balance. */
    int64_t per = (k->N + 63) / 64;
    per = per < 32 ? 32 : (per + 3) / 4 * 4;
    w.cols_per_task = per;
    size_t tasks = (size_t)((k->N + per - 1) / per);
    if (argmax) {
        char *best = grown(&t_best, tasks * (size_t)M * (sizeof(float) + sizeof(int64_t)));
        if (!best) return fail(ORT_FAIL, "MatMulQ4/Q8/GGUF: out of memory for the argmax");
        w.best_at = (int64_t *)best;
        w.best = (float *)(best + tasks * (size_t)M * sizeof(int64_t));
    }
    TRY(ORT_KernelContext_ParallelFor(g_api)(ctx, column_task, tasks, 0, &w));
    for (int64_t r = 0; argmax && r < M; r++) { /* tasks in column order: the first of equal values wins */
        size_t at = 0;
        for (size_t t = 1; t < tasks; t++)
            if (beats(w.best[t * M + r], w.best[at * M + r])) at = t;
        argmax[r] = w.best_at[at * M + r];
    }
    if (out_gamma) {
        if (M == 1)
            out_norm_task(&w, 0);
        else
            TRY(ORT_KernelContext_ParallelFor(g_api)(ctx, out_norm_task, (size_t)M, 0, &w));
    }
    return NULL;
}

const OrtCustomOp edge_matmul_q4_op = EDGE_OP(q4_create, q_compute, q4_name, q_inputs, q_input_type, q_input_kind,
                                              q_outputs, q_output_type, q_output_kind);
const OrtCustomOp edge_matmul_q8_op = EDGE_OP(q8_create, q_compute, q8_name, q_inputs, q_input_type, q_input_kind,
                                              q_outputs, q_output_type, q_output_kind);
const OrtCustomOp edge_matmul_gguf_op = EDGE_OP(gguf_create, q_compute, gguf_name, q_inputs, gguf_input_type,
                                                gguf_input_kind, q_outputs, q_output_type, q_output_kind);
