/* AVX2 implementation of MatMulQ8 (q8gemm.h). maddubs multiplies unsigned by signed bytes and saturates
 * the pair sums to int16, which B's unsigned codes + 128 would overflow (255 * 127 * 2 > 32767), so the
 * codes are made signed (c = B ^ 0x80) and multiplied as |c| * (x with c's sign): at most
 * 128 * 127 * 2 = 32512. The products are then exact and need no zero-point correction. */
#include <immintrin.h>
#include <stdint.h>

#include "quad.h" /* q8_pair_halves */

/* One pair of blocks of weights (q8kernel.h's halves): |c| and c of each half. Both modes alike: signed
 * activation codes, exact signed products. */
typedef struct {
    __m256i mag_lo, sgn_lo, mag_hi, sgn_hi;
} Q8Pair;

#define Q8_X_BIAS_d 0
#define Q8_ZP_d 0
#define Q8_X_BIAS_p 0
#define Q8_ZP_p 0
#define q8_pair_load_d q8_pair_load_p
#define q8_pair_dot_d q8_pair_dot_p
#define q8_blk_load_d q8_blk_load_p
#define q8_blk_dot_d q8_blk_dot_p

static inline Q8Pair q8_pair_zero(void) {
    __m256i z = _mm256_setzero_si256();
    return (Q8Pair){z, z, z, z};
}

static inline Q8Pair q8_pair_load_p(const uint8_t *bq, int j) {
    const __m256i k80 = _mm256_set1_epi8((char)0x80);
    __m256i lo, hi;
    q8_pair_halves(bq + j * 64, &lo, &hi);
    lo = _mm256_xor_si256(lo, k80), hi = _mm256_xor_si256(hi, k80);
    return (Q8Pair){_mm256_abs_epi8(lo), lo, _mm256_abs_epi8(hi), hi};
}

static inline __m256i q8_pair_dot_p(const char *row, Q8Pair w, int j) {
    const __m256i *x = (const __m256i *)(row + j * 64), ones = _mm256_set1_epi16(1);
    __m256i lo = _mm256_maddubs_epi16(w.mag_lo, _mm256_sign_epi8(_mm256_loadu_si256(x), w.sgn_lo));
    __m256i hi = _mm256_maddubs_epi16(w.mag_hi, _mm256_sign_epi8(_mm256_loadu_si256(x + 1), w.sgn_hi));
    return _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
}

/* One block of weights (q8kernel.h's lanes): |c| and c. */
typedef struct {
    __m256i mag, sgn;
} Q8Blk;

static inline Q8Blk q8_blk_zero(void) { return (Q8Blk){_mm256_setzero_si256(), _mm256_setzero_si256()}; }

static inline Q8Blk q8_blk_load_p(const uint8_t *bq, int j) {
    __m256i c = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(bq + j * 32)), _mm256_set1_epi8((char)0x80));
    return (Q8Blk){_mm256_abs_epi8(c), c};
}

static inline __m256i q8_blk_dot_p(const char *row, Q8Blk w, int j) {
    __m256i x = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(row + j * 32)), w.sgn);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w.mag, x), _mm256_set1_epi16(1));
}

#define Q8_DECODE_PAIRS 0
#include "q8kernel.h"

const QImpl q8_avx2 = {"avx2", 8, scratch_bytes, quantize_row, tile};
