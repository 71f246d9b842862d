/* MatMulGGUF's block decoding (ggml_blocks.h), shared by its implementations: each 32 weights of a GGUF row
 * unpacked to their codes as bytes, with the block's float factors (the fp32_compute path and GatherGGUF's
 * rows; the integer kernel unpacks a group's codes itself, ggml_kernel.h), and a group's scale factors.
 * Static inline: each including file compiles it for its own instruction set. */
#ifndef EDGE_GGML_DECODE_H
#define EDGE_GGML_DECODE_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "ggml_blocks.h"

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
    int s6a, s6b; /* Q6_K: the sub-scales of the block's first and second 16 (the float path's) */
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
static inline void scale_min_k4(int j, const uint8_t *q, int32_t *sc, int32_t *mn) {
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
        w.s6a = s6[0], w.s6b = s6[1];
        w.D = f16(b + 208);
        return w;
    }
    /* Q4_K: d | dmin | scales [12] | qs [128];  Q5_K: d | dmin | scales [12] | qh [32] | qs [128] */
    int32_t sc, mn;
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

/* The scale factors of the 8 blocks of a group from block j0 (nbg of them inside K; lanes beyond are 0): per block
 * D, what multiplies its codes' dot product, and C, what multiplies its activation code sum: the minimum less the
 * code's offset times D (Q6_K's offset is taken in integers, its C is 0). A K-quant's group is its super-block:
 * its 6-bit scales are unpacked once for its 8 blocks. */
typedef struct {
    __m256 D, C;
} Scales8;

static inline __attribute__((always_inline)) Scales8 group_scales(int type, const uint8_t *bn, int64_t j0, int nbg) {
    Scales8 g;
    if (type == GGML_Q4_K || type == GGML_Q5_K || type == GGML_Q6_K) {
        const int bytes = type == GGML_Q4_K ? 144 : type == GGML_Q5_K ? 176 : 210;
        const uint8_t *b = bn + (j0 / 8) * bytes;
        if (type == GGML_Q6_K) {
            g.D = _mm256_set1_ps(f16(b + 208));
            g.C = _mm256_setzero_ps();
            return g;
        }
        /* the 8 six-bit scales and minimums as bytes, in registers (llama.cpp's kmask shuffle): built in int32
         * arrays on the stack and read back as vectors, they stalled store forwarding */
        uint32_t u[3], sc_lo, sc_hi, mn_lo, mn_hi;
        memcpy(u, b + 4, 12);
        sc_lo = u[0] & 0x3f3f3f3f;
        mn_lo = u[1] & 0x3f3f3f3f;
        sc_hi = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
        mn_hi = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
        __m128i sc = _mm_cvtsi32_si128((int)sc_lo), mn = _mm_cvtsi32_si128((int)mn_lo);
        sc = _mm_insert_epi32(sc, (int)sc_hi, 1), mn = _mm_insert_epi32(mn, (int)mn_hi, 1);
        g.D = _mm256_mul_ps(_mm256_set1_ps(f16(b)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)));
        g.C = _mm256_sub_ps(_mm256_setzero_ps(),
                            _mm256_mul_ps(_mm256_set1_ps(f16(b + 2)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn))));
        return g;
    }
    const int bytes = type == GGML_Q4_0 ? 18 : type == GGML_Q4_1 ? 20 : type == GGML_Q5_0 ? 22 : type == GGML_Q5_1 ? 24 : 34;
    const int mins = type == GGML_Q4_1 || type == GGML_Q5_1;
    const float off = type == GGML_Q4_0 ? 8.0f : type == GGML_Q5_0 ? 16.0f : 0.0f;
    /* the 8 scales gathered in a register (vpinsrw): built in a stack array, two 64-bit stores read back by one
     * 128-bit load stalled store forwarding, a third of a decode step's time */
    __m128i dh = _mm_setzero_si128(), mh = _mm_setzero_si128();
#define GG_GATHER(i)                                                                                     \
    if ((i) < nbg) {                                                                                      \
        uint16_t h_;                                                                                      \
        memcpy(&h_, bn + (j0 + (i)) * bytes, 2);                                                          \
        dh = _mm_insert_epi16(dh, h_, (i));                                                               \
        if (mins) memcpy(&h_, bn + (j0 + (i)) * bytes + 2, 2), mh = _mm_insert_epi16(mh, h_, (i));        \
    }
    GG_GATHER(0) GG_GATHER(1) GG_GATHER(2) GG_GATHER(3) GG_GATHER(4) GG_GATHER(5) GG_GATHER(6) GG_GATHER(7)
#undef GG_GATHER
    g.D = _mm256_cvtph_ps(dh);
    __m256 M = mins ? _mm256_cvtph_ps(mh) : _mm256_setzero_ps();
    g.C = off != 0.0f ? _mm256_fnmadd_ps(_mm256_set1_ps(off), g.D, M) : M;
    return g;
}

#endif
