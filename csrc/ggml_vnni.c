/* AVX-512 VNNI implementation of MatMulGGUF (ggml_blocks.h) through ggml_kernel.h, on 256-bit vectors: vpdpbusd
 * forms the unsigned x signed byte products' sums of 4 in one instruction (maddubs and madd under AVX2: the same
 * integers, so both implementations give the same results bit for bit). */
#include "vnni_begin.h" /* first: everything below is compiled for AVX-512 VNNI */

#include <stddef.h>

#include "ggml_blocks.h"
#include "ggml_decode.h"
#include "quad.h" /* quantize_block, hsum8 */

#define GG_DOT(u, a) _mm256_dpbusd_epi32(_mm256_setzero_si256(), (u), (a))
#define GG_NAME(x) x##_avx512vnni
#define GG_ISA "avx512vnni"
#define GG_AVX512 1
#include "ggml_kernel.h"

#include "vnni_end.h"
