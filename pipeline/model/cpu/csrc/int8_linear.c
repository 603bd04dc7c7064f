/* y = x W^T (+ b) with W kept as int8 with one scale per output row (CPU), laid out in blocks of 16
 * output columns as the 4-bit kernel's (int4_linear.c says why): one vector lane per column, a group
 * of 32 inputs' integer dot products accumulating in the lanes, one conversion and scaling per group
 * for 16 columns.
 *
 * Layout (pack_int8_blocks in quantized_linear.py writes it): columns in blocks of 16, the last
 * padded with zero weights; inputs padded with zero weights to a multiple of 32 (x is padded with
 * zeros alike). Block b's group g is 512 bytes at (b * groups + g) * 512, sixteen chunks of 32 bytes:
 * chunk i's byte 2 c + h holds column c's weight 32 g + 2 i + h. Widened to 16 bits, chunk i gives
 * each column's pair (2 i, 2 i + 1) in lane c. Scales [blocks * 16] float32 (padding: 0).
 * Worked example: column 5's weights 6 and 7 of group 1 are bytes 10 and 11 of chunk 3 of the 512 at
 * (b * groups + 1) * 512.
 * Per group the integer dot product (at most 32 * 127 * 32767 < 2^31) is exact; it becomes float32
 * once, times x's group scale; the row's sum times the column's scale, plus the bias.
 *
 * As in the 4-bit kernel, every row is computed by the same operations in the same order however
 * many rows share a call, and the vector and portable paths give the same bits.
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

#define BLOCK_GROUP_BYTES 512 /* one group of 32 inputs for a block's 16 columns */
#define CHUNKS 16             /* of 32 bytes per block and group */

typedef struct {
    void *y;
    QuantizedRows x;
    const int8_t *chunks;
    const float *scales; /* [blocks * 16] */
    const float *bias;
    int64_t rows, out_features, groups; /* groups: padded in_features / 32 */
    int io_bf16;
} Problem;

/* Row m's 16 sums of block b, times the columns' scales, plus the bias, into y (padding dropped). */
static void store_block(const Problem *p, int64_t m, int64_t b, const float *sums) {
    const int64_t first = b * BLOCK, count = p->out_features - first < BLOCK ? p->out_features - first : BLOCK;
    for (int64_t c = 0; c < count; c++)
        store_output(p->y, p->io_bf16, m * p->out_features + first + c,
                     sums[c] * p->scales[first + c] + (p->bias ? p->bias[first + c] : 0.0f));
}

typedef void (*block_fn)(const Problem *, int64_t, int64_t);

#if defined(COLUMN_BLOCKS_AVX512)

#define DEFINE_INT8_BLOCK(M, CHAINS)                                                                   \
    static void int8_block_##M(const Problem *p, int64_t first, int64_t b) {                           \
        const int64_t groups = p->groups;                                                              \
        const int8_t *chunks = p->chunks + b * groups * BLOCK_GROUP_BYTES;                             \
        __m512 acc[M];                                                                                 \
        for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();                                      \
        for (int64_t g = 0; g < groups; g++) {                                                         \
            __m512i dot[M][CHAINS];                                                                    \
            for (int m = 0; m < M; m++)                                                                \
                for (int k = 0; k < CHAINS; k++) dot[m][k] = _mm512_setzero_si512();                   \
            for (int i = 0; i < CHUNKS; i++) {                                                         \
                const __m512i w = _mm512_cvtepi8_epi16(                                                \
                    _mm256_loadu_si256((const __m256i *)(chunks + g * BLOCK_GROUP_BYTES + 32 * i)));     \
                for (int m = 0; m < M; m++) {                                                          \
                    const int16_t *xq = p->x.x_q + ((first + m) * groups + g) * GROUP;                 \
                    dot[m][i % CHAINS] = pair_dot(dot[m][i % CHAINS], w, _mm512_set1_epi32(x_pair(xq, 2 * i))); \
                }                                                                                      \
            }                                                                                          \
            for (int m = 0; m < M; m++) {                                                              \
                __m512i total = dot[m][0];                                                             \
                for (int k = 1; k < CHAINS; k++) total = _mm512_add_epi32(total, dot[m][k]);           \
                const __m512 scale = _mm512_set1_ps(p->x.scales[(first + m) * groups + g]);            \
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), scale, acc[m]);                    \
            }                                                                                          \
        }                                                                                              \
        for (int m = 0; m < M; m++) {                                                                  \
            float sums[BLOCK];                                                                         \
            _mm512_storeu_ps(sums, acc[m]);                                                            \
            store_block(p, first + m, b, sums);                                                        \
        }                                                                                              \
    }

DEFINE_INT8_BLOCK(1, 4)
DEFINE_INT8_BLOCK(2, 4)
DEFINE_INT8_BLOCK(3, 2)
DEFINE_INT8_BLOCK(4, 2)
DEFINE_INT8_BLOCK(5, 1)
DEFINE_INT8_BLOCK(6, 1)
DEFINE_INT8_BLOCK(7, 1)
DEFINE_INT8_BLOCK(8, 1)
static const block_fn BLOCKS[ROWS_PER_PASS] = {int8_block_1, int8_block_2, int8_block_3, int8_block_4,
                                               int8_block_5, int8_block_6, int8_block_7, int8_block_8};

#elif defined(COLUMN_BLOCKS_AVX2)

/* As the AVX-512 block, in two halves of 8 columns (bytes 0-15 and 16-31 of each chunk). */
#define DEFINE_INT8_BLOCK(M, CHAINS)                                                                   \
    static void int8_block_##M(const Problem *p, int64_t first, int64_t b) {                           \
        const int64_t groups = p->groups;                                                              \
        const int8_t *chunks = p->chunks + b * groups * BLOCK_GROUP_BYTES;                             \
        float sums[M][BLOCK];                                                                          \
        for (int half = 0; half < 2; half++) {                                                         \
            __m256 acc[M];                                                                             \
            for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();                                  \
            for (int64_t g = 0; g < groups; g++) {                                                     \
                __m256i dot[M][CHAINS];                                                                \
                for (int m = 0; m < M; m++)                                                            \
                    for (int k = 0; k < CHAINS; k++) dot[m][k] = _mm256_setzero_si256();               \
                for (int i = 0; i < CHUNKS; i++) {                                                     \
                    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(                            \
                        (const __m128i *)(chunks + g * BLOCK_GROUP_BYTES + 32 * i + 16 * half)));      \
                    for (int m = 0; m < M; m++) {                                                      \
                        const int16_t *xq = p->x.x_q + ((first + m) * groups + g) * GROUP;             \
                        dot[m][i % CHAINS] = pair_dot(dot[m][i % CHAINS], w, _mm256_set1_epi32(x_pair(xq, 2 * i))); \
                    }                                                                                  \
                }                                                                                      \
                for (int m = 0; m < M; m++) {                                                          \
                    __m256i total = dot[m][0];                                                         \
                    for (int k = 1; k < CHAINS; k++) total = _mm256_add_epi32(total, dot[m][k]);       \
                    const __m256 scale = _mm256_set1_ps(p->x.scales[(first + m) * groups + g]);        \
                    acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), scale, acc[m]);                \
                }                                                                                      \
            }                                                                                          \
            for (int m = 0; m < M; m++) _mm256_storeu_ps(sums[m] + 8 * half, acc[m]);                  \
        }                                                                                              \
        for (int m = 0; m < M; m++) store_block(p, first + m, b, sums[m]);                             \
    }

DEFINE_INT8_BLOCK(1, 4)
DEFINE_INT8_BLOCK(2, 2)
DEFINE_INT8_BLOCK(3, 1)
DEFINE_INT8_BLOCK(4, 1)
static const block_fn BLOCKS[ROWS_PER_PASS] = {int8_block_1, int8_block_2, int8_block_3, int8_block_4};

#else /* portable: the same sums, one lane at a time */
static void int8_block_1(const Problem *p, int64_t m, int64_t b) {
    const int8_t *chunks = p->chunks + b * p->groups * BLOCK_GROUP_BYTES;
    float sums[BLOCK] = {0};
    for (int64_t g = 0; g < p->groups; g++) {
        const int16_t *xq = p->x.x_q + (m * p->groups + g) * GROUP;
        for (int c = 0; c < BLOCK; c++) {
            int32_t dot = 0;
            for (int i = 0; i < CHUNKS; i++)
                for (int h = 0; h < 2; h++) dot += chunks[g * BLOCK_GROUP_BYTES + 32 * i + 2 * c + h] * xq[2 * i + h];
            sums[c] = fmaf((float)dot, p->x.scales[m * p->groups + g], sums[c]); /* fused, as the vector paths */
        }
    }
    store_block(p, m, b, sums);
}
static const block_fn BLOCKS[ROWS_PER_PASS] = {int8_block_1};
#endif

DEFINE_RUN_BLOCKS(Problem, BLOCKS)

static int64_t groups_of(int64_t in_features) { return (in_features + GROUP - 1) / GROUP; }

/* Returns 0, or 2 when out of memory. */
int quantized_linear_int8(void *y, const void *x, const int8_t *chunks, const float *scales, const float *bias,
                          int64_t rows, int64_t out_features, int64_t in_features, int io_bf16, int gated,
                          int num_threads) {
    const int64_t groups = groups_of(in_features);
    Problem p = {y, {0}, chunks, scales, bias, rows, out_features, groups, io_bf16};
    if (quantize_rows(&p.x, x, rows, in_features, groups * GROUP, io_bf16, gated)) return 2;
    const int64_t blocks = blocks_of(out_features), passes = (rows + ROWS_PER_PASS - 1) / ROWS_PER_PASS;
    const int threads = threads_for(out_features * in_features * 2 * passes, num_threads);
    pool_run(run_blocks, &p, blocks, columns_per_task(blocks, threads, BLOCKS_PER_TASK), threads);
    free_quantized_rows(&p.x);
    return 0;
}

/* The weight as a plain [O, I] matrix, float32 or (out_bf16) bfloat16: w = q * scale, the values
 * Int8Linear.dequantized() computes; for many rows a plain matrix product beats the kernel above. */
typedef struct {
    void *out;
    const int8_t *chunks;
    const float *scales;
    int64_t out_features, in_features;
    int out_bf16;
} Dequantize;

static void dequantize_blocks(void *context, int64_t begin, int64_t end) {
    const Dequantize *c = (const Dequantize *)context;
    const int64_t groups = groups_of(c->in_features);
    for (int64_t b = begin; b < end; b++)
        for (int column = 0; column < BLOCK && b * BLOCK + column < c->out_features; column++) {
            const float scale = c->scales[b * BLOCK + column];
            for (int64_t k = 0; k < c->in_features; k++) {
                const int64_t g = k / GROUP, i = (k % GROUP) / 2, h = k % 2;
                const float value = (float)c->chunks[(b * groups + g) * BLOCK_GROUP_BYTES + 32 * i + 2 * column + h] * scale;
                const int64_t at = (b * BLOCK + column) * c->in_features + k;
                if (c->out_bf16)
                    ((uint16_t *)c->out)[at] = float_to_bf16(value);
                else
                    ((float *)c->out)[at] = value;
            }
        }
}

/* Columns [0, out_features) of the blocks at `chunks`. */
void dequantize_int8(void *out, const int8_t *chunks, const float *scales, int64_t out_features, int64_t in_features,
                     int out_bf16, int num_threads) {
    Dequantize context = {out, chunks, scales, out_features, in_features, out_bf16};
    const int64_t blocks = blocks_of(out_features);
    const int threads = threads_for(out_features * in_features * 2, num_threads);
    pool_run(dequantize_blocks, &context, blocks, columns_per_task(blocks, threads, BLOCKS_PER_TASK), threads);
}
