/* AVX2 kernels for attention.h. Half-split RoPE on the first 2 * rot_half dims (the rest pass through),
 * scores q.k * scale, a max-subtracted softmax and the weighted sum of values, all in fp32; an fp16 or q8
 * cache is widened as it is read and the new rows rounded as they are written (simd.h kv_load8,
 * kv_store_row). */
#include "attention.h"

#include <immintrin.h>
#include <math.h>

#include "simd.h"

/* y = RoPE(x) at cache row `pos` (x, y [d]; may not alias). */
static void rope(const AttnArgs *a, const float *x, int64_t pos, float *y) {
    const float *c = a->cos + pos * a->rot_half, *s = a->sin + pos * a->rot_half;
    int64_t h = a->rot_half;
    for (int64_t j = 0; j < h; j++) {
        y[j] = x[j] * c[j] - x[j + h] * s[j];
        y[j + h] = x[j + h] * c[j] + x[j] * s[j];
    }
    for (int64_t j = 2 * h; j < a->d; j++) y[j] = x[j];
}

void attn_write_kv(const AttnArgs *a, int64_t i) {
    int64_t width = (a->hq + 2 * a->hkv) * a->d, pos = a->past + i;
    const float *row = a->qkv + i * width;
    float y[512]; /* d <= 512, checked when the kernel is created */
    for (int64_t j = 0; j < a->hkv; j++) {
        const float *k = row + (a->hq + j) * a->d, *v = row + (a->hq + a->hkv + j) * a->d;
        int64_t at = j * a->capacity + pos;
        void *kd = (void *)kv_row(a->keys, at, a->d, a->kv_type);
        void *vd = (void *)kv_row(a->values, at, a->d, a->kv_type);
        rope(a, k, pos, y);
        kv_store_row(kd, y, a->d, a->kv_type);
        kv_store_row(vd, v, a->d, a->kv_type);
    }
}

/* Keys (and value rows) read per block: 64 fp32 rows of d = 64 are 16 KB, within L1 with the rows' queries. */
#define ATTN_KEY_BLOCK 64

/* Row `i`'s scores of keys [r, end) (r a multiple of 4): four keys at a time, their four sums reduced
 * together (one hsum a key cost as much as its dot), the last end - r < 4 one at a time where end is the
 * row's own last key + 1. Returns the largest. Each score is a function of its key alone, so a row's
 * scores are the same whichever blocks they are computed in. */
static inline __attribute__((always_inline)) float score_keys(const AttnArgs *a, const float *q, const void *keys,
                                                              int64_t r, int64_t end, float *scores, float best,
                                                              const int kt) {
    int64_t d = a->d;
    for (; r + 4 <= end; r += 4) {
        const void *k0 = kv_row(keys, r, d, kt), *k1 = kv_row(keys, r + 1, d, kt);
        const void *k2 = kv_row(keys, r + 2, d, kt), *k3 = kv_row(keys, r + 3, d, kt);
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t e = 0; e < d; e += 8) {
            __m256 qe = _mm256_loadu_ps(q + e);
            a0 = _mm256_fmadd_ps(qe, kv_load8(k0, e, kt), a0);
            a1 = _mm256_fmadd_ps(qe, kv_load8(k1, e, kt), a1);
            a2 = _mm256_fmadd_ps(qe, kv_load8(k2, e, kt), a2);
            a3 = _mm256_fmadd_ps(qe, kv_load8(k3, e, kt), a3);
        }
        __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        __m128 sc = _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)), _mm_set1_ps(a->scale));
        _mm_storeu_ps(scores + r, sc);
        for (int j = 0; j < 4; j++) best = scores[r + j] > best ? scores[r + j] : best;
    }
    for (; r < end; r++) {
        const void *k = kv_row(keys, r, d, kt);
        __m256 acc = _mm256_setzero_ps();
        for (int64_t e = 0; e < d; e += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + e), kv_load8(k, e, kt), acc);
        float sc = hsum8(acc) * a->scale;
        scores[r] = sc;
        best = sc > best ? sc : best;
    }
    return best;
}

/* scores[0..n) <- exp(scores - best), in place; their sum. */
static inline float softmax_numerators(float *scores, int64_t n, float best) {
    /* libm's scalar expf here was most of a prefill's attention (884 us a 135M layer against
     * GroupQueryAttention's 543); the vector exp is ~1 ulp on the scores minus their max. */
    __m256 sum = _mm256_setzero_ps(), top = _mm256_set1_ps(best);
    int64_t r = 0;
    for (; r + 8 <= n; r += 8) {
        __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(scores + r), top));
        _mm256_storeu_ps(scores + r, p);
        sum = _mm256_add_ps(sum, p);
    }
    float total = hsum8(sum);
    if (r < n) { /* the last < 8 scores, through a padded copy */
        float tail[8];
        int64_t m = n - r;
        for (int64_t j = 0; j < 8; j++) tail[j] = j < m ? scores[r + j] - best : -INFINITY;
        _mm256_storeu_ps(tail, exp256(_mm256_loadu_ps(tail)));
        for (int64_t j = 0; j < m; j++) {
            scores[r + j] = tail[j];
            total += tail[j];
        }
    }
    return total;
}

/* o[e0 .. e0 + 8 nv) += the weighted value rows [r0, r1), in order, in nv (<= 8) registers: keeping the
 * output in memory made every row a load-FMA-store chain through it (the decode step's attention, 26 us
 * a 135M layer). `first`: o holds nothing yet (start from 0). */
static inline __attribute__((always_inline)) void add_values(const void *values, const float *scores, int64_t r0,
                                                             int64_t r1, int64_t d, int64_t e0, int nv, int first,
                                                             float *o, const int kt) {
    __m256 acc[8];
    for (int j = 0; j < 8; j++) acc[j] = j < nv && !first ? _mm256_loadu_ps(o + e0 + 8 * j) : _mm256_setzero_ps();
    if (nv == 8) {
        for (int64_t row = r0; row < r1; row++) { /* in order: each value row read contiguously */
            const void *v = kv_row(values, row, d, kt);
            __m256 p = _mm256_set1_ps(scores[row]);
            for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(p, kv_load8(v, e0 + 8 * j, kt), acc[j]);
        }
    } else {
        for (int64_t row = r0; row < r1; row++) {
            const void *v = kv_row(values, row, d, kt);
            __m256 p = _mm256_set1_ps(scores[row]);
            for (int j = 0; j < nv; j++) acc[j] = _mm256_fmadd_ps(p, kv_load8(v, e0 + 8 * j, kt), acc[j]);
        }
    }
    for (int j = 0; j < nv; j++) _mm256_storeu_ps(o + e0 + 8 * j, acc[j]);
}

/* attn_rows' body; `kt` (the cache type) is a constant at each call, so each cache type gets its own
 * loops (simd.h). A unit is one token's one query head: unit u is token i0 + u / nh's head h0 + u % nh, all of
 * them on the KV head of h0. Every unit's arithmetic is the same whatever n and nh are (its scores key by key,
 * its exp sum, its value sum row by row in order), so a token's output is bit for bit the same at decode (n = 1)
 * and in a chunk, with its heads alone or grouped: only the order in which the units take turns over a block of
 * keys changes. */
static inline __attribute__((always_inline)) void rows(const AttnArgs *a, int64_t i0, int64_t n, int64_t h0,
                                                       int64_t nh, float *scratch, const int kt) {
    int64_t d = a->d, kvh = h0 / (a->hq / a->hkv), width = (a->hq + 2 * a->hkv) * d, units = n * nh;
    float *q = scratch, *scores = scratch + units * d, best[ATTN_MAX_ROWS], inv[ATTN_MAX_ROWS];
    for (int64_t u = 0; u < units; u++) {
        rope(a, a->qkv + (i0 + u / nh) * width + (h0 + u % nh) * d, a->past + i0 + u / nh, q + u * d);
        best[u] = -INFINITY;
    }
    const void *keys = kv_row(a->keys, kvh * a->capacity, d, kt);
    const void *values = kv_row(a->values, kvh * a->capacity, d, kt);
    int64_t last = a->past + i0 + n; /* keys [0, last) are read by some unit; token j reads past + i0 + j + 1 */
    /* One unit (decode of one head) has nothing to share: one block, the loops of a single row (and no per-block
     * reload of its value sums). Several share each block of keys and values while it is in L1. The block size
     * changes no unit's arithmetic. */
    int64_t block = units == 1 ? last : ATTN_KEY_BLOCK;
    for (int64_t kb = 0; kb < last; kb += block) {
        for (int64_t u = 0; u < units; u++) {
            int64_t end = a->past + i0 + u / nh + 1;
            if (kb >= end) continue;
            end = end < kb + block ? end : kb + block;
            best[u] = score_keys(a, q + u * d, keys, kb, end, scores + u * a->capacity, best[u], kt);
        }
    }
    for (int64_t u = 0; u < units; u++)
        inv[u] = 1.0f / softmax_numerators(scores + u * a->capacity, a->past + i0 + u / nh + 1, best[u]);
    for (int64_t e0 = 0; e0 < d; e0 += 64) {
        int nv = d - e0 < 64 ? (int)(d - e0) / 8 : 8;
        for (int64_t vb = 0; vb < last; vb += block) {
            for (int64_t u = 0; u < units; u++) {
                int64_t end = a->past + i0 + u / nh + 1;
                if (vb >= end) continue;
                end = end < vb + block ? end : vb + block;
                float *o = a->out + (i0 + u / nh) * a->hq * d + (h0 + u % nh) * d;
                add_values(values, scores + u * a->capacity, vb, end, d, e0, nv, vb == 0, o, kt);
            }
        }
        for (int64_t u = 0; u < units; u++) {
            float *o = a->out + (i0 + u / nh) * a->hq * d + (h0 + u % nh) * d;
            __m256 s = _mm256_set1_ps(inv[u]);
            for (int k = 0; k < nv; k++) _mm256_storeu_ps(o + e0 + 8 * k, _mm256_mul_ps(_mm256_loadu_ps(o + e0 + 8 * k), s));
        }
    }
}

void attn_rows(const AttnArgs *a, int64_t i0, int64_t n, int64_t h0, int64_t nh, float *scratch) {
    if (a->kv_type == KV_F16)
        rows(a, i0, n, h0, nh, scratch, KV_F16);
    else if (a->kv_type == KV_Q8)
        rows(a, i0, n, h0, nh, scratch, KV_Q8);
    else
        rows(a, i0, n, h0, nh, scratch, KV_F32);
}
