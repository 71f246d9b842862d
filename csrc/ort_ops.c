/* edge-runtime's ONNX Runtime custom ops (domain ai.edge_runtime, DESIGN.md §6).
 *
 * MatMulQ4, over q4gemm.h:
 *   A [..., K] float ─┐
 *   B [N, K/32, 16] u8 ├─► quantize A per row/block to int8 ─► q4_tile over column chunks ─► Y [..., N]
 *   scales [N, K/32]  ─┘   (rows in parallel when M > 1)       (ONNX Runtime's intra-op pool)
 *
 * Attributes K, N as MatMulNBits'; bits 4, block 32 and zero point 8 are fixed.
 *
 * SiluMul, over silu_mul.h:  X [..., 2I] = gate | up  ─► Y [..., I] = silu(gate) * up
 */
#include <stdlib.h>
#include <string.h>

#include "ort_abi.h"
#include "q4gemm.h"
#include "silu_mul.h"

static const OrtApi *g_api;

typedef struct {
    int64_t K, N;
} Q4Kernel;

static OrtStatus *fail(int code, const char *msg) { return ORT_CreateStatus(g_api)(code, msg); }

#define TRY(call)                       \
    do {                                \
        OrtStatus *status_ = (call);    \
        if (status_) return status_;    \
    } while (0)

/* ---- op description ---------------------------------------------------------------------------- */

static const char *q4_name(const OrtCustomOp *op) { (void)op; return "MatMulQ4"; }
static size_t q4_inputs(const OrtCustomOp *op) { (void)op; return 3; }
static int q4_input_type(const OrtCustomOp *op, size_t i) { (void)op; return i == 1 ? ONNX_UINT8 : ONNX_FLOAT; }
static const char *silu_name(const OrtCustomOp *op) { (void)op; return "SiluMul"; }
static size_t one_io(const OrtCustomOp *op) { (void)op; return 1; }
static int float_type(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return ONNX_FLOAT; }
static const char *op_ep(const OrtCustomOp *op) { (void)op; return NULL; } /* CPU */
static int op_required(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return INPUT_OUTPUT_REQUIRED; }
static int op_mem_default(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return ORT_MEM_TYPE_DEFAULT; }
static int op_one(const OrtCustomOp *op) { (void)op; return 1; }

static OrtStatus *q4_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **out) {
    (void)op;
    (void)api;
    int64_t K = 0, N = 0;
    TRY(ORT_KernelInfoGetAttribute_int64(g_api)(info, "K", &K));
    TRY(ORT_KernelInfoGetAttribute_int64(g_api)(info, "N", &N));
    if (K <= 0 || K % 64 != 0 || N <= 0) return fail(ORT_INVALID_ARGUMENT, "MatMulQ4: K must be a positive multiple of 64 and N positive");
    Q4Kernel *k = malloc(sizeof *k);
    if (!k) return fail(ORT_FAIL, "MatMulQ4: out of memory");
    k->K = K;
    k->N = N;
    *out = k;
    return NULL;
}

static void kernel_destroy(void *k) { free(k); }

/* ---- compute ------------------------------------------------------------------------------------ */

typedef struct {
    const float *a;
    float *y;
    const uint8_t *b;
    const float *scales;
    void *scratch;
    int64_t M, K, N, cols_per_task;
} Work;

static void quantize_task(void *data, size_t r) {
    const Work *w = data;
    q4_quantize_row(w->a + (int64_t)r * w->K, w->K, q4_row_at(w->scratch, w->K, (int64_t)r));
}

/* One chunk of columns against every row, four rows at a time: the chunk's weights stay in cache
 * while the rows stream past (prefill); at M = 1 it is a plain slice of the GEMV. */
static void column_task(void *data, size_t i) {
    const Work *w = data;
    int64_t n0 = (int64_t)i * w->cols_per_task;
    int64_t n1 = n0 + w->cols_per_task < w->N ? n0 + w->cols_per_task : w->N;
    Q4Row rows[4];
    for (int64_t r0 = 0; r0 < w->M; r0 += 4) {
        int m = w->M - r0 < 4 ? (int)(w->M - r0) : 4;
        for (int j = 0; j < m; j++) rows[j] = q4_row_at(w->scratch, w->K, r0 + j);
        q4_tile(rows, m, w->b, w->scales, w->K, w->N, n0, n1, w->y + r0 * w->N);
    }
}

/* The quantized activations live in a per-thread buffer that only grows: no allocation per token. */
static _Thread_local void *t_scratch;
static _Thread_local size_t t_capacity;

static void *scratch_for(size_t bytes) {
    if (bytes > t_capacity) {
        free(t_scratch);
        size_t cap = (bytes + 63) / 64 * 64;
        t_scratch = aligned_alloc(64, cap);
        t_capacity = t_scratch ? cap : 0;
    }
    return t_scratch;
}

static OrtStatus *element_count(const OrtValue *v, size_t *count, int64_t *dims, size_t *rank) {
    OrtTensorTypeAndShapeInfo *info = NULL;
    TRY(ORT_GetTensorTypeAndShape(g_api)(v, &info));
    OrtStatus *s = ORT_GetTensorShapeElementCount(g_api)(info, count);
    if (!s && dims) {
        s = ORT_GetDimensionsCount(g_api)(info, rank);
        if (!s && *rank > 8) s = fail(ORT_INVALID_ARGUMENT, "MatMulQ4: A has more than 8 dimensions");
        if (!s) s = ORT_GetDimensions(g_api)(info, dims, *rank);
    }
    ORT_ReleaseTensorTypeAndShapeInfo(g_api)(info);
    return s;
}

static OrtStatus *q4_compute(void *kernel, OrtKernelContext *ctx) {
    const Q4Kernel *k = kernel;
    const OrtValue *a_v, *b_v, *s_v;
    TRY(ORT_KernelContext_GetInput(g_api)(ctx, 0, &a_v));
    TRY(ORT_KernelContext_GetInput(g_api)(ctx, 1, &b_v));
    TRY(ORT_KernelContext_GetInput(g_api)(ctx, 2, &s_v));
    int64_t dims[8];
    size_t rank = 0, a_count = 0, b_count = 0, s_count = 0;
    TRY(element_count(a_v, &a_count, dims, &rank));
    TRY(element_count(b_v, &b_count, NULL, NULL));
    TRY(element_count(s_v, &s_count, NULL, NULL));
    if (rank < 1 || dims[rank - 1] != k->K) return fail(ORT_INVALID_ARGUMENT, "MatMulQ4: A's last dimension is not K");
    if ((int64_t)b_count != k->N * k->K / 2 || (int64_t)s_count != k->N * k->K / 32)
        return fail(ORT_INVALID_ARGUMENT, "MatMulQ4: B or scales do not hold N x K/32 blocks");
    int64_t M = (int64_t)a_count / k->K;
    dims[rank - 1] = k->N;
    OrtValue *y_v;
    TRY(ORT_KernelContext_GetOutput(g_api)(ctx, 0, dims, rank, &y_v));
    if (M == 0) return NULL;

    Work w = {0};
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)a_v, (void **)&w.a));
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)b_v, (void **)&w.b));
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)s_v, (void **)&w.scales));
    TRY(ORT_GetTensorMutableData(g_api)(y_v, (void **)&w.y));
    w.M = M, w.K = k->K, w.N = k->N;
    w.scratch = scratch_for(q4_row_bytes(k->K) * (size_t)M);
    if (!w.scratch) return fail(ORT_FAIL, "MatMulQ4: out of memory for the quantized activations");
    if (M == 1)
        quantize_task(&w, 0);
    else
        TRY(ORT_KernelContext_ParallelFor(g_api)(ctx, quantize_task, (size_t)M, 0, &w));
    /* Chunks: 32 columns at least (a multiple of 4), at most ~64 tasks, so two to eight threads balance. */
    int64_t per = (k->N + 63) / 64;
    per = per < 32 ? 32 : (per + 3) / 4 * 4;
    w.cols_per_task = per;
    size_t tasks = (size_t)((k->N + per - 1) / per);
    return ORT_KernelContext_ParallelFor(g_api)(ctx, column_task, tasks, 0, &w);
}

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
    TRY(element_count(x_v, &count, dims, &rank));
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

#define EDGE_OP(create, compute, name, n_inputs, input_type)                                          \
    {                                                                                                 \
        .version = EDGE_CUSTOM_OP_VERSION, .GetName = name, .GetExecutionProviderType = op_ep,        \
        .GetInputType = input_type, .GetInputTypeCount = n_inputs, .GetOutputType = float_type,       \
        .GetOutputTypeCount = one_io, .KernelDestroy = kernel_destroy,                                \
        .GetInputCharacteristic = op_required, .GetOutputCharacteristic = op_required,                \
        .GetInputMemoryType = op_mem_default, .GetVariadicInputMinArity = op_one,                     \
        .GetVariadicInputHomogeneity = op_one, .GetVariadicOutputMinArity = op_one,                   \
        .GetVariadicOutputHomogeneity = op_one, .CreateKernelV2 = create, .KernelComputeV2 = compute, \
    }

static const OrtCustomOp g_ops[] = {
    EDGE_OP(q4_create, q4_compute, q4_name, q4_inputs, q4_input_type),
    EDGE_OP(silu_create, silu_compute, silu_name, one_io, float_type),
};

/* Called by SessionOptions.register_custom_ops_library for each SessionOptions. */
__attribute__((visibility("default"))) OrtStatus *RegisterCustomOps(OrtSessionOptions *options,
                                                                     const OrtApiBase *base) {
    static OrtCustomOpDomain *domain; /* one per process, shared by every session (ORT does not own it) */
    const OrtApi *api = base->GetApi(EDGE_ORT_API_VERSION);
    if (!api) return NULL; /* older than 1.17: nothing registered, sessions report the missing op */
    g_api = api;
    if (!q4_cpu_ok()) return fail(ORT_FAIL, "edge-runtime's kernels need a CPU with AVX2 and FMA");
    if (!domain) {
        OrtCustomOpDomain *d = NULL;
        TRY(ORT_CreateCustomOpDomain(api)("ai.edge_runtime", &d));
        for (size_t i = 0; i < sizeof g_ops / sizeof g_ops[0]; i++) TRY(ORT_CustomOpDomain_Add(api)(d, &g_ops[i]));
        domain = d;
    }
    return ORT_AddCustomOpDomain(api)(options, domain);
}
