/* The box's arithmetic peak, for benchmarks/prefill_profile.py: loops whose every instruction is an
 * independent multiply-add on registers (no loads, no stores), so they run at the core's FMA (or
 * bfloat16 dot-product) throughput and nothing else. Each call runs on the calling thread; the caller
 * runs one per compute thread at once.
 *
 * Twelve accumulators: enough independent chains to cover a 4-cycle FMA latency on two pipes; the
 * inner loop unrolled, so that they stay in registers (a rolled loop indexes them in memory: ~1/3 of
 * the peak).
 * Returns the floating-point operations done (a multiply-add counts as two); -1 where this build's
 * CPU flags do not have the instructions. The sums are written to `sink` so the loop is not removed.
 */
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#define CHAINS 12  /* the unroll pragmas below repeat it (they take no macro) */

/* The widest float32 FMA this build's CPU flags have: one loop below for either width. */
#if defined(__AVX512F__)
#define FLOAT_LANES 16
typedef __m512 float_lanes;
#define SET_LANES _mm512_set1_ps
#define FMA_LANES _mm512_fmadd_ps
#elif defined(__AVX2__) && defined(__FMA__)
#define FLOAT_LANES 8
typedef __m256 float_lanes;
#define SET_LANES _mm256_set1_ps
#define FMA_LANES _mm256_fmadd_ps
#endif

long long float32_fma_loop(long long iterations, float *sink) {
#if defined(FLOAT_LANES)
    float_lanes acc[CHAINS];
    const float_lanes scale = SET_LANES(0.999f), add = SET_LANES(0.001f);
    for (int c = 0; c < CHAINS; c++) acc[c] = SET_LANES((float)c);
    for (long long i = 0; i < iterations; i++) {
#pragma GCC unroll 12
        for (int c = 0; c < CHAINS; c++) acc[c] = FMA_LANES(acc[c], scale, add);
    }
    float lanes[FLOAT_LANES], total = 0.0f;
    for (int c = 0; c < CHAINS; c++) {
        memcpy(lanes, &acc[c], sizeof lanes);
        for (int lane = 0; lane < FLOAT_LANES; lane++) total += lanes[lane];
    }
    *sink = total;
    return iterations * CHAINS * FLOAT_LANES * 2;
#else
    (void)iterations, (void)sink;
    return -1;
#endif
}

long long bfloat16_dot_loop(long long iterations, float *sink) {
#if defined(__AVX512BF16__)
    __m512 acc[CHAINS];
    /* 2^-10 in every bfloat16 lane: each instruction adds 32 products of 2^-20 per output lane. */
    const __m512bh small = (__m512bh)_mm512_set1_epi16(0x3A80);
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_setzero_ps();
    for (long long i = 0; i < iterations; i++) {
#pragma GCC unroll 12
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_dpbf16_ps(acc[c], small, small);
    }
    __m512 total = acc[0];
    for (int c = 1; c < CHAINS; c++) total = _mm512_add_ps(total, acc[c]);
    *sink = _mm512_reduce_add_ps(total);
    return iterations * CHAINS * 32 * 2;  /* 16 lanes x 2 products, a multiply and an add each */
#else
    (void)iterations, (void)sink;
    return -1;
#endif
}
