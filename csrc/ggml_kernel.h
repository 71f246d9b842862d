/* MatMulGGUF's integer kernel body (ggml_blocks.h), written once for the AVX2 and the AVX-512 VNNI
 * implementations: the including file defines
 *   __m256i GG_DOT(__m256i u, __m256i a)   8 int32 sums of 4 products each of unsigned codes u and signed a
 *                                          (AVX2: maddubs then madd; VNNI: vpdpbusd: the same integers)
 *   GG_NAME(x)                             x with the implementation's suffix (x##_avx2, x##_avx512vnni)
 *   GG_ISA                                 its name as QImpl.isa
 *   GG_AVX512                              1 where AVX-512 BW/VL may be used (byte masks), else 0
 * and gets `const QImpl *GG_NAME(ggml_int_impl)(int64_t type)`.
 *
 * A column's blocks go in groups of 8 (a K-quant's super-block), whose scale factors are unpacked once into two
 * vectors (ggml_decode.h's group_scales: D multiplies a block's codes' dot product, C its activation code sum).
 * The group's codes go into registers a pair of blocks (A, B) at a time, each 128-bit lane one block's 16 codes:
 * [A k 0-15 | B k 0-15] and [A k 16-31 | B k 16-31], the activations stored in the same order. Per group and
 * row, every block's integer dot product is reduced to one int32 before any float work:
 *   d_j  = GG_DOT(p_j0, xq) + GG_DOT(p_j1, xq')  exact int32 lanes of pair j, 4 a block (Q8_0: under VNNI the
 *                                            codes plus 128 as unsigned bytes, under AVX2 |w| against xq with
 *                                            w's sign; Q6_K: maddubs of (q - 32), then madd with each lane's
 *                                            sub-scale s6)
 *   u    = tree of d_0..d_3 - off * is       8 int32 sums in u's order (the pairs' first blocks, then their
 *                                            second), the codes' offset (Q4_0 8, Q5_0 16, Q8_0 128) taken off
 *                                            through the blocks' activation code sums: exact
 *   acc += float(u) * (D * sx)               one conversion, multiply and FMA for 8 blocks
 *   bias += C * xs                           a minimum's term (Q4_1, Q5_1, Q4_K, Q5_K), one FMA for 8 blocks
 * The group's codes are unpacked once for all the call's rows (up to 8, a prompt's tile). The pairs' tree
 * (MatMulQ4's, q4gemm_vnni.c: 4 registers, unpacks and adds) against a block a register reduced by vphaddd:
 * prompts of 128 rows 1.1-1.4x the multiply-adds a second (Q4_0, Q5_0, Q8_0 1.4x at K = 640; Q4_K, Q5_K 1.2x,
 * Q6_K 1.1x at 1024; 2 threads, AMD EPYC, AVX-512 VNNI), a Gemma 3 270M Q4_K_M decode step 0.86-0.94x the
 * time. */

/* One row's quantized activations (64-byte aligned rows, `row_bytes` apart), per group of 8 blocks (256 k):
 *   xq  int8  [groups][4][64]  pair j (blocks 2j, 2j + 1 of the group, A and B) as the weights' pair registers
 *                              hold it: [A k 0-15 | B k 0-15 | A k 16-31 | B k 16-31]; zeros past K
 *   sx  float [groups][8]      each block's scale, in u's order (pairs' first blocks, then their second); 0 past K
 *   xs  float [groups][8]      each block's sx * (its code sum), same order
 *   is  int32 [groups][8]      each block's code sum, same order                                        */
static size_t GG_NAME(row_bytes)(int64_t K) {
    int64_t groups = (K / 32 + 7) / 8;
    return ((size_t)groups * (256 + 96) + 63) / 64 * 64;
}

static size_t GG_NAME(scratch_bytes)(int64_t K, int64_t M) { return GG_NAME(row_bytes)(K) * (size_t)M; }

#define GG_GROUPS(K) (((K) / 32 + 7) / 8)
#define GG_SX(row, K) ((float *)((row) + GG_GROUPS(K) * 256))
#define GG_XS(row, K) ((float *)((row) + GG_GROUPS(K) * 256) + GG_GROUPS(K) * 8)
#define GG_IS(row, K) ((int32_t *)((row) + GG_GROUPS(K) * 256) + GG_GROUPS(K) * 16)

/* u's slot of block b of a group: the pairs' first blocks 0..3, their second 4..7 (the pair tree's order). */
#define GG_SLOT(b) (((b) % 2) * 4 + (b) / 2)

/* A float rounded to fp16 and back (llama.cpp stores its activation blocks' scales as fp16). */
static inline float GG_NAME(fp16_round)(float v) { return _cvtsh_ss(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT)); }

/* A row's activations: per block of 32, codes rint(x * 127 / max |x|) (quantize_block: half to even, as llama.cpp's
 * AVX quantize_row_q8_0 rounds). The legacy types take their scales as llama.cpp's CPU backend gives them
 * (its vec_dot_type, Q8_0 / Q8_1 blocks), so both sides multiply the same integers by the same scales:
 *   Q4_0, Q5_0, Q8_0: the scale max |x| / 127 rounded to fp16;
 *   Q4_1, Q5_1: the same, and the code sum's term (what the minimum multiplies) fp16(unrounded scale * sum).
 * The K-quants keep the float32 scale of each 32: llama.cpp's Q8_K (one scale per 256) measured +0.17% and +0.30%
 * held-out perplexity on SmolLM2-135M and Gemma 3 270M Q4_K_M (docs/decisions/gguf-activation-rounding.md). */
static inline __attribute__((always_inline)) void GG_NAME(quantize_typed)(int type, const float *x, int64_t K,
                                                                           void *scratch, int64_t r) {
    char *row = (char *)scratch + GG_NAME(row_bytes)(K) * (size_t)r;
    int8_t *xq = (int8_t *)row;
    float *sx = GG_SX(row, K), *xs = GG_XS(row, K);
    int32_t *is = GG_IS(row, K);
    int64_t nb = K / 32, groups = GG_GROUPS(K);
    const int fp16_scales = type != GGML_Q4_K && type != GGML_Q5_K && type != GGML_Q6_K;
    if (nb % 8) /* a partial last group: its missing blocks' codes are zero (the rest is written below) */
        memset(xq + (groups - 1) * 256, 0, 256);
    for (int64_t b = 0; b < groups * 8; b++) {
        int64_t g = b / 8, at = g * 8 + GG_SLOT(b % 8);
        if (b >= nb) {
            sx[at] = xs[at] = 0.0f, is[at] = 0;
            continue;
        }
        int32_t q[32], sum = 0;
        float s = quantize_block(x + b * 32, q);
        int8_t *pair = xq + g * 256 + ((b % 8) / 2) * 64 + (b % 2) * 16;
        for (int e = 0; e < 32; e++) pair[(e / 16) * 32 + e % 16] = (int8_t)q[e], sum += q[e];
        is[at] = sum;
        sx[at] = fp16_scales ? GG_NAME(fp16_round)(s) : s;
        xs[at] = fp16_scales ? GG_NAME(fp16_round)(s * (float)sum) : s * (float)sum;
    }
}

/* log2 of the offset taken off a type's codes in integers (Q4_0: 8, Q5_0: 16, Q8_0 under VNNI: 128; Q6_K's 32 is
 * taken off in lanes), 0 for none; and whether the type has a minimum (its float term, C). */
#define GG_SHIFT(type) ((type) == GGML_Q4_0 ? 3 : (type) == GGML_Q5_0 ? 4 : (type) == GGML_Q8_0 && GG_AVX512 ? 7 : 0)
#define GG_MINS(type) ((type) == GGML_Q4_1 || (type) == GGML_Q5_1 || (type) == GGML_Q4_K || (type) == GGML_Q5_K)

/* [lo 16 bytes | hi 16 bytes] */
static inline __m256i GG_NAME(two16)(const uint8_t *lo, const uint8_t *hi) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)lo)),
                                   _mm_loadu_si128((const __m128i *)hi), 1);
}

/* Pair j of the group at `grp` (its first block's bytes; a K-quant's super-block): blocks A = 2j and B = 2j + 1
 * as two registers of unsigned byte codes (Q8_0: signed int8 without VNNI), each 128-bit lane one block's 16:
 *   p[0] = [A k 0-15 | B k 0-15],  p[1] = [A k 16-31 | B k 16-31]
 * (with `two` 0, B is past K: its lanes are zero and its bytes unread); Q6_K's sub-scales of the lanes' 16s as
 * int16 lanes in s16[0], s16[1]. j and two are constants where this is unrolled. */
static inline __attribute__((always_inline)) void GG_NAME(pair)(int type, const uint8_t *grp, int j, int two,
                                                                __m256i p[2], __m256i s16[2]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    if (type == GGML_Q4_0 || type == GGML_Q4_1 || type == GGML_Q5_0 || type == GGML_Q5_1 || type == GGML_Q8_0) {
        const int bytes = type == GGML_Q4_0 ? 18 : type == GGML_Q4_1 ? 20 : type == GGML_Q5_0 ? 22 : type == GGML_Q5_1 ? 24 : 34;
        const uint8_t *a = grp + 2 * j * bytes, *b = a + bytes;
        if (type == GGML_Q8_0) { /* VNNI: w + 128 as unsigned bytes (the 128 taken off in integers, GG_SHIFT) */
            for (int h = 0; h < 2; h++) {
                __m256i w = two ? GG_NAME(two16)(a + 2 + 16 * h, b + 2 + 16 * h)
                                : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(a + 2 + 16 * h)));
                p[h] = GG_AVX512 ? _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80)) : w;
                if (GG_AVX512 && !two) p[h] = _mm256_zextsi128_si256(_mm256_castsi256_si128(p[h]));
            }
            return;
        }
        const int at = type == GGML_Q4_0 ? 2 : type == GGML_Q4_1 ? 4 : type == GGML_Q5_0 ? 6 : 8;
        /* k < 16: byte k's low nibble, k >= 16: byte k - 16's high one */
        __m256i v = two ? GG_NAME(two16)(a + at, b + at) : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(a + at)));
        p[0] = _mm256_and_si256(v, low4);
        p[1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        if (type == GGML_Q5_0 || type == GGML_Q5_1) { /* bit k of qh: element k's fifth bit */
            const int q5 = type == GGML_Q5_0 ? 2 : 4;
            uint32_t ha, hb = 0;
            memcpy(&ha, a + q5, 4);
            if (two) memcpy(&hb, b + q5, 4);
            uint32_t m0 = (ha & 0xFFFFu) | (hb << 16), m1 = (ha >> 16) | (hb & 0xFFFF0000u);
#if GG_AVX512
            p[0] = _mm256_mask_add_epi8(p[0], _cvtu32_mask32(m0), p[0], _mm256_set1_epi8(0x10));
            p[1] = _mm256_mask_add_epi8(p[1], _cvtu32_mask32(m1), p[1], _mm256_set1_epi8(0x10));
#else
            p[0] = _mm256_or_si256(p[0], bits_to_16s((const uint8_t *)&m0));
            p[1] = _mm256_or_si256(p[1], bits_to_16s((const uint8_t *)&m1));
#endif
        }
        return;
    }
    const uint8_t *b = grp;
    if (type == GGML_Q6_K) { /* ql [128] | qh [64] | s6 int8 [16] | d; block s: half s / 4, c = s % 4 */
        const int half = j / 2, cA = (2 * j) % 4; /* B: cA + 1 */
        const int nib = cA / 2;                   /* A's and B's nibble: cA / 2 == (cA + 1) / 2 */
        const __m256i shifts = _mm256_setr_epi32(2 * cA, 2 * cA, 2 * cA, 2 * cA, 2 * cA + 2, 2 * cA + 2, 2 * cA + 2, 2 * cA + 2);
        for (int h = 0; h < 2; h++) {
            /* A's element l from ql[half * 64 + l], B's from ql[half * 64 + 32 + l]; both from qh[half * 32 + l] */
            __m256i v = GG_NAME(two16)(b + half * 64 + 16 * h, b + half * 64 + 32 + 16 * h);
            __m256i lo = _mm256_and_si256(nib ? _mm256_srli_epi16(v, 4) : v, low4);
            __m256i qh = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + 128 + half * 32 + 16 * h)));
            __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(qh, shifts), _mm256_set1_epi8(3));
            p[h] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
            /* s6[2A + h] into every int16 of lane 0, s6[2B + h] of lane 1: each byte shuffled into an int16's high
             * byte, then shifted down with its sign */
            const char ia = (char)(4 * j + h), ib = (char)(4 * j + 2 + h), z = (char)0x80;
            const __m256i at = _mm256_setr_epi8(z, ia, z, ia, z, ia, z, ia, z, ia, z, ia, z, ia, z, ia,
                                                z, ib, z, ib, z, ib, z, ib, z, ib, z, ib, z, ib, z, ib);
            const __m256i s6 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + 192)));
            s16[h] = _mm256_srai_epi16(_mm256_shuffle_epi8(s6, at), 8);
        }
        return;
    }
    /* Q4_K: d | dmin | scales [12] | qs [128];  Q5_K: d | dmin | scales [12] | qh [32] | qs [128]: chunk j's 32
     * bytes hold A's codes in their low nibbles, B's in their high ones */
    const uint8_t *qs = b + (type == GGML_Q4_K ? 16 : 48) + j * 32;
    const __m256i split = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    for (int h = 0; h < 2; h++) {
        __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(qs + 16 * h)));
        p[h] = _mm256_and_si256(_mm256_srlv_epi32(v, split), low4);
        if (type == GGML_Q5_K) { /* bit s of qh byte l: element l of block s's fifth bit */
            __m256i qh = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + 16 + 16 * h)));
#if GG_AVX512
            const __m256i bit = _mm256_setr_m128i(_mm_set1_epi8((char)(1 << (2 * j))), _mm_set1_epi8((char)(1 << (2 * j + 1))));
            p[h] = _mm256_mask_add_epi8(p[h], _mm256_test_epi8_mask(qh, bit), p[h], _mm256_set1_epi8(0x10));
#else
            const __m256i sh = _mm256_setr_epi32(2 * j, 2 * j, 2 * j, 2 * j, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1);
            p[h] = _mm256_or_si256(p[h], _mm256_slli_epi16(_mm256_and_si256(_mm256_srlv_epi32(qh, sh), _mm256_set1_epi8(1)), 4));
#endif
        }
    }
}

/* One pair register's codes u (and Q6_K's s16) against the row's 32 bytes at xq: 8 exact int32 partial sums,
 * 4 a block. */
static inline __attribute__((always_inline)) __m256i GG_NAME(lanes)(int type, __m256i u, __m256i s16, const int8_t *xq) {
    __m256i a = _mm256_load_si256((const __m256i *)xq);
    if (type == GGML_Q8_0 && !GG_AVX512) /* maddubs would saturate on w + 128: |w| against a with w's sign */
        return GG_DOT(_mm256_sign_epi8(u, u), _mm256_sign_epi8(a, u));
    if (type == GGML_Q6_K) { /* (q - 32) * a in int16 pairs (|.| <= 24130), times each 16's sub-scale in madd */
        __m256i d = _mm256_sub_epi16(_mm256_maddubs_epi16(u, a), _mm256_maddubs_epi16(_mm256_set1_epi8(32), a));
        return _mm256_madd_epi16(d, s16);
    }
    return GG_DOT(u, a);
}

/* Pairs 0..3's partial sums (per 128-bit lane 4 int32 of one block: the low lane the pair's first block) to one
 * sum a block, in u's order [first blocks of pairs 0-3 | their second blocks] (MatMulQ4's tree, q4gemm_vnni.c). */
static inline __attribute__((always_inline)) __m256i GG_NAME(sum_pairs)(const __m256i d[4]) {
    __m256i t01 = _mm256_add_epi32(_mm256_unpacklo_epi32(d[0], d[1]), _mm256_unpackhi_epi32(d[0], d[1]));
    __m256i t23 = _mm256_add_epi32(_mm256_unpacklo_epi32(d[2], d[3]), _mm256_unpackhi_epi32(d[2], d[3]));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(t01, t23), _mm256_unpackhi_epi64(t01, t23));
}

/* Blocks [j0, j0 + nbg) of a column (nbg <= 8, j0 a multiple of 8) against m rows, into acc and bias. */
static inline __attribute__((always_inline)) void GG_NAME(group)(int type, const uint8_t *bn, int64_t j0, int nbg,
                                                                 const char *rows, int64_t stride, int64_t K, int m,
                                                                 __m256 *acc, __m256 *bias) {
    const int bpe = type == GGML_Q4_0 ? 18 : type == GGML_Q4_1 ? 20 : type == GGML_Q5_0 ? 22 : type == GGML_Q5_1 ? 24
                    : type == GGML_Q8_0 ? 34 : type == GGML_Q4_K ? 144 : type == GGML_Q5_K ? 176 : 210;
    const uint8_t *grp = bn + (type >= GGML_Q4_K ? j0 / 8 : j0) * bpe;
    Scales8 g = group_scales(type, bn, j0, nbg);
    const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7); /* block order to u's */
    const __m256 D = _mm256_permutevar8x32_ps(g.D, order), C = _mm256_permutevar8x32_ps(g.C, order);
    const int pairs = (nbg + 1) / 2;
    __m256i u[4][2], s16[4][2];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        s16[j][0] = s16[j][1] = _mm256_setzero_si256();
        if (j < pairs)
            GG_NAME(pair)(type, grp, j, 2 * j + 1 < nbg, u[j], s16[j]);
        else
            u[j][0] = u[j][1] = _mm256_setzero_si256();
    }
    for (int r = 0; r < m; r++) {
        const char *row = rows + stride * r;
        const int8_t *xq = (const int8_t *)row + j0 * 32;
        __m256i d[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            d[j] = j < pairs ? _mm256_add_epi32(GG_NAME(lanes)(type, u[j][0], s16[j][0], xq + 64 * j),
                                                GG_NAME(lanes)(type, u[j][1], s16[j][1], xq + 64 * j + 32))
                             : _mm256_setzero_si256();
        __m256i sums = GG_NAME(sum_pairs)(d);
        if (GG_SHIFT(type)) /* the codes' offset, exact: offset * the blocks' activation code sums */
            sums = _mm256_sub_epi32(sums, _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(GG_IS(row, K) + j0)),
                                                            GG_SHIFT(type)));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(D, _mm256_loadu_ps(GG_SX(row, K) + j0)), acc[r]);
        if (GG_MINS(type)) bias[r] = _mm256_fmadd_ps(C, _mm256_loadu_ps(GG_XS(row, K) + j0), bias[r]);
    }
}

static inline __attribute__((always_inline)) void GG_NAME(column)(int type, const void *scratch, int64_t r0, int m,
                                                                  const uint8_t *B, int64_t K, int64_t N, int64_t n0,
                                                                  int64_t n1, int64_t p0, int64_t p1, float *y) {
    const int64_t nb = K / 32, stride = (int64_t)GG_NAME(row_bytes)(K);
    const int bpe = type == GGML_Q4_0 ? 18 : type == GGML_Q4_1 ? 20 : type == GGML_Q5_0 ? 22 : type == GGML_Q5_1 ? 24
                    : type == GGML_Q8_0 ? 34 : type == GGML_Q4_K ? 144 : type == GGML_Q5_K ? 176 : 210;
    const int per = type >= GGML_Q4_K ? 256 : 32;
    const int has_bias = GG_MINS(type);
    const char *rows = (const char *)scratch + stride * r0;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *bn = B + n * (K / per * bpe);
        float sum[8];
        for (int r = 0; r < m; r++) sum[r] = p0 > 0 ? y[r * N + n] : 0.0f;
        for (int64_t c0 = p0; c0 < p1; c0 += QGEMM_K_CHUNK_PAIRS) { /* K chunks of 32 blocks: whole groups */
            int64_t c1 = c0 + QGEMM_K_CHUNK_PAIRS < p1 ? c0 + QGEMM_K_CHUNK_PAIRS : p1;
            int64_t jend = 2 * c1 < nb ? 2 * c1 : nb;
            __m256 acc[8], bias[8];
            for (int r = 0; r < m; r++) acc[r] = bias[r] = _mm256_setzero_ps();
            for (int64_t j0 = 2 * c0; j0 < jend; j0 += 8) {
                const int nbg = jend - j0 < 8 ? (int)(jend - j0) : 8;
                if (m == 1) _mm_prefetch((const char *)(bn + j0 * 32 / per * bpe + 2048), _MM_HINT_T0);
                if (nbg == 8) /* a whole group: the block loops below unroll without a test */
                    GG_NAME(group)(type, bn, j0, 8, rows, stride, K, m, acc, bias);
                else
                    GG_NAME(group)(type, bn, j0, nbg, rows, stride, K, m, acc, bias);
            }
            for (int r = 0; r < m; r++) sum[r] += hsum8(has_bias ? _mm256_add_ps(acc[r], bias[r]) : acc[r]);
        }
        for (int r = 0; r < m; r++) y[r * N + n] = sum[r];
    }
}
#define GG_IMPL(NAME, TYPE)                                                                                   \
    static void GG_NAME(tile_##NAME)(const void *scratch, int64_t r0, int m, const uint8_t *B, const void *scales, \
                                     int fp16_scales, int64_t K, int64_t N, int64_t n0, int64_t n1, int64_t p0, \
                                     int64_t p1, float *y, int64_t M) {                                       \
        (void)scales, (void)fp16_scales, (void)M;                                                             \
        if (m == 1)                                                                                           \
            GG_NAME(column)(TYPE, scratch, r0, 1, B, K, N, n0, n1, p0, p1, y);                                \
        else                                                                                                  \
            GG_NAME(column)(TYPE, scratch, r0, m, B, K, N, n0, n1, p0, p1, y);                                \
    }                                                                                                         \
    static void GG_NAME(quantize_##NAME)(const float *x, int64_t K, int64_t M, void *scratch, int64_t r) {    \
        (void)M;                                                                                              \
        GG_NAME(quantize_typed)(TYPE, x, K, scratch, r);                                                      \
    }                                                                                                         \
    static const QImpl GG_NAME(impl_##NAME) = {GG_ISA, 8, GG_NAME(scratch_bytes), GG_NAME(quantize_##NAME),   \
                                               GG_NAME(tile_##NAME)};
GG_IMPL(q4_0, GGML_Q4_0)
GG_IMPL(q4_1, GGML_Q4_1)
GG_IMPL(q5_0, GGML_Q5_0)
GG_IMPL(q5_1, GGML_Q5_1)
GG_IMPL(q8_0, GGML_Q8_0)
GG_IMPL(q4_k, GGML_Q4_K)
GG_IMPL(q5_k, GGML_Q5_K)
GG_IMPL(q6_k, GGML_Q6_K)

const QImpl *GG_NAME(ggml_int_impl)(int64_t type) {
    switch (type) {
    case GGML_Q4_0: return &GG_NAME(impl_q4_0);
    case GGML_Q4_1: return &GG_NAME(impl_q4_1);
    case GGML_Q5_0: return &GG_NAME(impl_q5_0);
    case GGML_Q5_1: return &GG_NAME(impl_q5_1);
    case GGML_Q8_0: return &GG_NAME(impl_q8_0);
    case GGML_Q4_K: return &GG_NAME(impl_q4_k);
    case GGML_Q5_K: return &GG_NAME(impl_q5_k);
    case GGML_Q6_K: return &GG_NAME(impl_q6_k);
    default: return NULL;
    }
}
