/* AVX-512 VNNI kernel for q4gemm.h (Zen 4, Intel Ice Lake and later), on 256-bit vectors.
 *
 * Why it beats the AVX2 kernel (kernel_bench.py, 2 threads: 1.3-1.5x at M=128, 1.06-1.08x at M=1 where the
 * weights stream from memory; 1.3x at M=1 single-threaded in cache): vpdpbusd forms 4-byte dot products
 * straight into int32, and the int32 sums are reduced to one per block *before* the float work, so the
 * convert, scale product and FMA run once per 8 blocks instead of once per 2:
 *
 *   4 pairs of blocks (256 weights) of one column   x   one row's int8 activations (same order)
 *     v_j = B[pair j] ─► lo_j, hi_j nibbles ─► d_j = dpbusd(dpbusd(0, lo_j, xe_j), hi_j, xo_j)   j = 0..3
 *     d_0..d_3  [2 blocks x 4 groups] ─► unpack/add tree ─► u [8 blocks] int32 ─► + zero point's share
 *     acc += float(u) * (weight scales * activation scales)      one convert, multiply and FMA
 *
 * The unpacked weights are shared by up to eight prompt rows (twelve or sixteen ran no faster). The
 * activation layout is this kernel's own (below); the int32 block sums are exact, so results differ from
 * the AVX2 kernel's only in float rounding order (tests/test_kernels.py). */
#include "vnni_begin.h" /* first: everything below is compiled for AVX-512 VNNI */

#include "q4tile.h"

/* Activations in quad.h's layout; per row and quad:
 *   xq int8  [4][64]  per pair the AVX2 layout's [b0 even | b1 even | b0 odd | b1 odd]
 *   zp int32 [8]      minus 8 * each block's code sum (the zero point's share), in u's block order
 *   sx float [8]      each block's scale, in u's block order: pairs 0..3's first blocks, then their seconds */
static size_t scratch_bytes(int64_t K, int64_t M) { return quad_scratch_bytes(K, M); }

static void quantize_row(const float *x, int64_t K, int64_t M, void *scratch, int64_t r) {
    char *tile = quad_tile(scratch, K, r);
    int lane = (int)(r % 4);
    int rows = M - (r - lane) < 4 ? (int)(M - (r - lane)) : 4; /* in this tile */
    int64_t quads = quads_of(K), pairs = K / 64;
    if (pairs % 4) memset(tile + ((quads - 1) * rows + lane) * QUAD_ROW, 0, QUAD_ROW);
    for (int64_t b = 0; b < K / 32; b++) {
        int32_t q[32];
        float scale = quantize_block(x + b * 32, q);
        int64_t p = b / 2, h = b % 2, slot = h * 4 + p % 4;
        char *row = tile + ((p / 4) * rows + lane) * QUAD_ROW;
        int8_t *even = (int8_t *)row + (p % 4) * 64 + h * 16, *odd = even + 32;
        int32_t sum = 0;
        for (int j = 0; j < 16; j++) {
            even[j] = (int8_t)q[2 * j];
            odd[j] = (int8_t)q[2 * j + 1];
            sum += q[2 * j] + q[2 * j + 1];
        }
        ((int32_t *)(row + 256))[slot] = -8 * sum;
        ((float *)(row + 288))[slot] = scale;
    }
}

/* The quad's 8 weight scales (fewer at K's end: zeros) in u's block order. */
static inline __m256 quad_scales_f16(const void *sn, int64_t p, int q) {
    const uint16_t *s = (const uint16_t *)sn + 2 * p;
    __m128i h = q == 4 ? _mm_loadu_si128((const __m128i *)s) : _mm_maskz_loadu_epi16((__mmask8)((1u << 2 * q) - 1), s);
    return _mm256_permutevar8x32_ps(_mm256_cvtph_ps(h), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
}

static inline __m256 quad_scales_f32(const void *sn, int64_t p, int q) {
    const float *s = (const float *)sn + 2 * p;
    __m256 f = q == 4 ? _mm256_loadu_ps(s) : _mm256_maskz_loadu_ps((__mmask8)((1u << 2 * q) - 1), s);
    return _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
}

/* Pair j of one row's quad against its unpacked weights: per 128-bit lane 4 int32 partial sums of one block
 * (the low lane the pair's first block). */
static inline __m256i pair_dot(const char *row, __m256i lo, __m256i hi, int j) {
    const __m256i *x = (const __m256i *)(row + j * 64);
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, _mm256_loadu_si256(x)), hi,
                               _mm256_loadu_si256(x + 1));
}

/* One row's quad: the 8 block sums plus the zero point's share, int32 in u's block order. */
static inline __m256i quad_dot(const char *row, const __m256i lo[4], const __m256i hi[4]) {
    __m256i d[4];
    for (int j = 0; j < 4; j++) d[j] = pair_dot(row, lo[j], hi[j], j);
    /* per 128-bit lane (one block of each pair): [g0 g1 g2 g3] of d_0..d_3 -> [d_0 d_1 d_2 d_3] */
    __m256i t01 = _mm256_add_epi32(_mm256_unpacklo_epi32(d[0], d[1]), _mm256_unpackhi_epi32(d[0], d[1]));
    __m256i t23 = _mm256_add_epi32(_mm256_unpacklo_epi32(d[2], d[3]), _mm256_unpackhi_epi32(d[2], d[3]));
    __m256i u = _mm256_add_epi32(_mm256_unpacklo_epi64(t01, t23), _mm256_unpackhi_epi64(t01, t23));
    return _mm256_add_epi32(u, _mm256_loadu_si256((const __m256i *)(row + 256)));
}

/* A column's quad (q of its 4 pairs inside K) of weights as the low and high nibbles of each pair. */
static inline __attribute__((always_inline)) void quad_unpack(const uint8_t *bq, int q, __m256i lo[4], __m256i hi[4]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < 4; j++) {
        __m256i v = j < q ? _mm256_loadu_si256((const __m256i *)(bq + j * 32)) : _mm256_setzero_si256();
        lo[j] = _mm256_and_si256(v, low4);
        hi[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    }
}

/* acc + one row's quad against the unpacked weights, scaled by the weight scales sw times the row's. */
static inline __attribute__((always_inline)) __m256 quad_fma(const char *row, const __m256i lo[4], const __m256i hi[4],
                                                             __m256 sw, __m256 acc) {
    __m256 s = _mm256_mul_ps(sw, _mm256_loadu_ps((const float *)(row + 288)));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(quad_dot(row, lo, hi)), s, acc);
}

/* The last quad of a K that is not a multiple of 256 (K = 576: 2 quads and 1 pair; 960: 7 and 2) holds
 * 1 or 2 pairs: their block sums reduced alone and placed in their u slots (first blocks at 0..q-1, second
 * at 4..3+q), the other slots 0, as the full quad's tree would give them from zero padding. The same int32
 * sums, so the same floats, for 2-4 vpdpbusd a row instead of 8 and a shorter reduction. */
static inline __m256i part_dot1(const char *row, __m256i lo, __m256i hi) {
    __m256i d = pair_dot(row, lo, hi, 0);
    d = _mm256_add_epi32(d, _mm256_shuffle_epi32(d, 0x4E)); /* each 128-bit lane's 4 sums to its every lane */
    d = _mm256_add_epi32(d, _mm256_shuffle_epi32(d, 0xB1));
    return _mm256_maskz_add_epi32(0x11, d, _mm256_loadu_si256((const __m256i *)(row + 256)));
}

static inline __m256i part_dot2(const char *row, const __m256i lo[2], const __m256i hi[2]) {
    __m256i d[2] = {pair_dot(row, lo[0], hi[0], 0), pair_dot(row, lo[1], hi[1], 1)};
    __m256i t = _mm256_add_epi32(_mm256_unpacklo_epi32(d[0], d[1]), _mm256_unpackhi_epi32(d[0], d[1]));
    t = _mm256_add_epi32(t, _mm256_shuffle_epi32(t, 0x4E)); /* [S0 S1 S0 S1] per 128-bit lane */
    return _mm256_maskz_add_epi32(0x33, t, _mm256_loadu_si256((const __m256i *)(row + 256)));
}

static inline __attribute__((always_inline)) __m256 part_fma(const char *row, int q, const __m256i lo[4],
                                                             const __m256i hi[4], __m256 sw, __m256 acc) {
    __m256 s = _mm256_mul_ps(sw, _mm256_loadu_ps((const float *)(row + 288)));
    __m256i u = q == 1 ? part_dot1(row, lo[0], hi[0]) : part_dot2(row, lo, hi);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(u), s, acc);
}

/* ROWS rows' share of one quad (q of its 4 pairs inside K), row r at ROW_AT(r): the weights unpacked once. */
#define QUAD_ROWS(ROWS, ROW_AT)                                                                              \
    do {                                                                                                     \
        __m256i lo[4], hi[4];                                                                                \
        quad_unpack(bq, q, lo, hi);                                                                          \
        if (q <= 2) {                                                                                        \
            _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; r++)                                         \
                acc[r] = part_fma(ROW_AT(r), q, lo, hi, sw, acc[r]);                                         \
        } else {                                                                                             \
            _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; r++)                                         \
                acc[r] = quad_fma(ROW_AT(r), lo, hi, sw, acc[r]);                                            \
        }                                                                                                    \
    } while (0)

/* One quad (q of its 4 pairs inside K) of one column against ROWS rows. */
#define QUAD_STEP(ROWS, FMT)                                                                                  \
    static inline __attribute__((always_inline)) void step_##ROWS##_##FMT(                                   \
        const char *tq, size_t stride, const uint8_t *bq, const void *sn, int64_t p, int q, __m256 *acc) {    \
        __m256 sw = quad_scales_##FMT(sn, p, q);                                                             \
        QUAD_ROWS(ROWS, STEP_ROW);                                                                           \
    }
#define STEP_ROW(r) (tq + (size_t)((r) / 4) * stride + ((r) % 4) * QUAD_ROW)

/* Columns [n0, n1) against the ROWS rows of ROWS / 4 full tiles `stride` bytes apart, or (ROWS < 4) against
 * one partial tile of ROWS rows, over the pairs [0, pairs) of the quads t0 starts at; b and s point at
 * column 0's first pair and its scales, columns nb blocks apart. The column loop is inside the function so
 * its set-up is paid once a call, not once a column (+5% at decode with K = 2048, single-threaded). Each
 * column's float sum is closed every QGEMM_K_CHUNK_PAIRS pairs also when a call covers all of K, so a row's
 * result is bit for bit the same at decode (1 row), in a verification chunk of k + 1 rows and in a prompt
 * chunked along K (speculative decoding's greedy exactness rests on it). */
#define QUAD_COLUMN(ROWS, FMT)                                                                               \
    QUAD_STEP(ROWS, FMT)                                                                                     \
    static void column_##ROWS##_##FMT(const char *t0, size_t stride, const uint8_t *b, const char *s,        \
                                      size_t scale_bytes, int64_t nb, int64_t n0, int64_t n1, int64_t pairs, \
                                      float *y, int64_t N, int add) {                                        \
        const int64_t quad_bytes = (ROWS < 4 ? ROWS : 4) * QUAD_ROW;                                         \
        for (int64_t n = n0; n < n1; n++) {                                                                  \
            const uint8_t *bn = b + n * nb * 16;                                                             \
            const void *sn = s + (size_t)(n * nb) * scale_bytes;                                             \
            float sum[ROWS];                                                                                 \
            for (int r = 0; r < ROWS; r++) sum[r] = add ? y[r * N + n] : 0.0f;                               \
            for (int64_t c0 = 0; c0 < pairs; c0 += QGEMM_K_CHUNK_PAIRS) {                                           \
                int64_t c1 = c0 + QGEMM_K_CHUNK_PAIRS < pairs ? c0 + QGEMM_K_CHUNK_PAIRS : pairs, p = c0;                  \
                __m256 acc[ROWS];                                                                            \
                for (int r = 0; r < ROWS; r++) acc[r] = _mm256_setzero_ps();                                 \
                for (; p + 4 <= c1; p += 4) {                                                                \
                    if (ROWS == 1) { /* QGEMM_PREFETCH ahead: 1.2x at 1 KB -> 8 KB on an Intel Xeon (qgemm.h); \
                                      * on Zen 4 1-4 KB or none were within noise at 1B shapes */           \
                        _mm_prefetch((const char *)(bn + p * 32 + QGEMM_PREFETCH), _MM_HINT_T0);             \
                        _mm_prefetch((const char *)(bn + p * 32 + QGEMM_PREFETCH + 64), _MM_HINT_T0);        \
                    }                                                                                        \
                    step_##ROWS##_##FMT(t0 + p / 4 * quad_bytes, stride, bn + p * 32, sn, p, 4, acc);        \
                }                                                                                            \
                if (p < c1)                                                                                  \
                    step_##ROWS##_##FMT(t0 + p / 4 * quad_bytes, stride, bn + p * 32, sn, p, (int)(c1 - p), acc); \
                for (int r = 0; r < ROWS; r++) sum[r] += hsum8(acc[r]);                                      \
            }                                                                                                \
            for (int r = 0; r < ROWS; r++) y[r * N + n] = sum[r];                                            \
        }                                                                                                    \
    }
/* 4 + REST rows (5..7) with the weights unpacked once: the full tile's rows `stride` bytes from the partial
 * tile's (which packs REST rows a quad), as a speculative verification chunk of 5-7 rows has them (two
 * calls, a 4-row and a REST-row one, unpacked the weights twice: 5 rows cost 1.26x 4 rows). */
#define SPLIT_ROW(r)                                                                                         \
    ((r) < 4 ? t0 + (size_t)(p / 4) * 4 * QUAD_ROW + (r) * QUAD_ROW                                         \
             : t1 + (size_t)(p / 4) * REST_ROWS * QUAD_ROW + ((r) - 4) * QUAD_ROW)
#define QUAD_SPLIT(REST, FMT)                                                                                \
    static inline __attribute__((always_inline)) void step_4p##REST##_##FMT(                                 \
        const char *t0, const char *t1, const uint8_t *bq, const void *sn, int64_t p, int q, __m256 *acc) {  \
        enum { REST_ROWS = REST };                                                                           \
        __m256 sw = quad_scales_##FMT(sn, p, q);                                                             \
        QUAD_ROWS(4 + REST, SPLIT_ROW);                                                                      \
    }                                                                                                        \
    static void column_4p##REST##_##FMT(const char *t0, const char *t1, const uint8_t *b, const char *s,     \
                                        size_t scale_bytes, int64_t nb, int64_t n0, int64_t n1, int64_t pairs, \
                                        float *y, int64_t N, int add) {                                      \
        enum { ROWS = 4 + REST };                                                                            \
        for (int64_t n = n0; n < n1; n++) {                                                                  \
            const uint8_t *bn = b + n * nb * 16;                                                             \
            const void *sn = s + (size_t)(n * nb) * scale_bytes;                                             \
            float sum[ROWS];                                                                                 \
            for (int r = 0; r < ROWS; r++) sum[r] = add ? y[r * N + n] : 0.0f;                               \
            for (int64_t c0 = 0; c0 < pairs; c0 += QGEMM_K_CHUNK_PAIRS) {                                    \
                int64_t c1 = c0 + QGEMM_K_CHUNK_PAIRS < pairs ? c0 + QGEMM_K_CHUNK_PAIRS : pairs, p = c0;    \
                __m256 acc[ROWS];                                                                            \
                for (int r = 0; r < ROWS; r++) acc[r] = _mm256_setzero_ps();                                 \
                for (; p + 4 <= c1; p += 4) step_4p##REST##_##FMT(t0, t1, bn + p * 32, sn, p, 4, acc);       \
                if (p < c1) step_4p##REST##_##FMT(t0, t1, bn + p * 32, sn, p, (int)(c1 - p), acc);           \
                for (int r = 0; r < ROWS; r++) sum[r] += hsum8(acc[r]);                                      \
            }                                                                                                \
            for (int r = 0; r < ROWS; r++) y[r * N + n] = sum[r];                                            \
        }                                                                                                    \
    }
QUAD_SPLIT(1, f32)
QUAD_SPLIT(2, f32)
QUAD_SPLIT(3, f32)
QUAD_SPLIT(1, f16)
QUAD_SPLIT(2, f16)
QUAD_SPLIT(3, f16)

typedef void (*SplitFn)(const char *, const char *, const uint8_t *, const char *, size_t, int64_t, int64_t, int64_t,
                        int64_t, float *, int64_t, int);
static const SplitFn k_split[2][3] = { /* [fp16][rest - 1] of a 4 + rest row call */
    {column_4p1_f32, column_4p2_f32, column_4p3_f32},
    {column_4p1_f16, column_4p2_f16, column_4p3_f16},
};

QUAD_COLUMN(1, f32)
QUAD_COLUMN(2, f32)
QUAD_COLUMN(3, f32)
QUAD_COLUMN(4, f32)
QUAD_COLUMN(8, f32)
QUAD_COLUMN(1, f16)
QUAD_COLUMN(2, f16)
QUAD_COLUMN(3, f16)
QUAD_COLUMN(4, f16)
QUAD_COLUMN(8, f16)

typedef void (*ColumnFn)(const char *, size_t, const uint8_t *, const char *, size_t, int64_t, int64_t, int64_t, int64_t,
                         float *, int64_t, int);
static const ColumnFn k_full[2][2] = { /* [fp16][tiles - 1] */
    {column_4_f32, column_8_f32},
    {column_4_f16, column_8_f16},
};
static const ColumnFn k_part[2][3] = { /* [fp16][rows - 1] of the last, partial tile */
    {column_1_f32, column_2_f32, column_3_f32},
    {column_1_f16, column_2_f16, column_3_f16},
};

/* p0 is a multiple of 4 (column_task's K chunks are 16 pairs). */
static void tile(const void *scratch, int64_t r0, int m, const uint8_t *B, const void *scales, int fp16_scales,
                 int64_t K, int64_t N, int64_t n0, int64_t n1, int64_t p0, int64_t p1, float *y,
                 int64_t M) {
    (void)M; /* every row count rounds alike (avx512vnni) or is capped by kernels.py (avx2) */
    int64_t nb = K / 32, pairs = p1 - p0;
    size_t scale_bytes = fp16_scales ? 2 : 4, stride = (size_t)quads_of(K) * 4 * QUAD_ROW;
    int add = p0 > 0, full = m / 4, rest = m % 4, f16 = fp16_scales != 0;
    const uint8_t *b0 = B + p0 * 32;
    const char *s0 = (const char *)scales + (size_t)(2 * p0) * scale_bytes;
    if (full == 1 && rest) {
        const char *t0 = quad_tile(scratch, K, r0) + (p0 / 4) * 4 * QUAD_ROW;
        const char *t1 = quad_tile(scratch, K, r0 + 4) + (p0 / 4) * rest * QUAD_ROW;
        k_split[f16][rest - 1](t0, t1, b0, s0, scale_bytes, nb, n0, n1, pairs, y, N, add);
        return;
    }
    for (int part = 0; part < 2; part++) {
        int rows = part ? rest : full * 4;
        if (!rows) continue;
        const char *t = quad_tile(scratch, K, r0 + part * full * 4) + (p0 / 4) * (rows < 4 ? rows : 4) * QUAD_ROW;
        ColumnFn column = part ? k_part[f16][rest - 1] : k_full[f16][full - 1];
        column(t, stride, b0, s0, scale_bytes, nb, n0, n1, pairs, y + (int64_t)part * full * 4 * N, N, add);
    }
}

const QImpl q4_avx512vnni = {"avx512vnni", 8, scratch_bytes, quantize_row, tile};

#include "vnni_end.h"
