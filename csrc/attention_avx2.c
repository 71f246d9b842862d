/* AVX2 kernels for attention.h. Half-split RoPE on the first 2 * rot_half dims (the rest pass through),
 * scores q.k * scale, a max-subtracted softmax and the weighted sum of values, all in fp32. */
#include "attention.h"

#include <immintrin.h>
#include <math.h>

static inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

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
    for (int64_t j = 0; j < a->hkv; j++) {
        const float *k = row + (a->hq + j) * a->d, *v = row + (a->hq + a->hkv + j) * a->d;
        float *kd = a->keys + (j * a->capacity + pos) * a->d, *vd = a->values + (j * a->capacity + pos) * a->d;
        rope(a, k, pos, kd);
        for (int64_t e = 0; e < a->d; e++) vd[e] = v[e];
    }
}

void attn_head(const AttnArgs *a, int64_t i, int64_t h, float *scores) {
    int64_t d = a->d, pos = a->past + i, kvh = h / (a->hq / a->hkv);
    float q[512]; /* d <= 512, checked when the kernel is created */
    rope(a, a->qkv + i * (a->hq + 2 * a->hkv) * d + h * d, pos, q);
    const float *keys = a->keys + kvh * a->capacity * d, *values = a->values + kvh * a->capacity * d;
    float best = -INFINITY;
    for (int64_t r = 0; r <= pos; r++) {
        const float *k = keys + r * d;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t e = 0; e < d; e += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + e), _mm256_loadu_ps(k + e), acc);
        float sc = hsum8(acc) * a->scale;
        scores[r] = sc;
        best = sc > best ? sc : best;
    }
    float total = 0.0f;
    for (int64_t r = 0; r <= pos; r++) {
        scores[r] = expf(scores[r] - best);
        total += scores[r];
    }
    float *o = a->out + i * a->hq * d + h * d;
    for (int64_t e = 0; e < d; e++) o[e] = 0.0f;
    for (int64_t r = 0; r <= pos; r++) { /* rows in order: each value row is read once, contiguously */
        __m256 p = _mm256_set1_ps(scores[r]);
        const float *v = values + r * d;
        for (int64_t e = 0; e < d; e += 8)
            _mm256_storeu_ps(o + e, _mm256_fmadd_ps(p, _mm256_loadu_ps(v + e), _mm256_loadu_ps(o + e)));
    }
    __m256 inv = _mm256_set1_ps(1.0f / total);
    for (int64_t e = 0; e < d; e += 8) _mm256_storeu_ps(o + e, _mm256_mul_ps(_mm256_loadu_ps(o + e), inv));
}
