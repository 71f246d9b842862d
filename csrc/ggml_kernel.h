/* MatMulGGUF's integer kernel body (ggml_blocks.h), written once for the AVX2 and the AVX-512 VNNI
 * implementations: the including file defines
 *   __m256i GG_DOT(__m256i u, __m256i a)   8 int32 sums of 4 products each of unsigned codes u and signed a
 *                                          (AVX2: maddubs then madd; VNNI: vpdpbusd: the same integers)
 *   GG_NAME(x)                             x with the implementation's suffix (x##_avx2, x##_avx512vnni)
 *   GG_ISA                                 its name as QImpl.isa
 * and gets `const QImpl *GG_NAME(ggml_int_impl)(int64_t type)`.
 *
 * A column's blocks go in groups of 8 (a K-quant's super-block), whose scale factors are unpacked once into two
 * vectors (ggml_decode.h's group_scales: D multiplies a block's codes' dot product, C its activation code sum);
 * per pair of blocks of a group and per row:
 *   p_b  = GG_DOT(u_b, xq_b)                       exact int32 lanes (Q8_0: |w| against xq with w's sign;
 *                                                  Q6_K: p_b - 32 * xl_b, exact; D then carries each lane's s6)
 *   acc += float(hadd(p_0, p_1)) * (sx * D)        one conversion and one FMA a pair: hadd puts the two blocks'
 *                                                  sums in lanes [0 0 1 1 | 0 0 1 1], D's lanes permuted likewise
 * and per group and row, the codes' offset (8, 16) and the minimum through the blocks' activation code sums:
 *   bias += C * (sx * S)                           one FMA for 8 blocks
 * The offset thus leaves the integer loop: its terms are rounded in float32 (relative 6e-8 of the block's own
 * sums), where subtracting it from the codes was exact; three vector operations a block fewer. */

/* One row's quantized activations (64-byte aligned rows, `row_bytes` apart):
 *   xq  int8  [K]            the codes, in k order
 *   xl  int32 [K/32][8]      per block, its codes' sums 4 at a time (Q6_K's offset, in integers)
 *   sxv float [pairs][8]     per pair of blocks, [sx0 sx0 sx1 sx1 sx0 sx0 sx1 sx1] (hadd's order)
 *   xs  float [groups][8]    per block, sx * (its code sum); 0 past the last block                          */
static size_t GG_NAME(row_bytes)(int64_t K) {
    int64_t nb = K / 32, pairs = (nb + 1) / 2, groups = (nb + 7) / 8;
    return ((size_t)K + (size_t)nb * 32 + (size_t)pairs * 32 + (size_t)groups * 32 + 63) / 64 * 64;
}

static size_t GG_NAME(scratch_bytes)(int64_t K, int64_t M) { return GG_NAME(row_bytes)(K) * (size_t)M; }

#define GG_XL(row, K) ((int32_t *)((row) + (K)))
#define GG_SXV(row, K) ((float *)((row) + (K) + ((K) / 32) * 32))
#define GG_XS(row, K) ((float *)((row) + (K) + ((K) / 32) * 32 + (((K) / 32 + 1) / 2) * 32))

static void GG_NAME(quantize_row)(const float *x, int64_t K, int64_t M, void *scratch, int64_t r) {
    (void)M;
    char *row = (char *)scratch + GG_NAME(row_bytes)(K) * (size_t)r;
    int8_t *xq = (int8_t *)row;
    int32_t *xl = GG_XL(row, K);
    float *sxv = GG_SXV(row, K), *xs = GG_XS(row, K);
    int64_t nb = K / 32;
    for (int64_t b = 0; b < nb; b++) {
        int32_t q[32], sum = 0;
        float sx = quantize_block(x + b * 32, q);
        for (int l = 0; l < 8; l++) {
            xl[b * 8 + l] = q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3];
            sum += xl[b * 8 + l];
            for (int e = 0; e < 4; e++) xq[b * 32 + 4 * l + e] = (int8_t)q[4 * l + e];
        }
        xs[b] = sx * (float)sum;
        float *v = sxv + (b / 2) * 8;
        int h = (int)(b % 2) * 2;
        v[h] = v[h + 1] = v[h + 4] = v[h + 5] = sx;
    }
    for (int64_t b = nb; b % 8; b++) xs[b] = 0.0f;
    if (nb % 2) { /* the last pair's second block is beyond K: its scale 0 (its codes are never read) */
        float *v = sxv + (nb / 2) * 8;
        v[2] = v[3] = v[6] = v[7] = 0.0f;
    }
}

/* The block's int32 lanes against one row's codes at xq (and, for Q6_K, its lane sums xl). */
static inline __attribute__((always_inline)) __m256i GG_NAME(lanes)(int type, const Blk *w, const int8_t *xq,
                                                                    const int32_t *xl) {
    __m256i a = _mm256_loadu_si256((const __m256i *)xq), p;
    if (type == GGML_Q8_0)
        p = GG_DOT(_mm256_sign_epi8(w->u, w->u), _mm256_sign_epi8(a, w->u));
    else
        p = GG_DOT(w->u, a);
    if (type == GGML_Q6_K) /* the offset 32 in integers: the sub-scales then multiply in float (q6_pair_scales) */
        p = _mm256_sub_epi32(p, _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)xl), 5));
    return p;
}

#ifndef GG_PICK_DEFINED
#define GG_PICK_DEFINED
/* Pair q of a group's lanes of D in hadd's order: [2q 2q 2q+1 2q+1 | 2q 2q 2q+1 2q+1] */
static const int32_t GG_PICK[4][8] = {
    {0, 0, 1, 1, 0, 0, 1, 1}, {2, 2, 3, 3, 2, 2, 3, 3}, {4, 4, 5, 5, 4, 4, 5, 5}, {6, 6, 7, 7, 6, 6, 7, 7}};
#endif

static inline __attribute__((always_inline)) void GG_NAME(column)(int type, const void *scratch, int64_t r0, int m,
                                                                  const uint8_t *B, int64_t K, int64_t N, int64_t n0,
                                                                  int64_t n1, int64_t p0, int64_t p1, float *y) {
    const int64_t nb = K / 32, stride = (int64_t)GG_NAME(row_bytes)(K);
    const int bpe = type == GGML_Q4_0 ? 18 : type == GGML_Q4_1 ? 20 : type == GGML_Q5_0 ? 22 : type == GGML_Q5_1 ? 24
                    : type == GGML_Q8_0 ? 34 : type == GGML_Q4_K ? 144 : type == GGML_Q5_K ? 176 : 210;
    const int per = type >= GGML_Q4_K ? 256 : 32;
    const int has_bias = type != GGML_Q8_0 && type != GGML_Q6_K;
    const char *rows = (const char *)scratch + stride * r0;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *bn = B + n * (K / per * bpe);
        float sum[8];
        for (int r = 0; r < m; r++) sum[r] = p0 > 0 ? y[r * N + n] : 0.0f;
        for (int64_t c0 = p0; c0 < p1; c0 += QGEMM_K_CHUNK_PAIRS) { /* K chunks of 32 blocks: whole groups */
            int64_t c1 = c0 + QGEMM_K_CHUNK_PAIRS < p1 ? c0 + QGEMM_K_CHUNK_PAIRS : p1;
            int64_t jend = 2 * c1 < nb ? 2 * c1 : nb;
            __m256 acc[8], acc2[8], bias[8];
            for (int r = 0; r < m; r++) acc[r] = acc2[r] = bias[r] = _mm256_setzero_ps();
            for (int64_t j0 = 2 * c0; j0 < jend; j0 += 8) {
                int nbg = jend - j0 < 8 ? (int)(jend - j0) : 8;
                if (m == 1) _mm_prefetch((const char *)(bn + j0 * 32 / per * bpe + 2048), _MM_HINT_T0);
                Scales8 g = group_scales(type, bn, j0, nbg);
                if (has_bias)
                    for (int r = 0; r < m; r++)
                        bias[r] = _mm256_fmadd_ps(g.C, _mm256_loadu_ps(GG_XS(rows + stride * r, K) + j0), bias[r]);
                /* the group's pairs unrolled (D's lane picks then constants), into two accumulators a row in
                 * turn: one FMA chain a row stalled each pair on the last one's latency */
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) {
                    if (2 * q >= nbg) break;
                    int64_t j = j0 + 2 * q;
                    Blk w0 = decode(type, bn, j), w1 = 2 * q + 1 < nbg ? decode(type, bn, j + 1) : (Blk){0};
                    const __m256 dv = type == GGML_Q6_K
                                          ? q6_pair_scales(g.D, bn, j0, q)
                                          : _mm256_permutevar8x32_ps(g.D, _mm256_loadu_si256((const __m256i *)GG_PICK[q]));
                    for (int r = 0; r < m; r++) {
                        const char *row = rows + stride * r;
                        const int8_t *xq = (const int8_t *)row + j * 32;
                        const int32_t *xl = GG_XL(row, K) + j * 8;
                        __m256i l0 = GG_NAME(lanes)(type, &w0, xq, xl);
                        __m256i l1 = 2 * q + 1 < nbg ? GG_NAME(lanes)(type, &w1, xq + 32, xl + 8) : _mm256_setzero_si256();
                        __m256 sv = _mm256_mul_ps(_mm256_loadu_ps(GG_SXV(row, K) + (j / 2) * 8), dv);
                        __m256 f = _mm256_cvtepi32_ps(_mm256_hadd_epi32(l0, l1));
                        if (q % 2)
                            acc2[r] = _mm256_fmadd_ps(f, sv, acc2[r]);
                        else
                            acc[r] = _mm256_fmadd_ps(f, sv, acc[r]);
                    }
                }
            }
            for (int r = 0; r < m; r++) sum[r] += hsum8(_mm256_add_ps(_mm256_add_ps(acc[r], acc2[r]), bias[r]));
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
