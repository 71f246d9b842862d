/* The contract every quantized matrix-product implementation meets (q4gemm.h's MatMulQ4, q8gemm.h's
 * MatMulQ8): activations are quantized per row and block of 32 to int8 into the implementation's own
 * scratch layout, then tiles of rows meet slices of columns. matmul_op.c drives both the same way. */
#ifndef EDGE_QGEMM_H
#define EDGE_QGEMM_H

#include <stddef.h>
#include <stdint.h>

/* A prompt's rows meet the columns this many pairs of blocks (1024 of K) at a time (matmul_op.c); the
 * kernels close a column's float sum at the same boundaries when they take all of K in one call, so the
 * split does not change the rounding (the AVX2 MatMulQ4 decode path aside: kernels.py's exact_rows). */
#define QGEMM_K_CHUNK_PAIRS 16

/* How far ahead (bytes) a decode row's kernels prefetch the column of weights they stream. The hardware
 * prefetcher alone left an Intel Xeon (AMX class, 2 threads) well below its read bandwidth: a K = 2048,
 * N = 8192 matrix streamed from DRAM, MatMulQ8 decode 876-890 -> 616-668 us with 8 KB (2-16 KB all
 * helped), MatMulQ4 450-469 -> 381-386 us from 1 KB. A prefetch past the matrix's end is only a hint. */
#define QGEMM_PREFETCH 8192

/* One implementation (q4gemm_avx2.c, q4gemm_vnni.c, q8gemm_avx2.c, q8gemm_vnni.c, qgemm_amx.c): quantize and
 * tile share its own scratch layout, so they are always used as a pair (the AMX ones pick the layout by M). */
typedef struct {
    const char *isa; /* "avx2", "avx512vnni" or "amx": what EDGE_KERNELS_ISA names and edge_kernels_isa() reports */
    int rows;        /* most rows one `tile` call takes (a multiple of 4) */

    /* Bytes of scratch M quantized rows of K take (K a multiple of 64). */
    size_t (*scratch_bytes)(int64_t K, int64_t M);

    /* Quantize `x` [K] as row `r` of M in `scratch` (64-byte aligned, scratch_bytes(K, M)); rows may
     * be quantized concurrently. */
    void (*quantize_row)(const float *x, int64_t K, int64_t M, void *scratch, int64_t r);

    /* y[r][n] for rows [r0, r0 + m) (r0 % rows == 0, m = min(rows, M - r0)) and columns [n0, n1), over
     * the pairs of blocks [p0, p1) of K (64 values each): stored when p0 == 0, added to y otherwise (K in
     * chunks keeps a prompt's rows in L1 across columns). y points at row r0, stride N. `scales` is the
     * op's scales input; `fp16_scales` says it is float16 (MatMulQ4 only); M is the call's row count
     * (an implementation may round differently above some M: kernels.py's exact_rows says where). */
    void (*tile)(const void *scratch, int64_t r0, int m, const uint8_t *B, const void *scales, int fp16_scales,
                 int64_t K, int64_t N, int64_t n0, int64_t n1, int64_t p0, int64_t p1, float *y, int64_t M);
} QImpl;

/* The implementation named `isa` ("avx2", "avx512vnni", "amx"), or the fastest this CPU runs when `isa` is NULL
 * or empty; NULL when this CPU cannot run the one asked for (AVX2, FMA and F16C at least; AVX-512 F, BW,
 * VL and VNNI for avx512vnni; those plus AMX-TILE/INT8 and the OS granting the tile state for amx). In qgemm.c. */
const QImpl *q4_impl(const char *isa);
const QImpl *q8_impl(const char *isa);

#endif
