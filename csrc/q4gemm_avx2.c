/* AVX2 kernel for q4gemm.h. Why it beats MLAS at decode on this hardware: one 32-byte load feeds two
 * blocks, the nibbles are used unsigned (maddubs) against activations already permuted into the
 * weights' even/odd order, and the zero point's share is a precomputed int16 vector per pair, so the
 * inner loop is 8 vector ops per row and 64 weights (plus the unpack, shared by up to eight rows) with
 * no shuffles. */
#include "q4tile.h"

static size_t scratch_bytes(int64_t K, int64_t M) { return (size_t)((M + 3) / 4 * (K / 64)) * Q4_TILE_PAIR; }

static void quantize_row(const float *x, int64_t K, int64_t M, void *scratch, int64_t r) {
    char *tile = tile_at(scratch, K, r);
    int lane = (int)(r % 4);
    int rows = M - (r - lane) < 4 ? (int)(M - (r - lane)) : 4; /* in this tile */
    const __m256i eight = _mm256_set1_epi8(8);
    for (int64_t b = 0; b < K / 32; b++) {
        int32_t q[32];
        float scale = quantize_block(x + b * 32, q);
        int64_t p = b / 2, h = b % 2;
        char *t = tile + p * rows * 128;
        int8_t *even = TILE_XQ(t, rows, lane) + h * 16, *odd = TILE_XQ(t, rows, lane) + 32 + h * 16;
        for (int j = 0; j < 16; j++) {
            even[j] = (int8_t)q[2 * j];
            odd[j] = (int8_t)q[2 * j + 1];
        }
        for (int i = 0; i < 4; i++) TILE_SX(t, rows, lane)[h * 4 + i] = scale;
    }
    for (int64_t p = 0; p < K / 64; p++) {
        char *t = tile + p * rows * 128;
        __m256i xe = _mm256_loadu_si256((const __m256i *)TILE_XQ(t, rows, lane));
        __m256i xo = _mm256_loadu_si256((const __m256i *)(TILE_XQ(t, rows, lane) + 32));
        __m256i c = _mm256_add_epi16(_mm256_maddubs_epi16(eight, xe), _mm256_maddubs_epi16(eight, xo));
        _mm256_storeu_si256((__m256i *)TILE_C(t, rows, lane), c);
    }
}

/* One row's share of one pair of blocks, added to `acc`: the nibbles (lo, hi) against the row's permuted
 * int8 activations, less the zero point's precomputed share, scaled by weight x activation scales. Every
 * column shape below calls it, so all of them round a row alike. */
static inline __attribute__((always_inline)) __m256 pair_fma(__m256i lo, __m256i hi, __m256 sw, const char *t, int m,
                                                             int lane, __m256 acc) {
    const int8_t *xq = TILE_XQ(t, m, lane);
    __m256i d = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)xq)),
                                 _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xq + 32))));
    d = _mm256_sub_epi16(d, _mm256_loadu_si256((const __m256i *)TILE_C(t, m, lane)));
    __m256 df = _mm256_cvtepi32_ps(_mm256_madd_epi16(d, _mm256_set1_epi16(1)));
    return _mm256_fmadd_ps(df, _mm256_mul_ps(sw, _mm256_loadu_ps(TILE_SX(t, m, lane))), acc);
}

/* One column `n` against m rows (m in 1..4). Weight bytes are unpacked once and used m times. */
#define Q4_COLUMN(M, FMT)                                                                               \
    static inline void column_##M##_##FMT(const char *tile, const uint8_t *bn, const void *sn,          \
                                          int64_t pairs, float *y, int64_t N, int add) {                \
        const __m256i low4 = _mm256_set1_epi8(0x0F);                                                    \
        const __m256i lanes = _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0);                                 \
        __m256 acc[M];                                                                                  \
        for (int r = 0; r < M; r++) acc[r] = _mm256_setzero_ps();                                       \
        for (int64_t p = 0; p < pairs; p++) {                                                           \
            /* 1 KB ahead: +3-5% at decode, paired in chains of 135M- and 1B-shaped matrices */       \
            _mm_prefetch((const char *)(bn + p * 32 + 1024), _MM_HINT_T0);                              \
            __m256i v = _mm256_loadu_si256((const __m256i *)(bn + p * 32));                             \
            __m256i lo = _mm256_and_si256(v, low4);                                                     \
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);                               \
            __m256 sw = pair_scales_##FMT(sn, p, lanes);                                                \
            const char *t = tile + p * M * 128;                                                         \
            for (int r = 0; r < M; r++) acc[r] = pair_fma(lo, hi, sw, t, M, r, acc[r]);              \
        }                                                                                               \
        for (int r = 0; r < M; r++) y[r * N] = (add ? y[r * N] : 0.0f) + hsum8(acc[r]);                 \
    }
Q4_COLUMN(1, f32)
Q4_COLUMN(2, f32)
Q4_COLUMN(3, f32)
Q4_COLUMN(4, f32)
Q4_COLUMN(1, f16)
Q4_COLUMN(2, f16)
Q4_COLUMN(3, f16)
Q4_COLUMN(4, f16)

/* One column against eight rows, two full tiles (t0: rows 0-3, t1: rows 4-7) sharing each unpacked
 * weight vector and its scales: half the unpack work per row of four (+9-19% at M=128 single-threaded,
 * bit-identical). Twelve rows spill registers and ran slower. */
#define Q4_COLUMN8(FMT)                                                                                  \
    static inline void column_8_##FMT(const char *t0, const char *t1, const uint8_t *bn, const void *sn, \
                                      int64_t pairs, float *y, int64_t N, int add) {                     \
        const __m256i low4 = _mm256_set1_epi8(0x0F);                                                     \
        const __m256i lanes = _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0);                                  \
        __m256 acc[8];                                                                                   \
        for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();                                        \
        for (int64_t p = 0; p < pairs; p++) {                                                            \
            __m256i v = _mm256_loadu_si256((const __m256i *)(bn + p * 32));                              \
            __m256i lo = _mm256_and_si256(v, low4);                                                      \
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);                                \
            __m256 sw = pair_scales_##FMT(sn, p, lanes);                                                 \
            const char *ta = t0 + p * Q4_TILE_PAIR, *tb = t1 + p * Q4_TILE_PAIR;                         \
            for (int r = 0; r < 8; r++) acc[r] = pair_fma(lo, hi, sw, r < 4 ? ta : tb, 4, r & 3, acc[r]);   \
        }                                                                                                \
        for (int r = 0; r < 8; r++) y[r * N] = (add ? y[r * N] : 0.0f) + hsum8(acc[r]);                  \
    }
Q4_COLUMN8(f32)
Q4_COLUMN8(f16)

/* Two to four rows (fp16 scales) summed exactly as the one-row decode below sums each row: pairs in
 * groups of four, even pairs into one accumulator and odd into another, the last pairs apart. A chunk of
 * up to four rows (a speculative verification) thus equals that many decode steps bit for bit. */
#define Q4_COLUMN_DECODE_ORDER(M)                                                                          \
    static inline void column_##M##_exact(const char *tile, const uint8_t *bn, const void *sn, int64_t pairs, \
                                          float *y, int64_t N, int add) {                                  \
        const __m256i low4 = _mm256_set1_epi8(0x0F);                                                       \
        const uint16_t *s16 = sn;                                                                          \
        __m256 acc0[M], acc1[M];                                                                           \
        for (int r = 0; r < M; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();                               \
        int64_t p = 0;                                                                                     \
        for (; p + 4 <= pairs; p += 4) {                                                                   \
            _mm_prefetch((const char *)(bn + p * 32 + 1024), _MM_HINT_T0);                                 \
            _mm_prefetch((const char *)(bn + p * 32 + 1088), _MM_HINT_T0);                                 \
            __m256 s8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s16 + 2 * p)));                  \
            for (int j = 0; j < 4; j++) {                                                                  \
                const char *t = tile + (p + j) * M * 128;                                                  \
                __m256i v = _mm256_loadu_si256((const __m256i *)(bn + (p + j) * 32));                      \
                __m256i lo = _mm256_and_si256(v, low4);                                                    \
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);                              \
                __m256 sw = _mm256_permutevar8x32_ps(s8, _mm256_set_epi32(2 * j + 1, 2 * j + 1, 2 * j + 1,  \
                                                                          2 * j + 1, 2 * j, 2 * j, 2 * j, 2 * j)); \
                for (int r = 0; r < M; r++) {                                                              \
                    if (j % 2)                                                                             \
                        acc1[r] = pair_fma(lo, hi, sw, t, M, r, acc1[r]);                                  \
                    else                                                                                   \
                        acc0[r] = pair_fma(lo, hi, sw, t, M, r, acc0[r]);                                  \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
        float rest[M];                                                                                     \
        for (int r = 0; r < M; r++) rest[r] = 0.0f;                                                        \
        if (p < pairs) column_##M##_f16(tile + p * M * 128, bn + p * 32, s16 + 2 * p, pairs - p, rest, 1, 0); \
        for (int r = 0; r < M; r++)                                                                        \
            y[r * N] = (add ? y[r * N] : 0.0f) + hsum8(_mm256_add_ps(acc0[r], acc1[r])) + rest[r];         \
    }
Q4_COLUMN_DECODE_ORDER(1)
Q4_COLUMN_DECODE_ORDER(2)
Q4_COLUMN_DECODE_ORDER(3)
Q4_COLUMN_DECODE_ORDER(4)

typedef void (*ColumnFn)(const char *, const uint8_t *, const void *, int64_t, float *, int64_t, int);
static const ColumnFn k_columns[2][4] = {
    {column_1_f32, column_2_f32, column_3_f32, column_4_f32},
    {column_1_exact, column_2_exact, column_3_exact, column_4_exact},
};

static void tile(const void *scratch, int64_t r0, int m, const uint8_t *B, const void *scales, int fp16_scales,
                 int64_t K, int64_t N, int64_t n0, int64_t n1, int64_t p0, int64_t p1, float *y,
                 int64_t M) {
    (void)M; /* every row count rounds alike (avx512vnni) or is capped by kernels.py (avx2) */
    int64_t nb = K / 32, pairs = p1 - p0;
    size_t scale_bytes = fp16_scales ? 2 : 4;
    int add = p0 > 0;
    const char *t0 = tile_at(scratch, K, r0), *t1 = tile_at(scratch, K, r0 + 4);
    const uint8_t *b0 = B + p0 * 32;
    const char *s0 = (const char *)scales + (size_t)(2 * p0) * scale_bytes;
    if (m == 8) {
        t0 += p0 * Q4_TILE_PAIR, t1 += p0 * Q4_TILE_PAIR;
        for (int64_t n = n0; n < n1; n++) {
            const uint8_t *bn = b0 + n * nb * 16;
            const char *sn = s0 + (size_t)(n * nb) * scale_bytes;
            if (fp16_scales)
                column_8_f16(t0, t1, bn, sn, pairs, y + n, N, add);
            else
                column_8_f32(t0, t1, bn, sn, pairs, y + n, N, add);
        }
        return;
    }
    for (int part = 0; part < 2 && m > part * 4; part++) { /* one or two tiles of at most four rows */
        int rows = m - part * 4 < 4 ? m - part * 4 : 4;
        ColumnFn column = k_columns[fp16_scales ? 1 : 0][rows - 1];
        const char *t = (part ? t1 : t0) + p0 * rows * 128;
        for (int64_t n = n0; n < n1; n++)
            column(t, b0 + n * nb * 16, s0 + (size_t)(n * nb) * scale_bytes, pairs, y + part * 4 * N + n, N, add);
    }
}

const QImpl q4_avx2 = {"avx2", 8, scratch_bytes, quantize_row, tile};
