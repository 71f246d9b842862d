/* The slice of ONNX Runtime's C ABI that the MatMulQ4 op uses, declared here rather than vendored.
 *
 * `OrtApi` is a table of function pointers whose slots are append-only across releases, so an op
 * built against these indices runs on every ONNX Runtime from 1.17 (KernelContext_ParallelFor) on.
 * Slot numbers are 0-based positions in `struct OrtApi` of onnxruntime_c_api.h (ORT_API_VERSION 24,
 * cross-checked against a generated binding); tests/test_kernels.py exercises each of them.
 */
#ifndef EDGE_ORT_ABI_H
#define EDGE_ORT_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef struct OrtStatus OrtStatus;
typedef struct OrtApi OrtApi;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtValue OrtValue;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtSessionOptions OrtSessionOptions;

typedef struct OrtApiBase {
    const OrtApi *(*GetApi)(uint32_t version);
    const char *(*GetVersionString)(void);
} OrtApiBase;

enum { ORT_OK = 0, ORT_FAIL = 1, ORT_INVALID_ARGUMENT = 2 };
enum { ONNX_UNDEFINED = 0, ONNX_FLOAT = 1, ONNX_UINT8 = 2, ONNX_INT32 = 6, ONNX_INT64 = 7, ONNX_BOOL = 9, ONNX_FLOAT16 = 10 }; /* ONNXTensorElementDataType; UNDEFINED: any type */
enum { INPUT_OUTPUT_REQUIRED = 0, INPUT_OUTPUT_OPTIONAL = 1 }; /* OrtCustomOpInputOutputCharacteristic */
enum { ORT_MEM_TYPE_DEFAULT = 0 };                /* OrtMemType */

/* struct OrtCustomOp up to the version-16 members (ORT reads no further for version 16). */
typedef struct OrtCustomOp OrtCustomOp;
struct OrtCustomOp {
    uint32_t version;
    void *(*CreateKernel)(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info);
    const char *(*GetName)(const OrtCustomOp *op);
    const char *(*GetExecutionProviderType)(const OrtCustomOp *op);
    int (*GetInputType)(const OrtCustomOp *op, size_t index);
    size_t (*GetInputTypeCount)(const OrtCustomOp *op);
    int (*GetOutputType)(const OrtCustomOp *op, size_t index);
    size_t (*GetOutputTypeCount)(const OrtCustomOp *op);
    void (*KernelCompute)(void *kernel, OrtKernelContext *context);
    void (*KernelDestroy)(void *kernel);
    int (*GetInputCharacteristic)(const OrtCustomOp *op, size_t index);
    int (*GetOutputCharacteristic)(const OrtCustomOp *op, size_t index);
    int (*GetInputMemoryType)(const OrtCustomOp *op, size_t index);
    int (*GetVariadicInputMinArity)(const OrtCustomOp *op);
    int (*GetVariadicInputHomogeneity)(const OrtCustomOp *op);
    int (*GetVariadicOutputMinArity)(const OrtCustomOp *op);
    int (*GetVariadicOutputHomogeneity)(const OrtCustomOp *op);
    OrtStatus *(*CreateKernelV2)(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **kernel);
    OrtStatus *(*KernelComputeV2)(void *kernel, OrtKernelContext *context);
};
#define EDGE_CUSTOM_OP_VERSION 16

#define ORT_SLOT(api, index, type) ((type)(((void *const *)(api))[index]))
#define ORT_CreateStatus(a) ORT_SLOT(a, 0, OrtStatus * (*)(int, const char *))
#define ORT_CreateCustomOpDomain(a) ORT_SLOT(a, 26, OrtStatus * (*)(const char *, OrtCustomOpDomain **))
#define ORT_CustomOpDomain_Add(a) ORT_SLOT(a, 27, OrtStatus * (*)(OrtCustomOpDomain *, const OrtCustomOp *))
#define ORT_AddCustomOpDomain(a) ORT_SLOT(a, 28, OrtStatus * (*)(OrtSessionOptions *, OrtCustomOpDomain *))
#define ORT_GetTensorMutableData(a) ORT_SLOT(a, 51, OrtStatus * (*)(OrtValue *, void **))
#define ORT_GetTensorElementType(a) ORT_SLOT(a, 60, OrtStatus * (*)(const OrtTensorTypeAndShapeInfo *, int *))
#define ORT_GetDimensionsCount(a) ORT_SLOT(a, 61, OrtStatus * (*)(const OrtTensorTypeAndShapeInfo *, size_t *))
#define ORT_GetDimensions(a) ORT_SLOT(a, 62, OrtStatus * (*)(const OrtTensorTypeAndShapeInfo *, int64_t *, size_t))
#define ORT_GetTensorShapeElementCount(a) \
    ORT_SLOT(a, 64, OrtStatus * (*)(const OrtTensorTypeAndShapeInfo *, size_t *))
#define ORT_GetTensorTypeAndShape(a) ORT_SLOT(a, 65, OrtStatus * (*)(const OrtValue *, OrtTensorTypeAndShapeInfo **))
#define ORT_KernelInfoGetAttribute_float(a) \
    ORT_SLOT(a, 85, OrtStatus * (*)(const OrtKernelInfo *, const char *, float *))
#define ORT_KernelInfoGetAttribute_int64(a) \
    ORT_SLOT(a, 86, OrtStatus * (*)(const OrtKernelInfo *, const char *, int64_t *))
#define ORT_KernelContext_GetOutputCount(a) ORT_SLOT(a, 89, OrtStatus * (*)(const OrtKernelContext *, size_t *))
#define ORT_KernelContext_GetInput(a) ORT_SLOT(a, 90, OrtStatus * (*)(const OrtKernelContext *, size_t, const OrtValue **))
#define ORT_KernelContext_GetOutput(a) \
    ORT_SLOT(a, 91, OrtStatus * (*)(OrtKernelContext *, size_t, const int64_t *, size_t, OrtValue **))
#define ORT_ReleaseStatus(a) ORT_SLOT(a, 93, void (*)(OrtStatus *))
#define ORT_ReleaseTensorTypeAndShapeInfo(a) ORT_SLOT(a, 99, void (*)(OrtTensorTypeAndShapeInfo *))
#define ORT_KernelContext_ParallelFor(a) \
    ORT_SLOT(a, 274, OrtStatus * (*)(const OrtKernelContext *, void (*)(void *, size_t), size_t, size_t, void *))
#define EDGE_ORT_API_VERSION 17 /* KernelContext_ParallelFor */

#endif
