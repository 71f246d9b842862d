/* AVX2 kernel for ggml_blocks.h: every GGUF block type it executes, one body (`column`) specialised per
 * type by always-inlined block decoders. A column's blocks are unpacked once and met with up to eight
 * rows (prompts); at decode (one row) the unpack is the weight stream's only extra work. */
#include <stddef.h>

#include "ggml_blocks.h"
#include "quad.h" /* quantize_block, hsum8 */

/* One row's quantized activations (64-byte aligned rows, `ggml_row_bytes` apart):
 *   xq int8  [K]          the codes, in k order
 *   xl int32 [K/32][8]    per block, the sums of its codes 4 at a time (lane i: codes 4i..4i+3)
 *   sx float [K/32]       per block, its scale                                                          */
static size_t row_bytes(int64_t K) { return ((size_t)K + (size_t)(K / 32) * 36 + 63) / 64 * 64; }

static size_t scratch_bytes(int64_t K, int64_t M) { return row_bytes(K) * (size_t)M; }

static void quantize_row(const float *x, int64_t K, int64_t M, void *scratch, int64_t r) {
    (void)M;
    char *row = (char *)scratch + row_bytes(K) * (size_t)r;
    int8_t *xq = (int8_t *)row;
    int32_t *xl = (int32_t *)(row + K);
    float *sx = (float *)(row + K + (K / 32) * 32);
    for (int64_t b = 0; b < K / 32; b++) {
        int32_t q[32];
        sx[b] = quantize_block(x + b * 32, q);
        for (int l = 0; l < 8; l++) {
            xl[b * 8 + l] = q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3];
            for (int e = 0; e < 4; e++) xq[b * 32 + 4 * l + e] = (int8_t)q[4 * l + e];
        }
    }
}

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* One 32-block of weights, unpacked: the codes (unsigned bytes, Q8_0's signed), the float factors of the
 * integer dot product and of the activation sum, and for Q6_K the two sub-scales as int32 lanes. */
typedef struct {
    __m256i u;
    float D, Mn;
    __m256i s6;   /* Q6_K: [s6 of the first 16 x4 | of the second 16 x4] */
    int s6a, s6b; /* the same two, for the float path */
} Blk;

/* Low (h = 0) or high (h = 1) nibbles of 32 bytes. */
static inline __m256i nibbles32(const uint8_t *q, int h) {
    __m256i v = _mm256_loadu_si256((const __m256i *)q);
    return _mm256_and_si256(h ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0F));
}

/* Q4_0/Q4_1/Q5_*'s 16 bytes: element e < 16 in byte e's low nibble, e >= 16 in byte e - 16's high one. */
static inline __m256i nibbles16(const uint8_t *q) {
    __m128i v = _mm_loadu_si128((const __m128i *)q), low4 = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low4), _mm_and_si128(v, low4));
}

/* 32 bits (element e's at bit e) to 32 bytes of 0x10 or 0. */
static inline __m256i bits_to_16s(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread); /* byte e: bits' byte e / 8 */
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(0x10));
}

/* Q4_K/Q5_K's 6-bit scale and minimum of sub-block j (llama.cpp's get_scale_min_k4). */
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63, *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Block j (0-based, 32 elements each) of a row's bytes `bn`, for the ggml `type`. */
static inline __attribute__((always_inline)) Blk decode(int type, const uint8_t *bn, int64_t j) {
    Blk w = {0};
    if (type == GGML_Q4_0 || type == GGML_Q4_1 || type == GGML_Q5_0 || type == GGML_Q5_1 || type == GGML_Q8_0) {
        const int bytes = type == GGML_Q4_0 ? 18 : type == GGML_Q4_1 ? 20 : type == GGML_Q5_0 ? 22 : type == GGML_Q5_1 ? 24 : 34;
        const uint8_t *b = bn + j * bytes;
        w.D = f16(b);
        if (type == GGML_Q8_0) {
            w.u = _mm256_loadu_si256((const __m256i *)(b + 2));
        } else if (type == GGML_Q4_0) {
            w.u = nibbles16(b + 2);
        } else if (type == GGML_Q4_1) {
            w.Mn = f16(b + 2);
            w.u = nibbles16(b + 4);
        } else if (type == GGML_Q5_0) {
            w.u = _mm256_or_si256(nibbles16(b + 6), bits_to_16s(b + 2));
        } else {
            w.Mn = f16(b + 2);
            w.u = _mm256_or_si256(nibbles16(b + 8), bits_to_16s(b + 4));
        }
        return w;
    }
    const int bytes = type == GGML_Q4_K ? 144 : type == GGML_Q5_K ? 176 : 210;
    const uint8_t *b = bn + (j / 8) * bytes;
    int s = (int)(j % 8); /* the 32-block within the super-block */
    if (type == GGML_Q6_K) { /* ql [128] | qh [64] | s6 int8 [16] | d */
        int half = s / 4, c = s % 4;
        __m256i lo = nibbles32(b + half * 64 + (c % 2) * 32, c / 2);
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + half * 32));
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), _mm256_set1_epi8(3));
        w.u = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
        const int8_t *s6 = (const int8_t *)(b + 192) + 2 * s;
        w.s6 = _mm256_set_epi32(s6[1], s6[1], s6[1], s6[1], s6[0], s6[0], s6[0], s6[0]);
        w.s6a = s6[0], w.s6b = s6[1];
        w.D = f16(b + 208);
        return w;
    }
    /* Q4_K: d | dmin | scales [12] | qs [128];  Q5_K: d | dmin | scales [12] | qh [32] | qs [128] */
    int sc, mn;
    scale_min_k4(s, b + 4, &sc, &mn);
    w.D = f16(b) * (float)sc;
    w.Mn = -(f16(b + 2) * (float)mn);
    const uint8_t *qs = b + (type == GGML_Q4_K ? 16 : 48);
    w.u = nibbles32(qs + (s / 2) * 32, s % 2);
    if (type == GGML_Q5_K) {
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
        w.u = _mm256_or_si256(w.u, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, s), _mm256_set1_epi8(1)), 4));
    }
    return w;
}

/* The block's share of one row (xq, xl, sx of the same 32-block), added to acc. */
static inline __attribute__((always_inline)) __m256 row_fma(int type, const Blk *w, const int8_t *xq,
                                                            const int32_t *xl, float sx, __m256 acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a = _mm256_loadu_si256((const __m256i *)xq), p;
    if (type == GGML_Q8_0) /* signed weights: |w| against xq with w's sign */
        p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w->u, w->u), _mm256_sign_epi8(a, w->u)), ones);
    else
        p = _mm256_madd_epi16(_mm256_maddubs_epi16(w->u, a), ones);
    const int off_shift = type == GGML_Q4_0 ? 3 : type == GGML_Q5_0 ? 4 : type == GGML_Q6_K ? 5 : 0;
    const int has_min = type == GGML_Q4_1 || type == GGML_Q5_1 || type == GGML_Q4_K || type == GGML_Q5_K;
    __m256i l = _mm256_loadu_si256((const __m256i *)xl);
    if (off_shift) p = _mm256_sub_epi32(p, _mm256_slli_epi32(l, off_shift));
    if (type == GGML_Q6_K) p = _mm256_mullo_epi32(p, w->s6);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(sx * w->D), acc);
    if (has_min) acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), _mm256_set1_ps(sx * w->Mn), acc);
    return acc;
}

/* Columns [n0, n1) against rows r0..r0+m-1 over the 32-blocks of pairs [p0, p1) (2 blocks a pair; the last pair
 * of a K that is an odd number of blocks holds one). */
static inline __attribute__((always_inline)) void column(int type, const void *scratch, int64_t r0, int m,
                                                         const uint8_t *B, int64_t K, int64_t N, int64_t n0,
                                                         int64_t n1, int64_t p0, int64_t p1, float *y) {
    const int64_t nb = K / 32, stride = (int64_t)row_bytes(K);
    const int bpe = type == GGML_Q4_0 ? 18 : type == GGML_Q4_1 ? 20 : type == GGML_Q5_0 ? 22 : type == GGML_Q5_1 ? 24
                    : type == GGML_Q8_0 ? 34 : type == GGML_Q4_K ? 144 : type == GGML_Q5_K ? 176 : 210;
    const int per = type >= GGML_Q4_K ? 256 : 32;
    const int64_t row_b = K / per * bpe;
    const char *rows = (const char *)scratch + stride * r0;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *bn = B + n * row_b;
        float sum[8];
        for (int r = 0; r < m; r++) sum[r] = p0 > 0 ? y[r * N + n] : 0.0f;
        for (int64_t c0 = p0; c0 < p1; c0 += QGEMM_K_CHUNK_PAIRS) {
            int64_t c1 = c0 + QGEMM_K_CHUNK_PAIRS < p1 ? c0 + QGEMM_K_CHUNK_PAIRS : p1;
            __m256 acc[8];
            for (int r = 0; r < m; r++) acc[r] = _mm256_setzero_ps();
            for (int64_t j = 2 * c0; j < 2 * c1 && j < nb; j++) { /* K may end in half a pair */
                if (m == 1 && j % 4 == 0) _mm_prefetch((const char *)(bn + j * 32 / per * bpe + 1024), _MM_HINT_T0);
                Blk w = decode(type, bn, j);
                for (int r = 0; r < m; r++) {
                    const char *row = rows + stride * r;
                    acc[r] = row_fma(type, &w, (const int8_t *)row + j * 32, (const int32_t *)(row + K) + j * 8,
                                     ((const float *)(row + K + nb * 32))[j], acc[r]);
                }
            }
            for (int r = 0; r < m; r++) sum[r] += hsum8(acc[r]);
        }
        for (int r = 0; r < m; r++) y[r * N + n] = sum[r];
    }
}

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
        } else {
            out[i] = _mm256_fmadd_ps(_mm256_set1_ps(w->D), _mm256_cvtepi32_ps(q), _mm256_set1_ps(w->Mn));
        }
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

#define GGML_IMPL(NAME, TYPE)                                                                                 \
    static void tile_##NAME(const void *scratch, int64_t r0, int m, const uint8_t *B, const void *scales,     \
                            int fp16_scales, int64_t K, int64_t N, int64_t n0, int64_t n1, int64_t p0,        \
                            int64_t p1, float *y, int64_t M) {                                                \
        (void)scales, (void)fp16_scales, (void)M;                                                             \
        if (m == 1)                                                                                           \
            column(TYPE, scratch, r0, 1, B, K, N, n0, n1, p0, p1, y);                                         \
        else                                                                                                  \
            column(TYPE, scratch, r0, m, B, K, N, n0, n1, p0, p1, y);                                         \
    }                                                                                                         \
    static const QImpl impl_##NAME = {"avx2", 8, scratch_bytes, quantize_row, tile_##NAME};                 \
    static void fp32_tile_##NAME(const void *scratch, int64_t r0, int m, const uint8_t *B, const void *scales, \
                                 int fp16_scales, int64_t K, int64_t N, int64_t n0, int64_t n1, int64_t p0,   \
                                 int64_t p1, float *y, int64_t M) {                                           \
        (void)scales, (void)fp16_scales, (void)M;                                                             \
        fp32_column(TYPE, scratch, r0, m, B, K, N, n0, n1, p0, p1, y);                                        \
    }                                                                                                         \
    static const QImpl fp32_##NAME = {"fp32", 8, fp32_scratch_bytes, fp32_row, fp32_tile_##NAME};
GGML_IMPL(q4_0, GGML_Q4_0)
GGML_IMPL(q4_1, GGML_Q4_1)
GGML_IMPL(q5_0, GGML_Q5_0)
GGML_IMPL(q5_1, GGML_Q5_1)
GGML_IMPL(q8_0, GGML_Q8_0)
GGML_IMPL(q4_k, GGML_Q4_K)
GGML_IMPL(q5_k, GGML_Q5_K)
GGML_IMPL(q6_k, GGML_Q6_K)

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

const QImpl *ggml_impl(int64_t type, int fp32_compute) {
    if (!q4_impl("avx2")) return NULL; /* the same CPU check as the other ops' AVX2 code */
    switch (type) {
    case GGML_Q4_0: return fp32_compute ? &fp32_q4_0 : &impl_q4_0;
    case GGML_Q4_1: return fp32_compute ? &fp32_q4_1 : &impl_q4_1;
    case GGML_Q5_0: return fp32_compute ? &fp32_q5_0 : &impl_q5_0;
    case GGML_Q5_1: return fp32_compute ? &fp32_q5_1 : &impl_q5_1;
    case GGML_Q8_0: return fp32_compute ? &fp32_q8_0 : &impl_q8_0;
    case GGML_Q4_K: return fp32_compute ? &fp32_q4_k : &impl_q4_k;
    case GGML_Q5_K: return fp32_compute ? &fp32_q5_k : &impl_q5_k;
    case GGML_Q6_K: return fp32_compute ? &fp32_q6_k : &impl_q6_k;
    default: return NULL;
    }
}
