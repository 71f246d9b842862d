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

#include "quad.h" /* q8_pair_halves */

/* One pair of blocks of weights (q8kernel.h's halves): decode: B's bytes (lo, hi); prompt: signed codes
 * (lo, hi) and -128 * their 4-byte group sums (corr). */
typedef struct {
    __m256i lo, hi, corr;
} Q8Pair;

#define Q8_X_BIAS_d 0
#define Q8_ZP_d 1
#define Q8_X_BIAS_p 128
#define Q8_ZP_p 0

static inline Q8Pair q8_pair_zero(void) {
    return (Q8Pair){_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
}

static inline Q8Pair q8_pair_load_d(const uint8_t *bq, int j) {
    Q8Pair w = {.corr = _mm256_setzero_si256()};
    q8_pair_halves(bq + j * 64, &w.lo, &w.hi);
    return w;
}

static inline __m256i q8_pair_dot_d(const char *row, Q8Pair w, int j) {
    const __m256i *x = (const __m256i *)(row + j * 64);
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), w.lo, _mm256_loadu_si256(x)), w.hi,
                               _mm256_loadu_si256(x + 1));
}

static inline Q8Pair q8_pair_load_p(const uint8_t *bq, int j) {
    const __m256i k80 = _mm256_set1_epi8((char)0x80);
    Q8Pair w;
    q8_pair_halves(bq + j * 64, &w.lo, &w.hi);
    w.lo = _mm256_xor_si256(w.lo, k80), w.hi = _mm256_xor_si256(w.hi, k80);
    __m256i sums = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), k80, w.lo), k80, w.hi);
    w.corr = _mm256_sub_epi32(_mm256_setzero_si256(), sums);
    return w;
}

static inline __m256i q8_pair_dot_p(const char *row, Q8Pair w, int j) {
    const __m256i *x = (const __m256i *)(row + j * 64);
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(w.corr, _mm256_loadu_si256(x), w.lo), _mm256_loadu_si256(x + 1),
                               w.hi);
}

/* One block of weights, prompt mode only (q8kernel.h's lanes): signed codes and -128 * their sums. */
typedef struct {
    __m256i c, corr;
} Q8Blk;

static inline Q8Blk q8_blk_zero(void) { return (Q8Blk){_mm256_setzero_si256(), _mm256_setzero_si256()}; }

static inline Q8Blk q8_blk_load_p(const uint8_t *bq, int j) {
    const __m256i k80 = _mm256_set1_epi8((char)0x80);
    __m256i c = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(bq + j * 32)), k80);
    return (Q8Blk){c, _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), k80, c))};
}

static inline __m256i q8_blk_dot_p(const char *row, Q8Blk w, int j) {
    return _mm256_dpbusd_epi32(w.corr, _mm256_loadu_si256((const __m256i *)(row + j * 32)), w.c);
}

#define Q8_DECODE_PAIRS 1
#include "q8kernel.h"

const QImpl q8_avx512vnni = {"avx512vnni", 8, scratch_bytes, quantize_row, tile};

#include "vnni_end.h"
