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
 * Per group and row, every block's integer dot product is reduced to one int32 before any float work:
 *   p_b  = GG_DOT(u_b, xq_b)                 exact int32 lanes of block b (Q8_0: under VNNI the codes plus 128
 *                                            as unsigned bytes, under AVX2 |w| against xq with w's sign; Q6_K:
 *                                            maddubs of (q - 32), then madd with each lane's sub-scale s6)
 *   u    = hadd tree of p_0..p_7 - off * is  8 int32 sums in block order, the codes' offset (Q4_0 8, Q5_0 16,
 *                                            Q8_0 128) taken off through the blocks' activation code sums: exact
 *   acc += float(u) * (D * sx)               one conversion, multiply and FMA for 8 blocks
 *   bias += C * xs                           a minimum's term (Q4_1, Q5_1, Q4_K, Q5_K), one FMA for 8 blocks
 * The group's codes are unpacked once for all the call's rows (up to 8, a prompt's tile). Against reducing two
 * blocks at a time, converting and scaling each pair, on the decode of a matrix streamed from memory (2 threads,
 * AMD EPYC, AVX-512 VNNI): Q4_K 2.1x, Q6_K 3.0x, Q5_0 1.5x the weights' bytes a second; prompts 1.6x. */

/* One row's quantized activations (64-byte aligned rows, `row_bytes` apart):
 *   xq  int8  [K]            the codes, in k order
 *   sx  float [groups][8]    each block's scale; 0 past the last block
 *   xs  float [groups][8]    each block's sx * (its code sum); 0 past the last block
 *   is  int32 [groups][8]    each block's code sum; 0 past the last block                                */
static size_t GG_NAME(row_bytes)(int64_t K) {
    int64_t groups = (K / 32 + 7) / 8;
    return ((size_t)K + (size_t)groups * 96 + 63) / 64 * 64;
}

static size_t GG_NAME(scratch_bytes)(int64_t K, int64_t M) { return GG_NAME(row_bytes)(K) * (size_t)M; }

#define GG_SX(row, K) ((float *)((row) + (K)))
#define GG_XS(row, K) ((float *)((row) + (K)) + ((K) / 32 + 7) / 8 * 8)
#define GG_IS(row, K) ((int32_t *)((row) + (K)) + ((K) / 32 + 7) / 8 * 16)

static void GG_NAME(quantize_row)(const float *x, int64_t K, int64_t M, void *scratch, int64_t r) {
    (void)M;
    char *row = (char *)scratch + GG_NAME(row_bytes)(K) * (size_t)r;
    int8_t *xq = (int8_t *)row;
    float *sx = GG_SX(row, K), *xs = GG_XS(row, K);
    int32_t *is = GG_IS(row, K);
    int64_t nb = K / 32;
    for (int64_t b = 0; b < nb; b++) {
        int32_t q[32], sum = 0;
        float s = quantize_block(x + b * 32, q);
        for (int e = 0; e < 32; e++) xq[b * 32 + e] = (int8_t)q[e], sum += q[e];
        sx[b] = s;
        xs[b] = s * (float)sum;
        is[b] = sum;
    }
    for (int64_t b = nb; b % 8; b++) sx[b] = xs[b] = 0.0f, is[b] = 0;
}

/* log2 of the offset taken off a type's codes in integers (Q4_0: 8, Q5_0: 16, Q8_0 under VNNI: 128; Q6_K's 32 is
 * taken off in lanes), 0 for none; and whether the type has a minimum (its float term, C). */
#define GG_SHIFT(type) ((type) == GGML_Q4_0 ? 3 : (type) == GGML_Q5_0 ? 4 : (type) == GGML_Q8_0 && GG_AVX512 ? 7 : 0)
#define GG_MINS(type) ((type) == GGML_Q4_1 || (type) == GGML_Q5_1 || (type) == GGML_Q4_K || (type) == GGML_Q5_K)

/* Block s of the group at `grp` (its first block's bytes; a K-quant's super-block) as 32 unsigned bytes of codes
 * (Q8_0: its signed int8), element order; Q6_K's sub-scales of its two 16s as int16 lanes [s6a x 8 | s6b x 8] in
 * *s16. s is a constant where this is unrolled: no address arithmetic beyond fixed offsets. */
static inline __attribute__((always_inline)) __m256i GG_NAME(codes)(int type, const uint8_t *grp, int s,
                                                                   __m256i *s16) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    if (type == GGML_Q4_0 || type == GGML_Q4_1 || type == GGML_Q5_0 || type == GGML_Q5_1 || type == GGML_Q8_0) {
        const int bytes = type == GGML_Q4_0 ? 18 : type == GGML_Q4_1 ? 20 : type == GGML_Q5_0 ? 22 : type == GGML_Q5_1 ? 24 : 34;
        const uint8_t *b = grp + s * bytes;
        if (type == GGML_Q8_0) { /* VNNI: w + 128 as unsigned bytes (the 128 taken off in integers, GG_SHIFT) */
            __m256i w = _mm256_loadu_si256((const __m256i *)(b + 2));
            return GG_AVX512 ? _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80)) : w;
        }
        const int at = type == GGML_Q4_0 ? 2 : type == GGML_Q4_1 ? 4 : type == GGML_Q5_0 ? 6 : 8;
        /* element e < 16: byte e's low nibble, e >= 16: byte e - 16's high one: the 16 bytes in both halves,
         * the upper half shifted by 4 (a 32-bit shift: what crosses into a byte's high nibble is masked off) */
        __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + at)));
        __m256i u = _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), low4);
        if (type == GGML_Q5_0 || type == GGML_Q5_1) {
            const uint8_t *qh = b + (type == GGML_Q5_0 ? 2 : 4);
#if GG_AVX512
            uint32_t bits;
            memcpy(&bits, qh, 4);
            u = _mm256_mask_add_epi8(u, _cvtu32_mask32(bits), u, _mm256_set1_epi8(0x10));
#else
            u = _mm256_or_si256(u, bits_to_16s(qh));
#endif
        }
        return u;
    }
    const uint8_t *b = grp;
    if (type == GGML_Q6_K) { /* ql [128] | qh [64] | s6 int8 [16] | d */
        const int half = s / 4, c = s % 4;
        __m256i lo = nibbles32(b + half * 64 + (c % 2) * 32, c / 2);
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + half * 32));
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), _mm256_set1_epi8(3));
        int16_t two;
        memcpy(&two, b + 192 + 2 * s, 2);
        __m128i pair = _mm_shuffle_epi8(_mm_cvtsi32_si128(two), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
        *s16 = _mm256_cvtepi8_epi16(pair);
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    }
    __m256i u = nibbles32(b + (type == GGML_Q4_K ? 16 : 48) + (s / 2) * 32, s % 2);
    if (type == GGML_Q5_K) { /* bit s of byte l: element 32 s + l's fifth bit */
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
#if GG_AVX512
        u = _mm256_mask_add_epi8(u, _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << s))), u, _mm256_set1_epi8(0x10));
#else
        u = _mm256_or_si256(u, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, s), _mm256_set1_epi8(1)), 4));
#endif
    }
    return u;
}

/* Block codes u (and Q6_K's s16) against one row's codes at xq: 8 exact int32 lanes. */
static inline __attribute__((always_inline)) __m256i GG_NAME(lanes)(int type, __m256i u, __m256i s16, const int8_t *xq) {
    __m256i a = _mm256_loadu_si256((const __m256i *)xq);
    if (type == GGML_Q8_0 && !GG_AVX512) /* maddubs would saturate on w + 128: |w| against a with w's sign */
        return GG_DOT(_mm256_sign_epi8(u, u), _mm256_sign_epi8(a, u));
    if (type == GGML_Q6_K) { /* (q - 32) * a in int16 pairs (|.| <= 24130), times each 16's sub-scale in madd */
        __m256i d = _mm256_sub_epi16(_mm256_maddubs_epi16(u, a), _mm256_maddubs_epi16(_mm256_set1_epi8(32), a));
        return _mm256_madd_epi16(d, s16);
    }
    return GG_DOT(u, a);
}

/* 8 blocks' int32 lanes to one sum each, in block order. */
static inline __attribute__((always_inline)) __m256i GG_NAME(reduce8)(const __m256i p[8]) {
    __m256i g0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    __m256i g1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    /* g0: [b0 b1 b2 b3 | b0 b1 b2 b3] (lanes 0-3's sums, then 4-7's), g1 likewise for blocks 4-7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20), _mm256_permute2x128_si256(g0, g1, 0x31));
}

/* Blocks [j0, j0 + nbg) of a column (nbg <= 8, j0 a multiple of 8) against m rows, into acc and bias. */
static inline __attribute__((always_inline)) void GG_NAME(group)(int type, const uint8_t *bn, int64_t j0, int nbg,
                                                                 const char *rows, int64_t stride, int64_t K, int m,
                                                                 __m256 *acc, __m256 *bias) {
    const int bpe = type == GGML_Q4_0 ? 18 : type == GGML_Q4_1 ? 20 : type == GGML_Q5_0 ? 22 : type == GGML_Q5_1 ? 24
                    : type == GGML_Q8_0 ? 34 : type == GGML_Q4_K ? 144 : type == GGML_Q5_K ? 176 : 210;
    const uint8_t *grp = bn + (type >= GGML_Q4_K ? j0 / 8 : j0) * bpe;
    Scales8 g = group_scales(type, bn, j0, nbg);
    __m256i u[8], s16[8];
#pragma GCC unroll 8
    for (int b = 0; b < 8; b++) {
        s16[b] = _mm256_setzero_si256();
        u[b] = b < nbg ? GG_NAME(codes)(type, grp, b, &s16[b]) : _mm256_setzero_si256();
    }
    for (int r = 0; r < m; r++) {
        const char *row = rows + stride * r;
        const int8_t *xq = (const int8_t *)row + j0 * 32;
        __m256i p[8];
#pragma GCC unroll 8
        for (int b = 0; b < 8; b++) p[b] = b < nbg ? GG_NAME(lanes)(type, u[b], s16[b], xq + 32 * b) : _mm256_setzero_si256();
        __m256i sums = GG_NAME(reduce8)(p);
        if (GG_SHIFT(type)) /* the codes' offset, exact: offset * the blocks' activation code sums */
            sums = _mm256_sub_epi32(sums, _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(GG_IS(row, K) + j0)),
                                                            GG_SHIFT(type)));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(g.D, _mm256_loadu_ps(GG_SX(row, K) + j0)), acc[r]);
        if (GG_MINS(type)) bias[r] = _mm256_fmadd_ps(g.C, _mm256_loadu_ps(GG_XS(row, K) + j0), bias[r]);
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
    static const QImpl GG_NAME(impl_##NAME) = {GG_ISA, 8, GG_NAME(scratch_bytes), GG_NAME(quantize_row),       \
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
