/* AVX2 implementation of MatMulQ8 (q8gemm.h). maddubs multiplies unsigned by signed bytes and saturates
 * the pair sums to int16, which B's unsigned codes + 128 would overflow (255 * 127 * 2 > 32767), so the
 * codes are made signed (c = B ^ 0x80) and multiplied as |c| * (x with c's sign): at most
 * 128 * 127 * 2 = 32512. The products are then exact and need no zero-point correction. */
#include <immintrin.h>
#include <stdint.h>

typedef struct {
    __m256i mag[8], sgn[8]; /* |c| and c per block */
} Q8W;

/* Both modes alike: signed activation codes, exact signed products. */
#define Q8_X_BIAS_d 0
#define Q8_ZP_d 0
#define Q8_X_BIAS_p 0
#define Q8_ZP_p 0
#define q8_load_d q8_load
#define q8_load_p q8_load
#define q8_block_d q8_block
#define q8_block_p q8_block

static inline void q8_load(const uint8_t *bq, int blocks, Q8W *w) {
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (int j = 0; j < 8; j++) {
        __m256i c = j < blocks ? _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(bq + j * 32)), bias)
                               : _mm256_setzero_si256();
        w->mag[j] = _mm256_abs_epi8(c);
        w->sgn[j] = c;
    }
}

static inline __m256i q8_block(const char *row, const Q8W *w, int j) {
    __m256i x = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(row + j * 32)), w->sgn[j]);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w->mag[j], x), _mm256_set1_epi16(1));
}

#include "q8kernel.h"

const QImpl q8_avx2 = {"avx2", 8, scratch_bytes, quantize_row, tile};
