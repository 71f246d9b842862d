/* AVX2 kernels for ring_attention.h, in fp32: half-split RoPE on the first 2 * rot_half dims (the rest pass
 * through), scores q.k * scale + mask over the unmasked columns, a max-subtracted softmax and the weighted
 * sum of value rows.
 *
 * A task walks its row's unmasked columns in buffer order with LinearAttention's exact arithmetic
 * (attention_avx2.c: keys four at a time, the same sum trees, exp and value order). While the ring is
 * linear those columns are rows 0..pos, so a chunk that crosses into the full ring computes its
 * still-linear rows bit for bit as the decode steps that ran LinearAttention did. An fp16 or q8 cache is read and
 * written as LinearAttention reads and writes it (simd.h kv_load8, kv_store_row), so that holds for it too. */
#include "ring_attention.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "simd.h"

/* y = RoPE(x) with one row of cos/sin (x, y [d]; may not alias). */
static void rope(const float *x, const float *c, const float *s, int64_t half, int64_t d, float *y) {
    for (int64_t j = 0; j < half; j++) {
        y[j] = x[j] * c[j] - x[j + half] * s[j];
        y[j + half] = x[j + half] * c[j] + x[j] * s[j];
    }
    for (int64_t j = 2 * half; j < d; j++) y[j] = x[j];
}

void ring_write_kv(const RingArgs *a, int64_t i) {
    int64_t width = (a->hq + 2 * a->hkv) * a->d, row = a->row_write ? a->row_write[i] : a->write_index + i;
    row += ring_cache_rows(a, i);
    const float *src = a->qkv + i * width, *c = a->cos + i * a->rot_half, *s = a->sin + i * a->rot_half;
    float y[512]; /* d <= 512, checked when the op runs */
    for (int64_t j = 0; j < a->hkv; j++) {
        const float *k = src + (a->hq + j) * a->d, *v = src + (a->hq + a->hkv + j) * a->d;
        int64_t at = j * a->capacity + row;
        void *kd = (void *)kv_row(a->keys, at, a->d, a->kv_type);
        void *vd = (void *)kv_row(a->values, at, a->d, a->kv_type);
        rope(k, c, s, a->rot_half, a->d, y);
        kv_store_row(kd, y, a->d, a->kv_type);
        kv_store_row(vd, v, a->d, a->kv_type);
    }
}

/* The four scores q.k_j * scale as LinearAttention's four-key step sums them. */
static inline __attribute__((always_inline)) __m128 dot4(const float *q, const void *k0, const void *k1,
                                                         const void *k2, const void *k3, int64_t d, float scale,
                                                         const int kt) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t e = 0; e < d; e += 8) {
        __m256 qe = _mm256_loadu_ps(q + e);
        a0 = _mm256_fmadd_ps(qe, kv_load8(k0, e, kt), a0);
        a1 = _mm256_fmadd_ps(qe, kv_load8(k1, e, kt), a1);
        a2 = _mm256_fmadd_ps(qe, kv_load8(k2, e, kt), a2);
        a3 = _mm256_fmadd_ps(qe, kv_load8(k3, e, kt), a3);
    }
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)), _mm_set1_ps(scale));
}

/* dot4 with a query per key: the one group of a row that holds both sink and window columns. */
static inline __attribute__((always_inline)) __m128 dot4_mixed(const float *const q[4], const void *const k[4],
                                                               int64_t d, float scale, const int kt) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t e = 0; e < d; e += 8) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q[0] + e), kv_load8(k[0], e, kt), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q[1] + e), kv_load8(k[1], e, kt), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q[2] + e), kv_load8(k[2], e, kt), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q[3] + e), kv_load8(k[3], e, kt), a3);
    }
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)), _mm_set1_ps(scale));
}

/* ring_head's body; `kt` (the cache type) is a constant at each call, so each cache type gets its own
 * loops (simd.h). */
int64_t ring_columns(const RingArgs *a, int64_t i, int32_t *cols, int64_t *n_sink) {
    const float *mask = a->mask + i * a->capacity;
    int64_t n = 0, s = 0;
    for (int64_t c = 0; c < a->capacity; c++)
        if (mask[c] > RING_MASKED_BELOW) cols[n++] = (int32_t)c;
    while (s < n && cols[s] < a->sinks) s++;
    *n_sink = s;
    return n;
}

/* Columns [j, jend) of unit u's scores (j a multiple of 4; jend a multiple of 4 or n): four at a time as
 * dot4 sums them, the last n % 4 one at a time. A score is a function of its column alone, so a unit's scores are
 * the same whichever blocks they are computed in. Returns the largest, with best. */
static inline __attribute__((always_inline)) float score_block(const RingArgs *a, const float *q, const float *qs,
                                                               const void *keys, const int32_t *cols, int64_t j,
                                                               int64_t jend, int64_t n_sink, const float *mask,
                                                               float *scores, float best, const int kt) {
    int64_t d = a->d;
    for (; j + 4 <= jend; j += 4) {
        const void *k[4] = {kv_row(keys, cols[j], d, kt), kv_row(keys, cols[j + 1], d, kt),
                            kv_row(keys, cols[j + 2], d, kt), kv_row(keys, cols[j + 3], d, kt)};
        __m128 sc;
        if (j >= n_sink || j + 4 <= n_sink) {
            sc = dot4(j >= n_sink ? q : qs, k[0], k[1], k[2], k[3], d, a->scale, kt);
        } else {
            const float *qj[4];
            for (int m = 0; m < 4; m++) qj[m] = j + m < n_sink ? qs : q;
            sc = dot4_mixed(qj, k, d, a->scale, kt);
        }
        _mm_storeu_ps(scores + j, sc);
        for (int m = 0; m < 4; m++) {
            scores[j + m] += mask[cols[j + m]];
            best = scores[j + m] > best ? scores[j + m] : best;
        }
    }
    for (; j < jend; j++) {
        const void *k = kv_row(keys, cols[j], d, kt);
        const float *qj = j < n_sink ? qs : q;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t e = 0; e < d; e += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qj + e), kv_load8(k, e, kt), acc);
        float sc = hsum8(acc) * a->scale + mask[cols[j]];
        scores[j] = sc;
        best = sc > best ? sc : best;
    }
    return best;
}

/* scores[0..n) <- exp(scores - best), in place; their sum. */
static inline float ring_softmax(float *scores, int64_t n, float best) {
    __m256 sum = _mm256_setzero_ps(), top = _mm256_set1_ps(best);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(scores + j), top));
        _mm256_storeu_ps(scores + j, p);
        sum = _mm256_add_ps(sum, p);
    }
    float total = hsum8(sum);
    if (j < n) { /* the last < 8 scores, through a padded copy */
        float tail[8];
        int64_t m = n - j;
        for (int64_t e = 0; e < 8; e++) tail[e] = e < m ? scores[j + e] - best : -INFINITY;
        _mm256_storeu_ps(tail, exp256(_mm256_loadu_ps(tail)));
        for (int64_t e = 0; e < m; e++) {
            scores[j + e] = tail[e];
            total += tail[e];
        }
    }
    return total;
}

/* o[e0 .. e0 + 8 w) (+)= value rows cols[r0 .. r1) weighted by scores, in order, in w (<= 8) registers: from 0
 * where `first`, else from what o holds; times `inv` where `last` (the sum complete), else stored as it is. */
static inline __attribute__((always_inline)) void value_block(const void *values, const int32_t *cols,
                                                              const float *scores, int64_t r0, int64_t r1,
                                                              int64_t d, int64_t e0, int w, int first, int last,
                                                              float inv, float *o, const int kt) {
    __m256 acc[8];
    for (int m = 0; m < 8; m++) acc[m] = m < w && !first ? _mm256_loadu_ps(o + e0 + 8 * m) : _mm256_setzero_ps();
    if (w == 8) {
        for (int64_t r = r0; r < r1; r++) {
            const void *vr = kv_row(values, cols[r], d, kt);
            __m256 p = _mm256_set1_ps(scores[r]);
            for (int m = 0; m < 8; m++) acc[m] = _mm256_fmadd_ps(p, kv_load8(vr, e0 + 8 * m, kt), acc[m]);
        }
    } else {
        for (int64_t r = r0; r < r1; r++) {
            const void *vr = kv_row(values, cols[r], d, kt);
            __m256 p = _mm256_set1_ps(scores[r]);
            for (int m = 0; m < w; m++) acc[m] = _mm256_fmadd_ps(p, kv_load8(vr, e0 + 8 * m, kt), acc[m]);
        }
    }
    __m256 s = _mm256_set1_ps(inv);
    for (int m = 0; m < w; m++) _mm256_storeu_ps(o + e0 + 8 * m, last ? _mm256_mul_ps(acc[m], s) : acc[m]);
}

/* ring_head's body; `kt` (the cache type) is a constant at each call, so each cache type gets its own
 * loops (simd.h). Query heads [h0, h0 + nh) of token i share its KV head: one head goes through its columns in
 * one block, several take turns over blocks of RING_BLOCK columns, each block's keys and values then read from
 * L1 by all but the first. A head's arithmetic is the same either way (score_block, value_block). */
#define RING_BLOCK 64
static inline __attribute__((always_inline)) void head(const RingArgs *a, int64_t i, int64_t h0, int64_t nh,
                                                       float *scores, const int32_t *cols, int64_t n,
                                                       int64_t n_sink, const int kt) {
    int64_t d = a->d, cap = a->capacity, kvh = h0 / (a->hq / a->hkv);
    const float *x = a->qkv + i * (a->hq + 2 * a->hkv) * d, *mask = a->mask + i * cap;
    float *out = a->out + i * a->hq * d;
    if (n == 0) { /* no column to attend: nothing to average (the host never masks a token's own row) */
        memset(out + h0 * d, 0, (size_t)(nh * d) * sizeof(float));
        return;
    }
    float q[RING_MAX_HEADS][512], qs[RING_MAX_HEADS][512]; /* d <= 512, checked when the op runs */
    for (int64_t u = 0; u < nh; u++) {
        rope(x + (h0 + u) * d, a->cos + i * a->rot_half, a->sin + i * a->rot_half, a->rot_half, d, q[u]);
        if (n_sink) rope(x + (h0 + u) * d, a->cos_sink + i * a->rot_half, a->sin_sink + i * a->rot_half, a->rot_half, d, qs[u]);
    }
    int64_t first = ring_cache_rows(a, i) + kvh * cap; /* this token's cache, this KV head */
    const void *keys = kv_row(a->keys, first, d, kt), *values = kv_row(a->values, first, d, kt);
    const int64_t block = nh == 1 ? n : RING_BLOCK;
    float best[RING_MAX_HEADS], inv[RING_MAX_HEADS];
    for (int64_t u = 0; u < nh; u++) best[u] = -INFINITY;
    for (int64_t j = 0; j < n; j += block)
        for (int64_t u = 0; u < nh; u++)
            best[u] = score_block(a, q[u], qs[u], keys, cols, j, j + block < n ? j + block : n, n_sink, mask,
                                  scores + u * cap, best[u], kt);
    for (int64_t u = 0; u < nh; u++) inv[u] = 1.0f / ring_softmax(scores + u * cap, n, best[u]);
    /* Value rows in column order, 64 dims at a time in eight registers (attention_avx2.c says why). */
    for (int64_t e0 = 0; e0 < d; e0 += 64) {
        int w = d - e0 < 64 ? (int)(d - e0) / 8 : 8;
        for (int64_t r = 0; r < n; r += block) {
            int64_t r1 = r + block < n ? r + block : n;
            for (int64_t u = 0; u < nh; u++)
                value_block(values, cols, scores + u * cap, r, r1, d, e0, w, r == 0, r1 == n, inv[u],
                            out + (h0 + u) * d, kt);
        }
    }
}

void ring_head(const RingArgs *a, int64_t i, int64_t h0, int64_t nh, float *scores, const int32_t *cols, int64_t n,
               int64_t n_sink) {
    if (a->kv_type == KV_F16)
        head(a, i, h0, nh, scores, cols, n, n_sink, KV_F16);
    else if (a->kv_type == KV_Q8)
        head(a, i, h0, nh, scores, cols, n, n_sink, KV_Q8);
    else
        head(a, i, h0, nh, scores, cols, n, n_sink, KV_F32);
}
