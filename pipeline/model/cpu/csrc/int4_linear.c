/* y = x W^T (+ b) with W kept as 4-bit values in groups of 32 inputs (GGUF's Q4_0 / Q4_1 blocks),
 * laid out in blocks of 16 output columns so that one vector lane holds one column (CPU).
 *
 * Decode reads each weight once per step; on a 2-core box the arithmetic around each weight costs
 * as much as reading it, and every extra input row (a speculative draft being verified, another
 * sequence) repeats that arithmetic. So the layout puts 16 columns side by side: a 32-bit lane holds
 * one column's pair of adjacent weights, one instruction (VPDPWSSD, or VPMADDWD + add) multiplies 16
 * columns' pairs by one pair of x broadcast to every lane, and a group's integer dot products
 * accumulate in the lanes themselves. Converting to float and scaling then happens once per group
 * for 16 columns, not once per column, and the 16 results store without horizontal sums.
 * (SmolLM2 Q4_1, one row, Xeon with AVX-512: see the figures in docs/benchmarks.md.)
 *
 * Layout (pack_column_blocks in quantized_linear.py writes it): columns in blocks of 16, the last
 * padded with zero weights; block b's group g is 256 bytes at (b * groups + g) * 256, eight chunks
 * of 32 bytes. Chunk i's byte 2 c + h (c = column 0..15, h = 0, 1) holds the column's weight
 * 32 g + 2 i + h in its low half and weight 32 g + 2 i + h + 16 in its high half. Widened to 16 bits,
 * a chunk's low halves give each column's pair (2 i, 2 i + 1) in lane c, its high halves the pair
 * (2 i + 16, 2 i + 17): the x pairs at those offsets, broadcast, multiply them.
 * Worked example: column 3's weights 4 and 5 of group 0 are the low halves of chunk 2's bytes 6
 * and 7; weights 20 and 21 are the same bytes' high halves.
 * Scales [blocks, groups, 2, 16] float16: the block's 16 d, then its 16 m, w = q * d + m (GGUF Q4_1's
 * (d, m); Q4_0's (d, -8 d)). Sum over a group: d * x_scale * (q . x_q) + m * sum(x).
 *
 * Every row's output is computed by the same operations in the same order however many rows a call
 * takes (row groups only share the widened weights, and integer sums are exact in any order), so a
 * row's result does not depend on its neighbours: a verified draft position gets bit for bit the
 * logits a one-row decode step gives.
 *
 * x [M, I], y [M, O] float32 or bfloat16 as io_bf16 says (bf16.h), bias [O] float32 or NULL;
 * gated: x is [M, 2 I], a gated MLP's [gate | up] (input_rows.h).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "column_blocks.h"
#include "quantized_inputs.h"
#include "threads.h"

#define BLOCK_GROUP_BYTES 256 /* one group of 32 inputs for a block's 16 columns */
#define CHUNKS 8              /* of 32 bytes per block and group */
#define MAX_GROUPS 2048       /* in_features up to 65536 */

typedef struct {
    void *y;
    QuantizedRows x;
    const uint8_t *chunks;
    const uint16_t *scales; /* [blocks, groups, 2, 16] float16 */
    const float *bias;
    int64_t rows, out_features, in_features;
    int io_bf16;
} Problem;

/* Row m's 16 results of block b into y (the last block's padding columns dropped). */
static void store_block(const Problem *p, int64_t m, int64_t b, const float *sums) {
    const int64_t first = b * BLOCK, count = p->out_features - first < BLOCK ? p->out_features - first : BLOCK;
    for (int64_t c = 0; c < count; c++)
        store_output(p->y, p->io_bf16, m * p->out_features + first + c,
                     sums[c] + (p->bias ? p->bias[first + c] : 0.0f));
}

typedef void (*block_fn)(const Problem *, int64_t, int64_t);

#if defined(COLUMN_BLOCKS_AVX512)

/* Rows first .. first + M - 1 of block b. Each row's group dot products run in CHAINS independent
 * integer sums (one chain of 16 multiply-adds would wait on each one's latency with few rows); the
 * chains add up exactly, so their number changes no result. */
#define DEFINE_INT4_BLOCK(M, CHAINS)                                                                   \
    static void int4_block_##M(const Problem *p, int64_t first, int64_t b) {                           \
        const int64_t groups = p->in_features / GROUP;                                                 \
        const uint8_t *chunks = p->chunks + b * groups * BLOCK_GROUP_BYTES;                            \
        const uint16_t *halves = p->scales + b * groups * 2 * BLOCK;                                   \
        const __m512i low_mask = _mm512_set1_epi16(0x0F);                                              \
        __m512 acc[M];                                                                                 \
        for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();                                      \
        for (int64_t g = 0; g < groups; g++) {                                                         \
            __m512i dot[M][CHAINS];                                                                    \
            for (int m = 0; m < M; m++)                                                                \
                for (int k = 0; k < CHAINS; k++) dot[m][k] = _mm512_setzero_si512();                   \
            for (int i = 0; i < CHUNKS; i++) {                                                         \
                const __m512i wide = _mm512_cvtepu8_epi16(                                             \
                    _mm256_loadu_si256((const __m256i *)(chunks + g * BLOCK_GROUP_BYTES + 32 * i)));     \
                const __m512i low = _mm512_and_si512(wide, low_mask), high = _mm512_srli_epi16(wide, 4); \
                for (int m = 0; m < M; m++) {                                                          \
                    const int16_t *xq = p->x.x_q + ((first + m) * groups + g) * GROUP;                 \
                    dot[m][(2 * i) % CHAINS] =                                                         \
                        pair_dot(dot[m][(2 * i) % CHAINS], low, _mm512_set1_epi32(x_pair(xq, 2 * i))); \
                    dot[m][(2 * i + 1) % CHAINS] = pair_dot(dot[m][(2 * i + 1) % CHAINS], high,        \
                                                            _mm512_set1_epi32(x_pair(xq, 2 * i + 16))); \
                }                                                                                      \
            }                                                                                          \
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(halves + g * 2 * BLOCK))); \
            const __m512 mins = _mm512_cvtph_ps(                                                       \
                _mm256_loadu_si256((const __m256i *)(halves + g * 2 * BLOCK + BLOCK)));                \
            for (int m = 0; m < M; m++) {                                                              \
                __m512i total = dot[m][0];                                                             \
                for (int k = 1; k < CHAINS; k++) total = _mm512_add_epi32(total, dot[m][k]);           \
                const int64_t at = (first + m) * groups + g;                                           \
                const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(p->x.scales[at]));                \
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), scale, acc[m]);                    \
                acc[m] = _mm512_fmadd_ps(mins, _mm512_set1_ps(p->x.sums[at]), acc[m]);                 \
            }                                                                                          \
        }                                                                                              \
        for (int m = 0; m < M; m++) {                                                                  \
            float sums[BLOCK];                                                                         \
            _mm512_storeu_ps(sums, acc[m]);                                                            \
            store_block(p, first + m, b, sums);                                                        \
        }                                                                                              \
    }

DEFINE_INT4_BLOCK(1, 4)
DEFINE_INT4_BLOCK(2, 4)
DEFINE_INT4_BLOCK(3, 2)
DEFINE_INT4_BLOCK(4, 2)
DEFINE_INT4_BLOCK(5, 1)
DEFINE_INT4_BLOCK(6, 1)
DEFINE_INT4_BLOCK(7, 1)
DEFINE_INT4_BLOCK(8, 1)
static const block_fn BLOCKS[ROWS_PER_PASS] = {int4_block_1, int4_block_2, int4_block_3, int4_block_4,
                                               int4_block_5, int4_block_6, int4_block_7, int4_block_8};

#elif defined(COLUMN_BLOCKS_AVX2)

/* As the AVX-512 block, in two halves of 8 columns (bytes 0-15 and 16-31 of each chunk), at most 4
 * rows at a time (16 vector registers). The first half's pass over a group asks for the weights
 * AHEAD_BYTES further on (into the next blocks at a block's end: a task's blocks lie one after the
 * other) and their scales: the hardware prefetchers alone left the reads behind. C harness, one row,
 * weights from memory, 2-core Zen 3 VM, median of 4 alternated runs, 2 threads: 3072 x 576 56.4 ->
 * 50.2 us, 576 x 1536 39.4 -> 33.1 us, 960 x 576 20.6 -> 18.9 us; one thread 3072 x 576 91.8 -> 81.9
 * us (1024 bytes ahead gained less; 4096 about the same). */
#define AHEAD_BYTES 2048

static inline void prefetch_group_ahead(const uint8_t *chunks, const uint16_t *halves) {
    const char *weights = (const char *)chunks + AHEAD_BYTES; /* a group: 256 bytes of weights, 64 of scales */
    for (int line = 0; line < BLOCK_GROUP_BYTES; line += 64) _mm_prefetch(weights + line, _MM_HINT_T0);
    _mm_prefetch((const char *)halves + AHEAD_BYTES / 4, _MM_HINT_T0);
}

#define DEFINE_INT4_BLOCK(M, CHAINS)                                                                   \
    static void int4_block_##M(const Problem *p, int64_t first, int64_t b) {                           \
        const int64_t groups = p->in_features / GROUP;                                                 \
        const uint8_t *chunks = p->chunks + b * groups * BLOCK_GROUP_BYTES;                            \
        const uint16_t *halves = p->scales + b * groups * 2 * BLOCK;                                   \
        const __m256i low_mask = _mm256_set1_epi16(0x0F);                                              \
        float sums[M][BLOCK];                                                                          \
        for (int half = 0; half < 2; half++) {                                                         \
            __m256 acc[M];                                                                             \
            for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();                                  \
            for (int64_t g = 0; g < groups; g++) {                                                     \
                if (half == 0) prefetch_group_ahead(chunks + g * BLOCK_GROUP_BYTES, halves + g * 2 * BLOCK); \
                __m256i dot[M][CHAINS];                                                                \
                for (int m = 0; m < M; m++)                                                            \
                    for (int k = 0; k < CHAINS; k++) dot[m][k] = _mm256_setzero_si256();               \
                for (int i = 0; i < CHUNKS; i++) {                                                     \
                    const __m256i wide = _mm256_cvtepu8_epi16(_mm_loadu_si128(                         \
                        (const __m128i *)(chunks + g * BLOCK_GROUP_BYTES + 32 * i + 16 * half)));      \
                    const __m256i low = _mm256_and_si256(wide, low_mask), high = _mm256_srli_epi16(wide, 4); \
                    for (int m = 0; m < M; m++) {                                                      \
                        const int16_t *xq = p->x.x_q + ((first + m) * groups + g) * GROUP;             \
                        dot[m][(2 * i) % CHAINS] =                                                     \
                            pair_dot(dot[m][(2 * i) % CHAINS], low, _mm256_set1_epi32(x_pair(xq, 2 * i))); \
                        dot[m][(2 * i + 1) % CHAINS] = pair_dot(dot[m][(2 * i + 1) % CHAINS], high,    \
                                                                _mm256_set1_epi32(x_pair(xq, 2 * i + 16))); \
                    }                                                                                  \
                }                                                                                      \
                const uint16_t *at_half = halves + g * 2 * BLOCK + 8 * half;                           \
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)at_half));           \
                const __m256 mins = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(at_half + BLOCK))); \
                for (int m = 0; m < M; m++) {                                                          \
                    __m256i total = dot[m][0];                                                         \
                    for (int k = 1; k < CHAINS; k++) total = _mm256_add_epi32(total, dot[m][k]);       \
                    const int64_t at = (first + m) * groups + g;                                       \
                    const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(p->x.scales[at]));            \
                    acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), scale, acc[m]);                \
                    acc[m] = _mm256_fmadd_ps(mins, _mm256_set1_ps(p->x.sums[at]), acc[m]);             \
                }                                                                                      \
            }                                                                                          \
            for (int m = 0; m < M; m++) _mm256_storeu_ps(sums[m] + 8 * half, acc[m]);                  \
        }                                                                                              \
        for (int m = 0; m < M; m++) store_block(p, first + m, b, sums[m]);                             \
    }

DEFINE_INT4_BLOCK(1, 4)
DEFINE_INT4_BLOCK(2, 2)
DEFINE_INT4_BLOCK(3, 1)
DEFINE_INT4_BLOCK(4, 1)
static const block_fn BLOCKS[ROWS_PER_PASS] = {int4_block_1, int4_block_2, int4_block_3, int4_block_4};

#else /* portable: the same sums, one lane at a time */
static void int4_block_1(const Problem *p, int64_t m, int64_t b) {
    const int64_t groups = p->in_features / GROUP;
    const uint8_t *chunks = p->chunks + b * groups * BLOCK_GROUP_BYTES;
    const uint16_t *halves = p->scales + b * groups * 2 * BLOCK;
    float sums[BLOCK] = {0};
    for (int64_t g = 0; g < groups; g++) {
        const int16_t *xq = p->x.x_q + (m * groups + g) * GROUP;
        const int64_t at = m * groups + g;
        for (int c = 0; c < BLOCK; c++) {
            int32_t dot = 0;
            for (int i = 0; i < CHUNKS; i++)
                for (int h = 0; h < 2; h++) {
                    const uint8_t byte = chunks[g * BLOCK_GROUP_BYTES + 32 * i + 2 * c + h];
                    dot += (byte & 0x0F) * xq[2 * i + h] + (byte >> 4) * xq[2 * i + h + 16];
                }
            const float d = half_to_float(halves[g * 2 * BLOCK + c]), mins = half_to_float(halves[g * 2 * BLOCK + BLOCK + c]);
            sums[c] = fmaf((float)dot, d * p->x.scales[at], sums[c]); /* fused, as the vector paths */
            sums[c] = fmaf(mins, p->x.sums[at], sums[c]);
        }
    }
    store_block(p, m, b, sums);
}
static const block_fn BLOCKS[ROWS_PER_PASS] = {int4_block_1};
#endif

DEFINE_RUN_BLOCKS(Problem, BLOCKS)


/* Returns 0, 1 when in_features is not a multiple of 32 (or above 32 * MAX_GROUPS), 2 when out of memory. */
int quantized_linear_int4(void *y, const void *x, const uint8_t *chunks, const uint16_t *scales, const float *bias,
                          int64_t rows, int64_t out_features, int64_t in_features, int io_bf16, int gated,
                          int num_threads) {
    if (in_features % GROUP || in_features / GROUP > MAX_GROUPS) return 1;
    Problem p = {y, {0}, chunks, scales, bias, rows, out_features, in_features, io_bf16};
    if (quantize_rows(&p.x, x, rows, in_features, in_features, io_bf16, gated)) return 2;
    const int64_t blocks = blocks_of(out_features), passes = (rows + ROWS_PER_PASS - 1) / ROWS_PER_PASS;
    /* Work in threads.h's units: the bytes a bfloat16 weight of this shape would take, per pass over
     * the rows (widening the 4-bit values costs about what reading bfloat16 does). */
    const int threads = threads_for(out_features * in_features * 2 * passes, num_threads);
    pool_run(run_blocks, &p, blocks, columns_per_task(blocks, threads, BLOCKS_PER_TASK), threads);
    free_quantized_rows(&p.x);
    return 0;
}

/* The weight as a plain [O, I] matrix, float32 or (out_bf16) bfloat16 rounded to nearest even:
 * w = q * d + m, multiplied then added in float32 (no fused multiply-add), the values
 * Int4Linear.dequantized() computes. For many rows a plain matrix product beats the kernel above
 * (quantized_linear.py says when), and writing the weight out costs about one pass. */
typedef struct {
    void *out;
    const uint8_t *chunks;
    const uint16_t *scales;
    int64_t out_features, in_features;
    int out_bf16;
} Dequantize;

static void dequantize_blocks(void *context, int64_t begin, int64_t end) {
    const Dequantize *c = (const Dequantize *)context;
    const int64_t groups = c->in_features / GROUP;
    for (int64_t b = begin; b < end; b++)
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *chunks = c->chunks + (b * groups + g) * BLOCK_GROUP_BYTES;
            const uint16_t *halves = c->scales + (b * groups + g) * 2 * BLOCK;
            for (int column = 0; column < BLOCK && b * BLOCK + column < c->out_features; column++) {
                const float d = half_to_float(halves[column]), m = half_to_float(halves[BLOCK + column]);
                const int64_t at = (b * BLOCK + column) * c->in_features + g * GROUP;
                for (int i = 0; i < CHUNKS; i++)
                    for (int h = 0; h < 2; h++) {
                        const uint8_t byte = chunks[32 * i + 2 * column + h];
                        const float low = (float)(byte & 0x0F) * d + m, high = (float)(byte >> 4) * d + m;
                        const int64_t k = at + 2 * i + h;
                        if (c->out_bf16) {
                            ((uint16_t *)c->out)[k] = float_to_bf16(low);
                            ((uint16_t *)c->out)[k + 16] = float_to_bf16(high);
                        } else {
                            ((float *)c->out)[k] = low;
                            ((float *)c->out)[k + 16] = high;
                        }
                    }
            }
        }
}

/* Columns [0, out_features) of the blocks at `chunks`. Returns 0, 1 when in_features is not a multiple of 32. */
int dequantize_int4(void *out, const uint8_t *chunks, const uint16_t *scales, int64_t out_features,
                    int64_t in_features, int out_bf16, int num_threads) {
    if (in_features % GROUP) return 1;
    Dequantize context = {out, chunks, scales, out_features, in_features, out_bf16};
    const int64_t blocks = blocks_of(out_features);
    const int threads = threads_for(out_features * in_features * 2, num_threads);
    pool_run(dequantize_blocks, &context, blocks, columns_per_task(blocks, threads, BLOCKS_PER_TASK), threads);
    return 0;
}
