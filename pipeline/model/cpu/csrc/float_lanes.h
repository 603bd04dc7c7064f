/* 16 float32 lanes for gguf_linear.c, on AVX-512, AVX2 (two halves) or plain C. Every variant
 * computes lane l's fma(w, x, acc) and the same pairwise sums, so results match bit for bit across
 * them; lanes_total adds the 16 lanes as lane l += lane l + 8, l + 4, l + 2, l + 1.
 * Worked example (lanes 0..15 holding 0..15): 0 + 8, 1 + 9, ... -> 8, 10, 12, ..., 22; then
 * 8 + 16, ... -> 24, 28, 32, 36; then 56, 64; then 120 = 0 + 1 + ... + 15.
 */
#ifndef AQUEDUCT_FLOAT_LANES_H
#define AQUEDUCT_FLOAT_LANES_H

#include <math.h>
#include <string.h>

#define LANES 16

#if defined(__AVX512F__)
#include <immintrin.h>
typedef __m512 Lanes;
static inline Lanes lanes_zero(void) { return _mm512_setzero_ps(); }
static inline Lanes lanes_load(const float *at) { return _mm512_loadu_ps(at); }
static inline Lanes lanes_fma(Lanes w, Lanes x, Lanes acc) { return _mm512_fmadd_ps(w, x, acc); }
static inline Lanes lanes_add(Lanes a, Lanes b) { return _mm512_add_ps(a, b); }
static inline void lanes_store(float *at, Lanes v) { _mm512_storeu_ps(at, v); }
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
typedef struct { __m256 low, high; } Lanes;
static inline Lanes lanes_zero(void) { return (Lanes){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline Lanes lanes_load(const float *at) { return (Lanes){_mm256_loadu_ps(at), _mm256_loadu_ps(at + 8)}; }
static inline Lanes lanes_fma(Lanes w, Lanes x, Lanes acc) {
    return (Lanes){_mm256_fmadd_ps(w.low, x.low, acc.low), _mm256_fmadd_ps(w.high, x.high, acc.high)};
}
static inline Lanes lanes_add(Lanes a, Lanes b) {
    return (Lanes){_mm256_add_ps(a.low, b.low), _mm256_add_ps(a.high, b.high)};
}
static inline void lanes_store(float *at, Lanes v) {
    _mm256_storeu_ps(at, v.low);
    _mm256_storeu_ps(at + 8, v.high);
}
#else
typedef struct { float v[LANES]; } Lanes;
static inline Lanes lanes_zero(void) { return (Lanes){{0}}; }
static inline Lanes lanes_load(const float *at) {
    Lanes out;
    memcpy(out.v, at, sizeof out.v);
    return out;
}
static inline Lanes lanes_fma(Lanes w, Lanes x, Lanes acc) {
    for (int l = 0; l < LANES; l++) acc.v[l] = fmaf(w.v[l], x.v[l], acc.v[l]);
    return acc;
}
static inline Lanes lanes_add(Lanes a, Lanes b) {
    for (int l = 0; l < LANES; l++) a.v[l] += b.v[l];
    return a;
}
static inline void lanes_store(float *at, Lanes v) { memcpy(at, v.v, sizeof v.v); }
#endif

/* The vector variants add the same pairs as the plain one, with shuffles. */
#if defined(__AVX512F__)
static inline float lanes_total(Lanes v) {
    const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 eight = _mm256_add_ps(_mm512_castps512_ps256(v), high);
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
}
#elif defined(__AVX2__) && defined(__FMA__)
static inline float lanes_total(Lanes v) {
    const __m256 eight = _mm256_add_ps(v.low, v.high);
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
}
#else
static inline float lanes_total(Lanes v) {
    for (int width = LANES / 2; width >= 1; width /= 2)
        for (int l = 0; l < width; l++) v.v[l] += v.v[l + width];
    return v.v[0];
}
#endif

#endif
