/* GatherGGUF: rows of a table kept in its GGUF blocks, as floats (an embedding lookup over the bytes the LM head's
 * MatMulGGUF reads, so a tied table is stored once: exporters/quant_graph.py).
 *
 *   inputs:  table uint8 [N, K / block * block bytes] (the GGUF's rows as stored), indices int64 [...]
 *   outputs: rows float [..., K], each element as gguf-py's dequantize gives it (bit for bit)
 *   attributes: type (the ggml type id: ggml_blocks.h's executed types), K
 * An index outside [0, N) fails the call in one line rather than reading outside the table. */
#include <stdio.h>
#include <stdlib.h>

#include "ggml_blocks.h"
#include "op_common.h"

typedef struct {
    int64_t type, K;
} GatherGGUF;

static const char *gg_name(const OrtCustomOp *op) { (void)op; return "GatherGGUF"; }
static size_t gg_inputs(const OrtCustomOp *op) { (void)op; return 2; }
static size_t gg_outputs(const OrtCustomOp *op) { (void)op; return 1; }
static int gg_input_type(const OrtCustomOp *op, size_t i) { (void)op; return i == 0 ? ONNX_UINT8 : ONNX_INT64; }

static OrtStatus *gg_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **out) {
    (void)op, (void)api;
    GatherGGUF *k = calloc(1, sizeof *k);
    if (!k) return fail(ORT_FAIL, "GatherGGUF: out of memory");
    OrtStatus *st = ORT_KernelInfoGetAttribute_int64(g_api)(info, "type", &k->type);
    if (!st) st = ORT_KernelInfoGetAttribute_int64(g_api)(info, "K", &k->K);
    if (st) {
        free(k);
        return st;
    }
    if (!ggml_block_elements(k->type) || k->K <= 0 || k->K % ggml_block_elements(k->type)) {
        free(k);
        return fail(ORT_INVALID_ARGUMENT, "GatherGGUF: type is not an executed GGUF block type, or K is not a "
                                          "positive multiple of its block");
    }
    *out = k;
    return NULL;
}

typedef struct {
    const GatherGGUF *k;
    const uint8_t *table;
    const int64_t *ids;
    float *out;
    int64_t row_bytes;
} GatherWork;

static void gg_task(void *data, size_t i) {
    const GatherWork *w = data;
    ggml_dequantize_row(w->k->type, w->table + w->ids[i] * w->row_bytes, w->k->K, w->out + (int64_t)i * w->k->K);
}

static OrtStatus *gg_compute(void *kernel, OrtKernelContext *ctx) {
    const GatherGGUF *k = kernel;
    const OrtValue *t_v, *i_v;
    TRY(ORT_KernelContext_GetInput(g_api)(ctx, 0, &t_v));
    TRY(ORT_KernelContext_GetInput(g_api)(ctx, 1, &i_v));
    int64_t tdims[8], dims[8];
    size_t trank = 0, tcount = 0, rank = 0, count = 0;
    TRY(element_count(t_v, &tcount, tdims, &trank, NULL));
    TRY(element_count(i_v, &count, dims, &rank, NULL));
    GatherWork w = {k, NULL, NULL, NULL, ggml_row_bytes(k->type, k->K)};
    if (trank != 2 || tdims[1] != w.row_bytes || rank > 7)
        return fail(ORT_INVALID_ARGUMENT, "GatherGGUF: table is not [N, row bytes] of its type and K");
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)t_v, (void **)&w.table));
    TRY(ORT_GetTensorMutableData(g_api)((OrtValue *)i_v, (void **)&w.ids));
    for (size_t i = 0; i < count; i++)
        if (w.ids[i] < 0 || w.ids[i] >= tdims[0]) {
            char msg[128];
            snprintf(msg, sizeof msg, "GatherGGUF: index %lld is outside the table's %lld rows", (long long)w.ids[i],
                     (long long)tdims[0]);
            return fail(ORT_INVALID_ARGUMENT, msg);
        }
    dims[rank] = k->K;
    OrtValue *y_v;
    TRY(ORT_KernelContext_GetOutput(g_api)(ctx, 0, dims, rank + 1, &y_v));
    if (count == 0) return NULL;
    TRY(ORT_GetTensorMutableData(g_api)(y_v, (void **)&w.out));
    if (count == 1) { /* a decode step: less than waking the pool */
        gg_task(&w, 0);
        return NULL;
    }
    return ORT_KernelContext_ParallelFor(g_api)(ctx, gg_task, count, 0, &w);
}

const OrtCustomOp edge_gather_gguf_op = EDGE_OP(gg_create, gg_compute, gg_name, gg_inputs, gg_input_type, op_required,
                                                gg_outputs, float_type, op_required);
