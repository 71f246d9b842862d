/* AVX2 implementation of MatMulGGUF (ggml_blocks.h) through ggml_kernel.h, its fp32_compute mode, and the choice
 * between it and the AVX-512 VNNI one (ggml_vnni.c), which compute the same integers. */
#include <stddef.h>

#include "ggml_blocks.h"
#include "ggml_decode.h"
#include "quad.h" /* quantize_block, hsum8 */

#define GG_DOT(u, a) _mm256_madd_epi16(_mm256_maddubs_epi16((u), (a)), _mm256_set1_epi16(1))
#define GG_NAME(x) x##_avx2
#define GG_ISA "avx2"
#define GG_AVX512 0
#include "ggml_kernel.h"

const QImpl *ggml_int_impl_avx512vnni(int64_t type); /* ggml_vnni.c */

/* fp32_compute=1 (the export's accuracy_level 0 twin): the activations stay float and each weight is formed in
 * float32 as gguf-py dequantizes it (D * (q - off) with D = d * s6 for Q6_K, D * q + Mn otherwise: one rounding
 * where gguf-py has one, the products of an fp16 scale and a small integer being exact), then multiplied in
 * float32. A row's scratch is its K floats. */
static size_t fp32_scratch_bytes(int64_t K, int64_t M) { return (size_t)(K * M) * sizeof(float); }

static void fp32_row(const float *x, int64_t K, int64_t M, void *scratch, int64_t r) {
    (void)M;
    memcpy((float *)scratch + r * K, x, (size_t)K * sizeof(float));
}

/* The block's 32 weights as 4 vectors of 8 floats. */
static inline __attribute__((always_inline)) void weights32(int type, const Blk *w, __m256 out[4]) {
    const int off = type == GGML_Q4_0 ? 8 : type == GGML_Q5_0 ? 16 : type == GGML_Q6_K ? 32 : 0;
    __m128i lo = _mm256_castsi256_si128(w->u), hi = _mm256_extracti128_si256(w->u, 1);
    __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; i++) {
        __m256i q = type == GGML_Q8_0 ? _mm256_cvtepi8_epi32(parts[i]) : _mm256_cvtepu8_epi32(parts[i]);
        q = _mm256_sub_epi32(q, _mm256_set1_epi32(off));
        if (type == GGML_Q6_K) { /* D * s6 of the 16 the 8 lie in, then times q: gguf-py's (d * s6) * q */
            out[i] = _mm256_mul_ps(_mm256_set1_ps(w->D * (float)(i < 2 ? w->s6a : w->s6b)), _mm256_cvtepi32_ps(q));
        } else if (type == GGML_Q4_0 || type == GGML_Q5_0 || type == GGML_Q8_0) { /* no minimum: d * q, whose zero
                                                                                  * keeps d's sign as gguf-py's */
            out[i] = _mm256_mul_ps(_mm256_set1_ps(w->D), _mm256_cvtepi32_ps(q));
        } else {
            out[i] = _mm256_fmadd_ps(_mm256_set1_ps(w->D), _mm256_cvtepi32_ps(q), _mm256_set1_ps(w->Mn));
        }
    }
}

/* Row `row` of a GGUF tensor's bytes as K floats, each as gguf-py dequantizes it (weights32): GatherGGUF's rows. */
void ggml_dequantize_row(int64_t type, const uint8_t *row, int64_t K, float *out) {
    for (int64_t j = 0; j < K / 32; j++) {
        Blk b = decode((int)type, row, j);
        __m256 w[4];
        weights32((int)type, &b, w);
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(out + j * 32 + 8 * i, w[i]);
    }
}

static inline __attribute__((always_inline)) void fp32_column(int type, const void *scratch, int64_t r0, int m,
                                                              const uint8_t *B, int64_t K, int64_t N, int64_t n0,
                                                              int64_t n1, int64_t p0, int64_t p1, float *y) {
    const int64_t nb = K / 32;
    const int bpe = type == GGML_Q4_0 ? 18 : type == GGML_Q4_1 ? 20 : type == GGML_Q5_0 ? 22 : type == GGML_Q5_1 ? 24
                    : type == GGML_Q8_0 ? 34 : type == GGML_Q4_K ? 144 : type == GGML_Q5_K ? 176 : 210;
    const int per = type >= GGML_Q4_K ? 256 : 32;
    const float *x = (const float *)scratch + r0 * K;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *bn = B + n * (K / per * bpe);
        __m256 acc[8];
        for (int r = 0; r < m; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t j = 2 * p0; j < 2 * p1 && j < nb; j++) {
            Blk b = decode(type, bn, j);
            __m256 wv[4];
            weights32(type, &b, wv);
            for (int r = 0; r < m; r++)
                for (int i = 0; i < 4; i++) acc[r] = _mm256_fmadd_ps(wv[i], _mm256_loadu_ps(x + r * K + j * 32 + 8 * i), acc[r]);
        }
        for (int r = 0; r < m; r++) y[r * N + n] = (p0 > 0 ? y[r * N + n] : 0.0f) + hsum8(acc[r]);
    }
}

#define GGML_FP32_IMPL(NAME, TYPE)                                                                            \
    static void fp32_tile_##NAME(const void *scratch, int64_t r0, int m, const uint8_t *B, const void *scales, \
                                 int fp16_scales, int64_t K, int64_t N, int64_t n0, int64_t n1, int64_t p0,   \
                                 int64_t p1, float *y, int64_t M) {                                           \
        (void)scales, (void)fp16_scales, (void)M;                                                             \
        fp32_column(TYPE, scratch, r0, m, B, K, N, n0, n1, p0, p1, y);                                        \
    }                                                                                                         \
    static const QImpl fp32_##NAME = {"fp32", 8, fp32_scratch_bytes, fp32_row, fp32_tile_##NAME};
GGML_FP32_IMPL(q4_0, GGML_Q4_0)
GGML_FP32_IMPL(q4_1, GGML_Q4_1)
GGML_FP32_IMPL(q5_0, GGML_Q5_0)
GGML_FP32_IMPL(q5_1, GGML_Q5_1)
GGML_FP32_IMPL(q8_0, GGML_Q8_0)
GGML_FP32_IMPL(q4_k, GGML_Q4_K)
GGML_FP32_IMPL(q5_k, GGML_Q5_K)
GGML_FP32_IMPL(q6_k, GGML_Q6_K)

int ggml_block_elements(int64_t type) {
    switch (type) {
    case GGML_Q4_0: case GGML_Q4_1: case GGML_Q5_0: case GGML_Q5_1: case GGML_Q8_0: return 32;
    case GGML_Q4_K: case GGML_Q5_K: case GGML_Q6_K: return 256;
    default: return 0;
    }
}

int ggml_block_bytes(int64_t type) {
    switch (type) {
    case GGML_Q4_0: return 18;
    case GGML_Q4_1: return 20;
    case GGML_Q5_0: return 22;
    case GGML_Q5_1: return 24;
    case GGML_Q8_0: return 34;
    case GGML_Q4_K: return 144;
    case GGML_Q5_K: return 176;
    case GGML_Q6_K: return 210;
    default: return 0;
    }
}

static const QImpl *fp32_impl(int64_t type) {
    switch (type) {
    case GGML_Q4_0: return &fp32_q4_0;
    case GGML_Q4_1: return &fp32_q4_1;
    case GGML_Q5_0: return &fp32_q5_0;
    case GGML_Q5_1: return &fp32_q5_1;
    case GGML_Q8_0: return &fp32_q8_0;
    case GGML_Q4_K: return &fp32_q4_k;
    case GGML_Q5_K: return &fp32_q5_k;
    case GGML_Q6_K: return &fp32_q6_k;
    default: return NULL;
    }
}

const QImpl *ggml_impl(int64_t type, const char *isa, int fp32_compute) {
    const QImpl *q4 = q4_impl(isa); /* the CPU check (and EDGE_KERNELS_ISA's pin) of the other ops */
    if (!q4 || !ggml_block_elements(type)) return NULL;
    if (fp32_compute) return fp32_impl(type);
    /* VNNI wherever MatMulQ4 runs VNNI or AMX (an AMX CPU has VNNI; MatMulGGUF has no tile code) */
    return strcmp(q4->isa, "avx2") ? ggml_int_impl_avx512vnni(type) : ggml_int_impl_avx2(type);
}
