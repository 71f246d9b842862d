/* AVX-512 VNNI implementation of MatMulQ8 (q8gemm.h), on 256-bit vectors. vpdpbusd multiplies unsigned
 * by signed bytes and sums each 4 into int32, one instruction per 32 weights.
 *   decode (d): B's unsigned bytes times the signed activation codes; the zero point's share
 *               (-128 * a block's code sum) is the layout's zp, added once per quad after the sum tree.
 *   prompt (p): the activations stored unsigned (codes + 128) times signed weights (c = B ^ 0x80), so the
 *               correction, -128 * (sum of c), depends on the column alone: one more vpdpbusd per block
 *               of weights, shared by every row as the accumulator its vpdpbusd starts from. The
 *               decode mode's per-row zp would cost a broadcast load per row and block with per-block
 *               accumulation: 64 against 74 GMAC/s at M = 128 single-threaded. At decode the shared
 *               correction is not shared, and cost 1.3x the time in cache (M = 1). */
#include "vnni_begin.h" /* first: everything below is compiled for AVX-512 VNNI */

#include <immintrin.h>
#include <stdint.h>

/* One block of weights: decode: B's bytes (c); prompt: signed codes (c) and -128 * their sums (corr). */
typedef struct {
    __m256i c, corr;
} Q8Blk;

#define Q8_X_BIAS_d 0
#define Q8_ZP_d 1
#define Q8_X_BIAS_p 128
#define Q8_ZP_p 0

static inline Q8Blk q8_blk_zero(void) { return (Q8Blk){_mm256_setzero_si256(), _mm256_setzero_si256()}; }

static inline Q8Blk q8_blk_load_d(const uint8_t *bq, int j) {
    return (Q8Blk){_mm256_loadu_si256((const __m256i *)(bq + j * 32)), _mm256_setzero_si256()};
}

static inline __m256i q8_blk_dot_d(const char *row, Q8Blk w, int j) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w.c, _mm256_loadu_si256((const __m256i *)(row + j * 32)));
}

static inline Q8Blk q8_blk_load_p(const uint8_t *bq, int j) {
    const __m256i k80 = _mm256_set1_epi8((char)0x80);
    __m256i c = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(bq + j * 32)), k80);
    return (Q8Blk){c, _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), k80, c))};
}

static inline __m256i q8_blk_dot_p(const char *row, Q8Blk w, int j) {
    return _mm256_dpbusd_epi32(w.corr, _mm256_loadu_si256((const __m256i *)(row + j * 32)), w.c);
}

#include "q8kernel.h"

const QImpl q8_avx512vnni = {"avx512vnni", 8, scratch_bytes, quantize_row, tile};

#include "vnni_end.h"
