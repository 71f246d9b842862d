/* MatMulQ8's kernel body (q8gemm.h), written once for both implementations, in two modes: `d` for decode
 * (M < 4) and `p` for prompts (M >= 4), which may store the activation codes differently. Weights and
 * activations meet either a block (32 k) at a time (prompt rows in full tiles of calls of more than
 * Q8_TREE_ROWS rows: `lanes`) or a pair of blocks (64 k) at a time (every other row: `tree`), each 256-bit
 * register then holding the two blocks' halves side by side, so one register of partial sums holds two
 * blocks (one per 128-bit lane) and a quad's 8 blocks need 4 of them, as MatMulQ4's kernel does. The
 * including file defines, for its instruction set and each mode m:
 *   Q8Pair                                       one pair of one column's blocks (64 bytes), prepared
 *   Q8Pair q8_pair_zero(void)                    a pair that contributes nothing (beyond K)
 *   Q8Pair q8_pair_load_m(const uint8_t *bq, int j)         pair j (0..3) of a column's quad at bq
 *   __m256i q8_pair_dot_m(const char *row, Q8Pair w, int j) pair j of one row's quad against it: 8 int32
 *                                                partial sums (4 a block, low lane the pair's first
 *                                                block), exact
 *   Q8Blk, q8_blk_zero, q8_blk_load_p(bq, j), q8_blk_dot_p(row, w, j)   the same for block j (0..7) of a
 *                                                quad, prompt mode only (lanes): 8 partial sums of it
 *   Q8_X_BIAS_m                                  what the activation codes are stored plus (0 or 128)
 *   Q8_ZP_m                                      1 where the sums still hold B's zero point's share, which
 *                                                the layout's zp then removes (decode mode only)
 * and gets the static functions below, for `const QImpl q8_...`.
 *
 *   per column n, per quad of 256 k (8 blocks, 4 pairs), the weights loaded once for up to 8 rows:
 *     tree:  d_j = q8_pair_dot(row, j), j = 0..3 ─► unpack/add tree ─► u [8 blocks]
 *            ─► acc_row += float(u) * sx_row[8 blocks]       (one FMA a quad: suits few rows)
 *     lanes: acc_row += float(q8_blk_dot(row, j)) * sx_row[j], j = 0..7: no shuffles, and a partial last
 *            quad costs only its blocks (+18-54% at M = 128 single-threaded, K = 1536 and 576)
 *   Calls of at most Q8_TREE_ROWS rows take the tree for every row, so a speculative verification chunk
 *   rounds each row exactly as a decode step (the integer sums are exact). Pairs, not blocks, in the tree:
 *   a quad's sums in 4 registers instead of 8 take half the shuffles (1.2x at M = 8, 2 threads); the
 *   lanes loop kept blocks (pairs there cost a scale permute a pair: 0.9x at M = 128)
 *   y[row][n] = scales[n] * hsum(acc_row)                       the weight scale applied once a column
 *
 * Activations, in quad.h's layout: per row and quad
 *   xq int8  [256]  the codes + Q8_X_BIAS_m; lanes rows in k order; tree rows per pair j at j * 64: [first
 *                   block's k 0-15 | second's k 0-15] then [first's k 16-31 | second's k 16-31]
 *   zp int32 [8]    -128 * each block's code sum (B holds codes + 128)
 *   sx float [8]    each block's scale
 * zp and sx in block order for lanes rows, in u's order for tree rows: the pairs' first blocks, then their
 * second blocks                                                                                        */
#ifndef EDGE_Q8KERNEL_H
#define EDGE_Q8KERNEL_H

#include "q8gemm.h"
#include "quad.h"

/* d_0..d_7 (8 int32 partial sums of one block each) ─► [sum d_0, ..., sum d_7]. Unpacks, not vphaddd: 1.2-1.5x
 * faster at M = 3 (vphaddd also lost as the M >= 4 reduction: 55 against 74 GMAC/s). */
static inline __m256i q8_sum_blocks(const __m256i d[8]) {
    __m256i t[4];
    for (int i = 0; i < 4; i++) /* per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] of d[2i], d[2i+1] */
        t[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(d[2 * i], d[2 * i + 1]), _mm256_unpackhi_epi32(d[2 * i], d[2 * i + 1]));
    __m256i a = _mm256_add_epi32(_mm256_unpacklo_epi64(t[0], t[1]), _mm256_unpackhi_epi64(t[0], t[1]));
    __m256i b = _mm256_add_epi32(_mm256_unpacklo_epi64(t[2], t[3]), _mm256_unpackhi_epi64(t[2], t[3]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* d_0..d_3 (per lane 4 int32 partial sums of one block) ─► u = [blocks 0, 2, 4, 6 | 1, 3, 5, 7], each the sum
 * of its 4 partials. */
static inline __m256i q8_sum_pairs(const __m256i d[4]) {
    __m256i t01 = _mm256_add_epi32(_mm256_unpacklo_epi32(d[0], d[1]), _mm256_unpackhi_epi32(d[0], d[1]));
    __m256i t23 = _mm256_add_epi32(_mm256_unpacklo_epi32(d[2], d[3]), _mm256_unpackhi_epi32(d[2], d[3]));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(t01, t23), _mm256_unpackhi_epi64(t01, t23));
}

/* q8_sum_pairs for the last quad of a K that is not a multiple of 256 (K = 576: 2 quads and 1 pair; 960: 7 and
 * 2), holding 1 or 2 pairs: their sums alone, in their u slots (first blocks 0..pairs-1, second blocks
 * 4..3+pairs), the others 0, as the full tree gives them from zero padding (the partial quad was a third
 * of a K = 576 row's vector work, for a ninth of its weights). */
static inline __m256i q8_sum_part(const __m256i d[2], int pairs) {
    __m256i t = d[0];
    if (pairs == 2) t = _mm256_add_epi32(_mm256_unpacklo_epi32(d[0], d[1]), _mm256_unpackhi_epi32(d[0], d[1]));
    t = _mm256_add_epi32(t, _mm256_shuffle_epi32(t, 0x4E)); /* 1 pair: each lane's 4 sums to its every slot; */
    if (pairs == 1) t = _mm256_add_epi32(t, _mm256_shuffle_epi32(t, 0xB1)); /* 2: [S0 S1 S0 S1] a lane */
    const __m256i zero = _mm256_setzero_si256();
    return pairs == 1 ? _mm256_blend_epi32(zero, t, 0x11) : _mm256_blend_epi32(zero, t, 0x33);
}

static size_t scratch_bytes(int64_t K, int64_t M) { return quad_scratch_bytes(K, M); }

/* Calls of at most this many rows use decode's arithmetic (the sum tree) for every row, so a verification
 * chunk of k + 1 rows rounds each row as a decode step does (kernels.py's exact_rows); above it, prompts'
 * full tiles take the per-block FMAs. */
#define Q8_TREE_ROWS 16

/* Whether row r of M goes through the tree (pairs layout) or the lanes (k order): the lanes take the full
 * tiles of calls above Q8_TREE_ROWS rows (tile() below). */
static inline int q8_tree_row(int64_t M, int64_t r) { return M <= Q8_TREE_ROWS || r >= M - M % 4; }

/* Whether decode (M < 4) takes pairs too (Q8_DECODE_PAIRS 1), or blocks through the 8-register tree with the
 * same u order (0: the AVX2 kernel, where a single row does not repay the pairs' two weight permutes: 0.9x
 * in cache). */
static inline int q8_paired_row(int64_t M, int64_t r) { return q8_tree_row(M, r) && (M >= 4 || Q8_DECODE_PAIRS); }

static void quantize_row(const float *x, int64_t K, int64_t M, void *scratch, int64_t r) {
    const int bias = M < 4 ? Q8_X_BIAS_d : Q8_X_BIAS_p, paired = q8_paired_row(M, r), u_order = q8_tree_row(M, r);
    int64_t quads = quads_of(K);
    if ((K / 64) % 4) memset(quad_row(scratch, K, M, r, quads - 1), 0, QUAD_ROW);
    for (int64_t b = 0; b < K / 32; b++) {
        int32_t q[32];
        float scale = quantize_block(x + b * 32, q);
        char *row = quad_row(scratch, K, M, r, b / 8);
        int j = (int)(b % 8) / 2, h = (int)(b % 2), slot = u_order ? h * 4 + j : (int)(b % 8);
        uint8_t *xq = (uint8_t *)row + (paired ? j * 64 + h * 16 : (b % 8) * 32);
        int32_t sum = 0;
        for (int e = 0; e < 32; e++) {
            xq[paired && e >= 16 ? e + 16 : e] = (uint8_t)(q[e] + bias);
            sum += q[e];
        }
        ((int32_t *)(row + 256))[slot] = -128 * sum;
        ((float *)(row + 288))[slot] = scale;
    }
}

/* A quad's weights, from the including file's per-pair (tree) or per-block (lanes) functions. */
typedef struct {
    Q8Pair pair[4];
} Q8W;

typedef struct {
    Q8Blk blk[8];
} Q8B;

typedef Q8W Q8W_p;
#if Q8_DECODE_PAIRS
typedef Q8W Q8W_d;
#else
typedef Q8B Q8W_d;
#endif

#define Q8_TREE_FN(MODE)                                                                                       \
    static inline __attribute__((always_inline)) void q8_load_##MODE(const uint8_t *bq, int pairs, Q8W *w) {   \
        for (int j = 0; j < 4; j++) w->pair[j] = j < pairs ? q8_pair_load_##MODE(bq, j) : q8_pair_zero();     \
    }                                                                                                          \
    static inline __attribute__((always_inline)) __m256 q8_tree_##MODE(const char *row, const Q8W *w, int pairs,   \
                                                                       __m256 acc) {                           \
        __m256i d[4], u;                                                                                       \
        if (pairs <= 2) {                                                                                      \
            for (int j = 0; j < pairs; j++) d[j] = q8_pair_dot_##MODE(row, w->pair[j], j);                     \
            u = q8_sum_part(d, pairs);                                                                         \
        } else {                                                                                               \
            for (int j = 0; j < 4; j++) d[j] = q8_pair_dot_##MODE(row, w->pair[j], j); /* zero beyond K */     \
            u = q8_sum_pairs(d);                                                                               \
        }                                                                                                      \
        if (Q8_ZP_##MODE) u = _mm256_add_epi32(u, _mm256_loadu_si256((const __m256i *)(row + 256)));         \
        return _mm256_fmadd_ps(_mm256_cvtepi32_ps(u), _mm256_loadu_ps((const float *)(row + 288)), acc);       \
    }
Q8_TREE_FN(p)
#if Q8_DECODE_PAIRS
Q8_TREE_FN(d)
#else
/* Decode by blocks (k order), summed in u's order: what the pairs' tree sums, in the same lanes. */
static inline __attribute__((always_inline)) void q8_load_d(const uint8_t *bq, int pairs, Q8B *w) {
    for (int j = 0; j < 8; j++) w->blk[j] = j < 2 * pairs ? q8_blk_load_d(bq, j) : q8_blk_zero();
}

static inline __attribute__((always_inline)) __m256 q8_tree_d(const char *row, const Q8B *w, int pairs, __m256 acc) {
    (void)pairs; /* blocks beyond K are zero */
    static const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    __m256i d[8];
    for (int j = 0; j < 8; j++) d[j] = q8_blk_dot_d(row, w->blk[order[j]], order[j]); /* zero beyond K: no sum */
    __m256i u = q8_sum_blocks(d);
    if (Q8_ZP_d) u = _mm256_add_epi32(u, _mm256_loadu_si256((const __m256i *)(row + 256)));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(u), _mm256_loadu_ps((const float *)(row + 288)), acc);
}
#endif

/* One lanes row's quad (its `pairs` inside K) against the weights, into acc. */
static inline __attribute__((always_inline)) __m256 q8_lanes(const char *row, const Q8B *w, int pairs, __m256 acc) {
    const float *sx = (const float *)(row + 288);
    for (int j = 0; j < 8 && j < 2 * pairs; j++)
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_blk_dot_p(row, w->blk[j], j)), _mm256_set1_ps(sx[j]), acc);
    return acc;
}

/* One quad (`pairs` of its 4 inside K) of one column against ROWS rows: the weights are loaded once.
 * NAME's rows go through the sum tree (TREE, or fewer than 4 rows; MODE d or p) or per block (lanes). */
#define Q8_STEP(ROWS, MODE, NAME, TREE)                                                                      \
    static inline __attribute__((always_inline)) void step_##ROWS##_##NAME(                                  \
        const char *tq, size_t stride, const uint8_t *bq, int pairs, __m256 *acc) {                          \
        if (ROWS >= 4 && !(TREE)) {                                                                          \
            Q8B w;                                                                                           \
            for (int j = 0; j < 8; j++) w.blk[j] = j < 2 * pairs ? q8_blk_load_p(bq, j) : q8_blk_zero();     \
            _Pragma("GCC unroll 8") for (int r = 0; r < ROWS; r++)                                          \
                acc[r] = q8_lanes(tq + (size_t)(r / 4) * stride + (r % 4) * QUAD_ROW, &w, pairs, acc[r]);    \
        } else {                                                                                             \
            Q8W_##MODE w;                                                                                    \
            q8_load_##MODE(bq, pairs, &w);                                                                   \
            _Pragma("GCC unroll 8") for (int r = 0; r < ROWS; r++)                                          \
                acc[r] = q8_tree_##MODE(tq + (size_t)(r / 4) * stride + (r % 4) * QUAD_ROW, &w, pairs, acc[r]); \
        }                                                                                                    \
    }

/* Columns [n0, n1) against the ROWS rows of ROWS / 4 full tiles `stride` bytes apart, or (ROWS < 4) one
 * partial tile of ROWS rows, over the pairs [0, pairs) of the quads t0 starts at; b points at column 0's
 * first pair, columns K bytes apart. A column's sum is closed (and scaled) every QGEMM_K_CHUNK_PAIRS pairs,
 * where matmul_op.c splits a prompt's K, so a call over all of K rounds as the split calls do. */
#define Q8_COLUMN(ROWS, MODE, NAME, TREE)                                                                    \
    Q8_STEP(ROWS, MODE, NAME, TREE)                                                                          \
    static void column_##ROWS##_##NAME(const char *t0, size_t stride, const uint8_t *b, const float *s, int64_t K,     \
                              int64_t n0, int64_t n1, int64_t pairs, float *y, int64_t N, int add) {         \
        const int64_t quad_bytes = (ROWS < 4 ? ROWS : 4) * QUAD_ROW;                                         \
        for (int64_t n = n0; n < n1; n++) {                                                                  \
            const uint8_t *bn = b + n * K;                                                                   \
            float sum[ROWS];                                                                                 \
            for (int r = 0; r < ROWS; r++) sum[r] = add ? y[r * N + n] : 0.0f;                               \
            for (int64_t c0 = 0; c0 < pairs; c0 += QGEMM_K_CHUNK_PAIRS) {                                    \
                int64_t c1 = c0 + QGEMM_K_CHUNK_PAIRS < pairs ? c0 + QGEMM_K_CHUNK_PAIRS : pairs, p = c0;    \
                __m256 acc[ROWS];                                                                            \
                for (int r = 0; r < ROWS; r++) acc[r] = _mm256_setzero_ps();                                 \
                for (; p + 4 <= c1; p += 4) {                                                                \
                    if (ROWS == 1) /* decode streams the weights: the quad QGEMM_PREFETCH ahead (qgemm.h) */ \
                        for (int l = 0; l < 4; l++)                                                          \
                            _mm_prefetch((const char *)(bn + p * 64 + QGEMM_PREFETCH + 64 * l), _MM_HINT_T0); \
                    step_##ROWS##_##NAME(t0 + p / 4 * quad_bytes, stride, bn + p * 64, 4, acc);              \
                }                                                                                            \
                if (p < c1)                                                                                  \
                    step_##ROWS##_##NAME(t0 + p / 4 * quad_bytes, stride, bn + p * 64, (int)(c1 - p), acc);  \
                for (int r = 0; r < ROWS; r++) sum[r] += s[n] * hsum8(acc[r]);                               \
            }                                                                                                \
            for (int r = 0; r < ROWS; r++) y[r * N + n] = sum[r];                                            \
        }                                                                                                    \
    }
Q8_COLUMN(1, d, d, 1)
Q8_COLUMN(2, d, d, 1)
Q8_COLUMN(3, d, d, 1)
Q8_COLUMN(1, p, p, 1)
Q8_COLUMN(2, p, p, 1)
Q8_COLUMN(3, p, p, 1)
Q8_COLUMN(4, p, p, 0)
Q8_COLUMN(8, p, p, 0)
Q8_COLUMN(4, p, t, 1) /* full tiles of a call of at most Q8_TREE_ROWS rows: decode's arithmetic */
Q8_COLUMN(8, p, t, 1)

/* Eight rows against two columns at a time, block by block (lanes): each row's activation load and scale
 * broadcast then serve two columns' vpdpbusd (loads, not arithmetic, bound the one-column loop). */
static void column_8x2_p(const char *t0, size_t stride, const uint8_t *b, const float *s, int64_t K, int64_t n0,
                         int64_t n1, int64_t pairs, float *y, int64_t N, int add) {
    const int64_t quad_bytes = 4 * QUAD_ROW;
    int64_t n = n0;
    for (; n + 2 <= n1; n += 2) {
        const uint8_t *b0 = b + n * K, *b1 = b0 + K;
        __m256 a0[8], a1[8];
        for (int r = 0; r < 8; r++) a0[r] = a1[r] = _mm256_setzero_ps();
        float sum0[8], sum1[8];
        for (int r = 0; r < 8; r++) sum0[r] = add ? y[r * N + n] : 0.0f, sum1[r] = add ? y[r * N + n + 1] : 0.0f;
        for (int64_t p = 0; p < pairs; p += 4) {
            int blocks = pairs - p >= 4 ? 8 : (int)(pairs - p) * 2;
            const char *tq = t0 + p / 4 * quad_bytes;
            for (int j = 0; j < blocks; j++) {
                Q8Blk w0 = q8_blk_load_p(b0 + p * 64, j), w1 = q8_blk_load_p(b1 + p * 64, j);
                _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++) {
                    const char *row = tq + (size_t)(r / 4) * stride + (r % 4) * QUAD_ROW;
                    __m256 sx = _mm256_set1_ps(((const float *)(row + 288))[j]);
                    a0[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_blk_dot_p(row, w0, j)), sx, a0[r]);
                    a1[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_blk_dot_p(row, w1, j)), sx, a1[r]);
                }
            }
            if ((p + 4) % QGEMM_K_CHUNK_PAIRS == 0 || p + 4 >= pairs) /* close the sums where a chunk ends */
                for (int r = 0; r < 8; r++) {
                    sum0[r] += s[n] * hsum8(a0[r]), sum1[r] += s[n + 1] * hsum8(a1[r]);
                    a0[r] = a1[r] = _mm256_setzero_ps();
                }
        }
        for (int r = 0; r < 8; r++) y[r * N + n] = sum0[r], y[r * N + n + 1] = sum1[r];
    }
    if (n < n1) column_8_p(t0, stride, b, s, K, n, n1, pairs, y, N, add);
}

typedef void (*Q8ColumnFn)(const char *, size_t, const uint8_t *, const float *, int64_t, int64_t, int64_t,
                           int64_t, float *, int64_t, int);


/* p0 is a multiple of 4 (matmul_op.c's K chunks are 16 pairs). M < 4 (decode mode) is one call with r0 = 0. */
static void tile(const void *scratch, int64_t r0, int m, const uint8_t *B, const void *scales, int fp16_scales,
                 int64_t K, int64_t N, int64_t n0, int64_t n1, int64_t p0, int64_t p1, float *y,
                 int64_t M) {
    static const Q8ColumnFn full_tiles[2][2] = {{column_4_p, column_8x2_p}, {column_4_t, column_8_t}};
    static const Q8ColumnFn part_tile[2][3] = {{column_1_p, column_2_p, column_3_p}, {column_1_d, column_2_d, column_3_d}};
    (void)fp16_scales; /* float only: matmul_op.c checks */
    size_t stride = (size_t)quads_of(K) * 4 * QUAD_ROW;
    int add = p0 > 0, full = m / 4, rest = m % 4, decode = r0 == 0 && m < 4;
    for (int part = 0; part < 2; part++) {
        int rows = part ? rest : full * 4;
        if (!rows) continue;
        const char *t = quad_tile(scratch, K, r0 + part * full * 4) + (p0 / 4) * (rows < 4 ? rows : 4) * QUAD_ROW;
        Q8ColumnFn column = part ? part_tile[decode][rest - 1] : full_tiles[M <= Q8_TREE_ROWS][full - 1];
        column(t, stride, B + p0 * 64, scales, K, n0, n1, p1 - p0, y + (int64_t)part * full * 4 * N, N, add);
    }
}

#endif
