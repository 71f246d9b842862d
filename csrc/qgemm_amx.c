/* AMX-INT8 implementations of MatMulQ4 and MatMulQ8 (qgemm.h) for prompts, on Intel Sapphire Rapids and
 * later. Calls of fewer than AMX_MIN_ROWS rows (decode, speculative verification chunks) run the VNNI
 * implementation unchanged, so those rows stay bit for bit what they were; larger calls meet the weights
 * in tiles:
 *
 *   16 rows x one block of activation codes (tmm A, 16 x 32 bytes)
 *   one block of 16 columns' signed weight codes, 4 k a column per 32-bit group (tmm B, 8 x 64 bytes)
 *     tdpbssd ─► C [16 rows][16 columns] int32: each (row, column)'s block sum, exact
 *     acc[row] += float(C[row]) * weight scales[16 columns] * the row's block scale    (AVX-512, fp32)
 *
 * One tdpbssd does 8,192 multiply-adds where the VNNI kernel issues 256 vpdpbusd; the per-block float work
 * (a convert, a multiply and an FMA per row and 16 columns) is what remains. A column block's weights are
 * unpacked once per call into the tile layout (nibbles or bytes to signed int8, 16 columns' 4-byte groups
 * interleaved) and shared by all of the call's rows (up to AMX_ROWS). The int32 block sums are the VNNI
 * kernels' exactly, so results differ from theirs only in float rounding order (tests/test_kernels.py).
 *
 * The tile instructions are written as inline assembly with memory clobbers: GCC 12's own intrinsics tell
 * the compiler that ldtilecfg reads 8 bytes of its 64-byte configuration and that tileloadd reads nothing,
 * so it may drop or sink the stores they depend on (llama.cpp's SIGILL at tilezero with GCC). */
#include "vnni_begin.h" /* first: everything below is compiled for AVX-512 VNNI */

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "qgemm.h"
#include "quad.h" /* quantize_block */

extern const QImpl q4_avx512vnni, q8_avx512vnni;

/* Fewer rows than this run the VNNI kernel: 16 rows is MatMulQ8's exact-rows cap and the largest
 * verification chunk, so speculative decoding's exactness contract (kernels.py's exact_rows) is unchanged
 * up to 16 rows for both ops. */
#define AMX_MIN_ROWS 17
#define AMX_ROWS 256 /* rows one tile call takes: the unpacked weights serve this many rows */
#define AMX_MAX_BLOCKS 32 /* blocks of K one tile call meets: matmul_op.c's chunk of 16 pairs */

#define TILE_LOAD(t, base, stride) \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"((const void *)(base)), "r"((long)(stride)) : "memory")
#define TILE_STORE(t, base, stride) \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"((void *)(base)), "r"((long)(stride)) : "memory")
#define TILE_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define TILE_DPBSSD(c, a, b) __asm__ volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

/* tmm0-3: C [16 rows][16 int32] of four blocks in flight; tmm4, 5: A, 16 rows x 32 code bytes; tmm6, 7: B,
 * 8 groups x 16 columns x 4 bytes. */
static void tiles_configure(void) {
    _Alignas(64) uint8_t cfg[64] = {0};
    uint16_t colsb[16] = {64, 64, 64, 64, 32, 32, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 8, 8};
    cfg[0] = 1; /* palette 1 */
    memcpy(cfg + 16, colsb, sizeof colsb);
    memcpy(cfg + 48, rows, sizeof rows);
    __asm__ volatile("ldtilecfg %0" ::"m"(*(const uint8_t(*)[64])cfg) : "memory");
}

static void tiles_release(void) { __asm__ volatile("tilerelease" ::: "memory"); }

/* ---- activations ----------------------------------------------------------------------------------
 * Per tile of 16 rows: codes int8 [K/32 blocks][16 rows][32] (a block's A tile: stride 32), then the
 * block scales float [K/32][16]. MatMulQ4 stores a block's codes [even k | odd k] (the order its weights'
 * low and high nibbles unpack to), MatMulQ8 in k order. Rows past M are zero, so their tile rows add
 * nothing anyone reads. */
static inline size_t tile_bytes(int64_t K) { return (size_t)(K / 32) * (16 * 32 + 16 * 4); }

static size_t amx_scratch_bytes(int64_t K, int64_t M) { return (size_t)((M + 15) / 16) * tile_bytes(K); }

static void amx_quantize_row(const float *x, int64_t K, int64_t M, void *scratch, int64_t r, int nibble_order) {
    int64_t nb = K / 32;
    char *tile = (char *)scratch + (size_t)(r / 16) * tile_bytes(K);
    int8_t *codes = (int8_t *)tile;
    float *sx = (float *)(tile + nb * 512);
    int lane = (int)(r % 16);
    /* the 32 codes as [even k | odd k] (MatMulQ4) or in k order (MatMulQ8) */
    const __m512i lo = nibble_order ? _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
                                    : _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(nibble_order ? 1 : 16));
    for (int64_t b = 0; b < nb; b++) {
        _Alignas(64) int32_t q[32];
        sx[b * 16 + lane] = quantize_block(x + b * 32, q);
        __m512i q0 = _mm512_load_si512(q), q1 = _mm512_load_si512(q + 16);
        int8_t *c = codes + b * 512 + lane * 32;
        _mm_storeu_si128((__m128i *)c, _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q0, lo, q1)));
        _mm_storeu_si128((__m128i *)(c + 16), _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q0, hi, q1)));
    }
    if (r == M - 1) /* the last row's task clears the tile's rows past M (no other task writes them) */
        for (int64_t b = 0; b < nb; b++)
            for (int l = lane + 1; l < 16; l++) {
                memset(codes + b * 512 + l * 32, 0, 32);
                sx[b * 16 + l] = 0.0f;
            }
}

/* ---- weights: one column block's B tile and scales ---------------------------------------------- */

/* Plain loads and an in-register transpose rather than vpgatherdd: CPUs with the Gather Data Sampling
 * (Downfall) mitigation run gathers in microcode. Here the two measured alike (17 and 128 rows). */

/* The 32-bit words 0-3 of 16 columns' 16 bytes (column n at p + n * stride; columns at or past `cols`
 * read column cols - 1, so nothing past the matrix is touched) as 4 rows of 16 words: R[g] =
 * [column 0's word g, ..., column 15's word g], a tile row's 16 columns x 4 bytes. */
static inline void columns_words(const uint8_t *p, size_t stride, int cols, __m512i R[4]) {
    __m512i z[4];
    for (int j = 0; j < 4; j++) {
        const uint8_t *c[4];
        for (int i = 0; i < 4; i++) c[i] = p + (size_t)(4 * j + i < cols ? 4 * j + i : cols - 1) * stride;
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)c[0]));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)c[1]), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)c[2]), 2);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)c[3]), 3);
        /* lane g <- word g of each of the 4 columns */
        z[j] = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), v);
    }
    __m512i t0 = _mm512_shuffle_i32x4(z[0], z[1], 0x44), t1 = _mm512_shuffle_i32x4(z[0], z[1], 0xEE);
    __m512i t2 = _mm512_shuffle_i32x4(z[2], z[3], 0x44), t3 = _mm512_shuffle_i32x4(z[2], z[3], 0xEE);
    R[0] = _mm512_shuffle_i32x4(t0, t2, 0x88), R[1] = _mm512_shuffle_i32x4(t0, t2, 0xDD);
    R[2] = _mm512_shuffle_i32x4(t1, t3, 0x88), R[3] = _mm512_shuffle_i32x4(t1, t3, 0xDD);
}

/* MatMulQ4: B [N][K/32][16] nibbles (byte j: k = 2j low, 2j + 1 high), zero point 8. Group g (0-3) of the
 * tile is each column's 32-bit word g, low nibbles (k = 8g + 2i); group 4 + g its high nibbles. */
static inline void q4_unpack_block(const uint8_t *bcol, size_t stride, int cols, int8_t out[8][64]) {
    const __m512i low4 = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
    __m512i R[4];
    columns_words(bcol, stride, cols, R);
    for (int g = 0; g < 4; g++) {
        _mm512_store_si512(out[g], _mm512_sub_epi8(_mm512_and_si512(R[g], low4), eight));
        _mm512_store_si512(out[4 + g], _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi32(R[g], 4), low4), eight));
    }
}

/* MatMulQ8: B [N][K] bytes (codes + 128). Group g of the tile is each column's k 4g..4g+3 of the block. */
static inline void q8_unpack_block(const uint8_t *bcol, size_t stride, int cols, int8_t out[8][64]) {
    const __m512i k80 = _mm512_set1_epi8((char)0x80);
    for (int half = 0; half < 2; half++) {
        __m512i R[4];
        columns_words(bcol + 16 * half, stride, cols, R);
        for (int g = 0; g < 4; g++) _mm512_store_si512(out[4 * half + g], _mm512_xor_si512(R[g], k80));
    }
}

/* MatMulQ4's block scales of 16 columns (from column nt, `cols` of them) over `blocks` blocks from b0, as
 * sw[b] = the 16 columns' scales of block b0 + b (0 past cols). */
static inline void q4_scales(const void *scales, int fp16, int64_t nb, int64_t nt, int cols, int64_t b0,
                             int64_t blocks, __m512 *sw) {
    _Alignas(64) float t[AMX_MAX_BLOCKS][16];
    for (int n = 0; n < 16; n++)
        for (int64_t b = 0; b < blocks; b++) {
            int64_t e = (nt + n) * nb + b0 + b;
            t[b][n] = n >= cols ? 0.0f : fp16 ? _cvtsh_ss(((const uint16_t *)scales)[e]) : ((const float *)scales)[e];
        }
    for (int64_t b = 0; b < blocks; b++) sw[b] = _mm512_load_ps(t[b]);
}

/* ---- the product ---------------------------------------------------------------------------------- */

/* acc[i] += float(C[i]) * sw * sx[i] for the 16 rows of one block's C (stored at c). Q8 (sw NULL): its
 * weight scale is per column and applied once at the end. */
#define EPILOGUE(c, sw, sx)                                                                                  \
    do {                                                                                                     \
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {                                             \
            __m512 v = _mm512_cvtepi32_ps(_mm512_load_si512((c)[i]));                                        \
            if (sw) v = _mm512_mul_ps(v, *(sw));                                                             \
            acc[i] = _mm512_fmadd_ps(v, _mm512_set1_ps((sx)[i]), acc[i]);                                    \
        }                                                                                                    \
    } while (0)

/* Block b's C tile: the rows' codes (A) times the columns' unpacked weights (B). */
#define BLOCK_DP(C, A, B, b)                                                                                 \
    do {                                                                                                     \
        TILE_LOAD(A, codes + (b) * 512, 32);                                                                 \
        TILE_LOAD(B, w[b], 64);                                                                              \
        TILE_ZERO(C);                                                                                        \
        TILE_DPBSSD(C, A, B);                                                                                \
    } while (0)

/* Rows [r0, r0 + m) x columns [n0, n1) over the blocks of pairs [p0, p1) (at most AMX_MAX_BLOCKS). */
static inline __attribute__((always_inline)) void amx_tile(const void *scratch, int64_t r0, int m, const uint8_t *B, const void *scales, int fp16,
                     int64_t K, int64_t N, int64_t n0, int64_t n1, int64_t p0, int64_t p1, float *y, int q4) {
    _Alignas(64) int8_t w[AMX_MAX_BLOCKS][8][64];
    _Alignas(64) __m512 sw[AMX_MAX_BLOCKS];
    _Alignas(64) int32_t c[4][16][16];
    const int64_t nb = K / 32, b0 = 2 * p0, blocks = 2 * (p1 - p0);
    const int add = p0 > 0;
    tiles_configure();
    for (int64_t nt = n0; nt < n1; nt += 16) {
        const int ncols = n1 - nt < 16 ? (int)(n1 - nt) : 16;
        const __mmask16 cols = (__mmask16)((1u << ncols) - 1);
        if (q4) q4_scales(scales, fp16, nb, nt, ncols, b0, blocks, sw);
        for (int64_t b = 0; b < blocks; b++) {
            if (q4)
                q4_unpack_block(B + ((size_t)nt * nb + b0 + b) * 16, (size_t)nb * 16, ncols, w[b]);
            else
                q8_unpack_block(B + (size_t)nt * K + (b0 + b) * 32, (size_t)K, ncols, w[b]);
        }
        const __m512 wscale = q4 ? _mm512_setzero_ps()
                                 : _mm512_mask_loadu_ps(_mm512_setzero_ps(), cols, (const float *)scales + nt);
        for (int t = 0; t < m; t += 16) {
            const char *tile = (const char *)scratch + (size_t)((r0 + t) / 16) * tile_bytes(K);
            const int8_t *codes = (const int8_t *)tile + b0 * 512;
            const float *sx = (const float *)(tile + nb * 512) + b0 * 16;
            __m512 acc[16];
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
            /* Four blocks' tdpbssd in flight before their C tiles are read back: a C tile's store waits for
             * its product (tens of cycles), and the next use of the tile register for the store. */
            int64_t b = 0;
            for (; b + 4 <= blocks; b += 4) {
                BLOCK_DP(0, 4, 6, b);
                BLOCK_DP(1, 5, 7, b + 1);
                BLOCK_DP(2, 4, 6, b + 2);
                BLOCK_DP(3, 5, 7, b + 3);
                TILE_STORE(0, c[0], 64);
                TILE_STORE(1, c[1], 64);
                TILE_STORE(2, c[2], 64);
                TILE_STORE(3, c[3], 64);
                _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) EPILOGUE(c[j], q4 ? &sw[b + j] : NULL, sx + (b + j) * 16);
            }
            for (; b < blocks; b++) {
                BLOCK_DP(0, 4, 6, b);
                TILE_STORE(0, c[0], 64);
                EPILOGUE(c[0], q4 ? &sw[b] : NULL, sx + b * 16);
            }
            /* Every index into acc a constant (unrolled, rows past m skipped), so the accumulators stay in
             * registers: one variable index spilled all 16 to the stack, a load and store each a block. */
            int rows = m - t < 16 ? m - t : 16;
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {
                if (i >= rows) break;
                float *yr = y + (int64_t)(t + i) * N + nt;
                __m512 v = q4 ? acc[i] : _mm512_mul_ps(acc[i], wscale);
                if (add) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(cols, yr));
                _mm512_mask_storeu_ps(yr, cols, v);
            }
        }
    }
    tiles_release();
}

/* ---- the two implementations: VNNI below AMX_MIN_ROWS rows, tiles above -------------------------- */

#define AMX_IMPL(OP, VNNI, Q4)                                                                               \
    static size_t OP##_scratch(int64_t K, int64_t M) {                                                       \
        return M < AMX_MIN_ROWS ? VNNI.scratch_bytes(K, M) : amx_scratch_bytes(K, M);                        \
    }                                                                                                        \
    static void OP##_quantize(const float *x, int64_t K, int64_t M, void *scratch, int64_t r) {              \
        if (M < AMX_MIN_ROWS)                                                                                \
            VNNI.quantize_row(x, K, M, scratch, r);                                                          \
        else                                                                                                 \
            amx_quantize_row(x, K, M, scratch, r, Q4);                                                       \
    }                                                                                                        \
    static void OP##_tile(const void *scratch, int64_t r0, int m, const uint8_t *B, const void *scales,      \
                          int fp16, int64_t K, int64_t N, int64_t n0, int64_t n1, int64_t p0, int64_t p1,    \
                          float *y, int64_t M) {                                                             \
        if (M >= AMX_MIN_ROWS) {                                                                             \
            amx_tile(scratch, r0, m, B, scales, fp16, K, N, n0, n1, p0, p1, y, Q4);                          \
            return;                                                                                          \
        }                                                                                                    \
        for (int r = 0; r < m; r += VNNI.rows) /* VNNI's tiles of its own row count */                      \
            VNNI.tile(scratch, r0 + r, m - r < VNNI.rows ? m - r : VNNI.rows, B, scales, fp16, K, N, n0, n1, \
                      p0, p1, y + r * N, M);                                                                 \
    }                                                                                                        \
    const QImpl OP##_amx = {"amx", AMX_ROWS, OP##_scratch, OP##_quantize, OP##_tile};

AMX_IMPL(q4, q4_avx512vnni, 1)
AMX_IMPL(q8, q8_avx512vnni, 0)

#include "vnni_end.h"
