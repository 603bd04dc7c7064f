/* What the column-block kernels (int4_linear.c, int8_linear.c) share: the block width, the x pairs
 * a lane multiplies, the pair dot product on each vector width, and the loop over blocks and rows.
 *
 * A block is 16 output columns side by side, one per vector lane (AVX-512; AVX2 takes it in two
 * halves of 8). Each lane multiplies its column's pair of adjacent 16-bit weights by a pair of x
 * values broadcast to every lane, and sums both products into its 32-bit integer (VPDPWSSD, or
 * VPMADDWD + add without VNNI).
 * Worked example (one lane): weights (3, -2), x pair (100, 7) -> 3 * 100 + (-2) * 7 = 286 added.
 */
#ifndef AQUEDUCT_COLUMN_BLOCKS_H
#define AQUEDUCT_COLUMN_BLOCKS_H

#include <stdint.h>
#include <string.h>

#define BLOCK 16          /* output columns per block */
#define BLOCKS_PER_TASK 2 /* the fewest blocks a task takes (threads.h spreads larger weights) */

static inline int64_t blocks_of(int64_t out_features) { return (out_features + BLOCK - 1) / BLOCK; }

/* x_q[k] and x_q[k + 1] as one 32-bit value (little-endian: x_q[k] in the low half), the pair a lane
 * multiplies by its column's two weights. */
static inline int32_t x_pair(const int16_t *xq, int k) {
    int32_t pair;
    memcpy(&pair, xq + k, sizeof pair);
    return pair;
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define ROWS_PER_PASS 8
#define COLUMN_BLOCKS_AVX512 1

static inline __m512i pair_dot(__m512i acc, __m512i w, __m512i x) {
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(acc, w, x);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(w, x));
#endif
}

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define ROWS_PER_PASS 4 /* 16 vector registers */
#define COLUMN_BLOCKS_AVX2 1

static inline __m256i pair_dot(__m256i acc, __m256i w, __m256i x) {
#if defined(__AVXVNNI__)
    return _mm256_dpwssd_avx_epi32(acc, w, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(w, x));
#endif
}

#else /* portable C: one lane at a time */
#define ROWS_PER_PASS 1
#endif

/* run_blocks(context, begin, end): blocks [begin, end) for every row of the PROBLEM at `context`,
 * ROWS_PER_PASS rows at a time through BLOCK_FUNCTIONS[rows - 1] (a task's blocks stay in cache
 * across the passes). */
#define DEFINE_RUN_BLOCKS(PROBLEM, BLOCK_FUNCTIONS)                                                    \
    static void run_blocks(void *context, int64_t begin, int64_t end) {                               \
        const PROBLEM *p = (const PROBLEM *)context;                                                   \
        const int64_t full_passes = p->rows / ROWS_PER_PASS, rest = p->rows % ROWS_PER_PASS;           \
        for (int64_t b = begin; b < end; b++) {                                                        \
            for (int64_t pass = 0; pass < full_passes; pass++)                                         \
                BLOCK_FUNCTIONS[ROWS_PER_PASS - 1](p, pass * ROWS_PER_PASS, b);                        \
            if (rest) BLOCK_FUNCTIONS[rest - 1](p, full_passes * ROWS_PER_PASS, b);                    \
        }                                                                                              \
    }

#endif
