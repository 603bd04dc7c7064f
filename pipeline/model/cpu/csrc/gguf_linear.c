/* y = x W^T (+ b) with W kept as the GGUF file's blocks (Q4_K, Q5_K, Q6_K, Q5_0, Q8_0, Q4_0, Q4_1;
 * gguf_blocks.h has the layouts), rows in the file's order, unchanged: resident bytes are the file's.
 * This file multiplies those rows with float products; a segment may instead be held in column blocks
 * (gguf_columns.c: the same q and scales re-laid for integer products, where the CPU has AVX-512),
 * and gguf_linear() hands such segments to that kernel, each segment a parallel call of its own.
 *
 * Why float products, not llama.cpp's integer ones: llama.cpp quantizes x to int8 per block (q8_K /
 * q8_0), rounding each input to 1 part in 254 of its block's largest, and multiplies integers. A
 * float32 model here is held to transformers' greedy tokens on the dequantized file, which only
 * near-ties may break; so each weight row is decoded to float32 exactly as gguf-py decodes it and
 * multiplied by float32 x with fused multiply-adds: the dequantized model's product in another
 * summation order, ~1e-7 relative. (The 4-bit kernel's int16 inputs cost 1.2% of SmolLM2's top-1
 * tokens against its float32 model: quantized_inputs.h.) The price is speed: a float multiply-add
 * per weight after decoding it, against VPDPWSSD's 32 integer products per instruction.
 *
 * Order of the sum, the same for every row count and every code path (AVX-512, AVX2, portable C),
 * so a row's result is bit for bit the same whatever else shares the call: x and the decoded row are
 * taken 16 values at a time (a chunk); chunk j goes to chain j % 4; each chain keeps 16 lane sums,
 * each chunk value added to its lane by one FMA. At the end the chains add as (0 + 1) + (2 + 3),
 * then the 16 lanes pairwise: lane l += lane l + 8, l + 4, l + 2, l + 1.
 * Worked example (K = 96, six chunks): chain 0 takes chunks 0 and 4, chain 1 chunks 1 and 5, chains
 * 2 and 3 chunks 2 and 3.
 *
 * The work: columns are split between threads. For one x row (a decode step) four weight rows are
 * decoded 64 weights at a time into registers and multiplied at once (fused_*); otherwise each
 * task decodes weight rows (two at a time for two x rows) into a float32 buffer (8 KiB a row for
 * K = 2048, in L1) and multiplies them by up to ROWS rows of x per pass.
 *
 * A layer's weight may be several segments of different types one after another (a fused qkv_proj
 * whose v rows are Q6_K and q, k rows Q4_K); `segments` lists them, ended by one with no rows.
 * x [M, I], y [M, O] float32 or bfloat16 as io_bf16 says (bf16.h), bias [O] float32 or NULL;
 * gated: x is [M, 2 I], a gated MLP's [gate | up] (input_rows.h).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"
#include "float_lanes.h"
#include "gguf_blocks.h"
#include "gguf_columns.h"
#include "input_rows.h"
#include "quantized_inputs.h"
#include "threads.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include "gguf_blocks_avx512.h"
#define DECODERS BLOCK_TYPES_AVX512
#else
#define DECODERS BLOCK_TYPES
#endif

#define CHAINS 4
#define ROWS 4 /* x rows per pass: 4 rows x 4 chains = 16 vector accumulators */

/* The decoders for type id `type` (portable: gguf_blocks.h's plain C ones, which the tests hold to
 * gguf-py as well), or NULL. */
static const BlockType *block_type(int64_t type, int portable) {
    if (portable) return find_block_type(BLOCK_TYPES, sizeof BLOCK_TYPES / sizeof BLOCK_TYPES[0], type);
    return find_block_type(DECODERS, sizeof DECODERS / sizeof DECODERS[0], type);
}

typedef struct {
    int64_t type;         /* ggml's type id (gguf_blocks.h) */
    const uint8_t *blocks; /* [out_features, in_features / block_size * block_bytes], or NULL when: */
    const ColumnSegment *columns; /* the rows are held in column blocks (gguf_columns.c) */
    int64_t out_features;
} Segment;

/* The chains of one row and column, added in the header comment's fixed order. */
static inline float chains_sum(const Lanes *chain) {
    return lanes_total(lanes_add(lanes_add(chain[0], chain[1]), lanes_add(chain[2], chain[3])));
}

typedef struct {
    void *y;
    const float *x; /* [rows, in_features], widened */
    const Segment *segments;
    const float *bias;    /* the layer's, indexed from y_offset */
    int64_t rows, out_features, in_features;
    int64_t y_stride, y_offset; /* y's row length, and where this segment's columns start in it */
    int io_bf16;
} Problem;

static inline int64_t out_index(const Problem *p, int64_t row, int64_t column) {
    return row * p->y_stride + p->y_offset + column;
}

static inline float bias_at(const Problem *p, int64_t column) {
    return p->bias ? p->bias[p->y_offset + column] : 0.0f;
}

/* Rows first .. first + M - 1 times C decoded weight rows (w: C rows of in_features floats), those of
 * outputs column .. column + C - 1. One row takes 4 columns at once and two rows 2, so that 16
 * independent sums hide the multiply-adds' latency whatever the row count; each (row, column) sum
 * is the same sequence of operations in every variant. */
typedef void (*pass_fn)(const Problem *, int64_t first, int64_t column, const float *w);

#define DEFINE_PASS(M, C)                                                                              \
    static void pass_##M##_##C(const Problem *p, int64_t first, int64_t column, const float *w) {      \
        const int64_t k_size = p->in_features, full = k_size / (CHAINS * LANES) * (CHAINS * LANES);     \
        const float *x = p->x + first * k_size;                                                        \
        Lanes acc[M][C][CHAINS];                                                                       \
        for (int m = 0; m < M; m++)                                                                    \
            for (int c = 0; c < C; c++)                                                                \
                for (int h = 0; h < CHAINS; h++) acc[m][c][h] = lanes_zero();                          \
        for (int64_t k = 0; k < full; k += CHAINS * LANES)                                             \
            for (int h = 0; h < CHAINS; h++)                                                           \
                for (int c = 0; c < C; c++) {                                                          \
                    const Lanes wk = lanes_load(w + c * k_size + k + h * LANES);                       \
                    for (int m = 0; m < M; m++)                                                        \
                        acc[m][c][h] = lanes_fma(wk, lanes_load(x + m * k_size + k + h * LANES), acc[m][c][h]); \
                }                                                                                      \
        for (int64_t k = full, h = 0; k < k_size; k += LANES, h++)                                     \
            for (int c = 0; c < C; c++) {                                                              \
                const Lanes wk = lanes_load(w + c * k_size + k);                                       \
                for (int m = 0; m < M; m++) acc[m][c][h] = lanes_fma(wk, lanes_load(x + m * k_size + k), acc[m][c][h]); \
            }                                                                                          \
        for (int m = 0; m < M; m++)                                                                    \
            for (int c = 0; c < C; c++) {                                                              \
                store_output(p->y, p->io_bf16, out_index(p, first + m, column + c),                    \
                             chains_sum(acc[m][c]) + bias_at(p, column + c));                          \
            }                                                                                          \
    }

DEFINE_PASS(1, 1)
DEFINE_PASS(2, 1)
DEFINE_PASS(3, 1)
DEFINE_PASS(4, 1)
DEFINE_PASS(1, 4)
DEFINE_PASS(2, 2)
static const pass_fn PASSES[ROWS] = {pass_1_1, pass_2_1, pass_3_1, pass_4_1};

/* Weight row `column` of the whole layer: (its segment's type, its bytes). */
static const uint8_t *weight_row(const Segment *segments, int64_t in_features, int64_t column, int portable,
                                 const BlockType **type) {
    for (;; segments++) {
        if (column < segments->out_features) {
            *type = block_type(segments->type, portable);
            const int64_t row_bytes = in_features / (*type)->block_size * (*type)->block_bytes;
            return segments->blocks + column * row_bytes;
        }
        column -= segments->out_features;
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
/* One x row times four weight rows of one type, decoding each 64 weights into registers and
 * multiplying at once (no store and reload: about 1.3x pass_1_4 after a decode, for one row the
 * decode step's case). Chunk 4 g + h goes to chain h, the tail's two chunks to chains 0 and 1:
 * pass_1_4's sums, operation for operation. */
typedef void (*fused_fn)(const Problem *p, int64_t column, const uint8_t *const rows[4]);

/* The bytes at `at` in the rows four further on (the next call's) into L1, and sixteen further on
 * into L2: each call reads four rows in step, 4 x 36-68 bytes at a time, which the hardware
 * prefetchers followed too slowly. SmolLM2's shapes from memory (a Q4_K_M-like mix, 30 layers and
 * the Q8_0 head, one row, one thread, CPU time, Zen 4): 27-30 ms a token without, 15.6 with the L1
 * prefetch, 15.3 with both (the 49152-row head alone 3.4 -> 2.6 ms; int8 kernel: 8.1-8.8 in all).
 * A prefetch past the weight's end is harmless (it never faults). */
static inline void prefetch_next_group(const uint8_t *at, int64_t row_bytes) {
    _mm_prefetch((const char *)(at + 4 * row_bytes), _MM_HINT_T0);
    _mm_prefetch((const char *)(at + 16 * row_bytes), _MM_HINT_T1);
}

static inline void store_fused(const Problem *p, int64_t column, Lanes acc[4][CHAINS]) {
    for (int c = 0; c < 4; c++)
        store_output(p->y, p->io_bf16, out_index(p, 0, column + c), chains_sum(acc[c]) + bias_at(p, column + c));
}

#define DEFINE_FUSED_PAIRS(NAME, BLOCK_BYTES)                                                          \
    static void fused_##NAME(const Problem *p, int64_t column, const uint8_t *const rows[4]) {         \
        const int64_t groups = p->in_features / 64, row_bytes = rows[1] - rows[0];                    \
        Lanes acc[4][CHAINS];                                                                          \
        for (int c = 0; c < 4; c++)                                                                    \
            for (int h = 0; h < CHAINS; h++) acc[c][h] = lanes_zero();                                 \
        for (int64_t g = 0; g < groups; g++)                                                           \
            for (int c = 0; c < 4; c++) {                                                              \
                __m512 v[4];                                                                           \
                prefetch_next_group(rows[c] + 2 * g * BLOCK_BYTES, row_bytes);                                 \
                NAME##_pair(rows[c] + 2 * g * BLOCK_BYTES, v);                                         \
                NAME##_pair(rows[c] + (2 * g + 1) * BLOCK_BYTES, v + 2);                               \
                for (int h = 0; h < CHAINS; h++)                                                       \
                    acc[c][h] = lanes_fma(v[h], lanes_load(p->x + 64 * g + 16 * h), acc[c][h]);        \
            }                                                                                          \
        if (p->in_features % 64)                                                                       \
            for (int c = 0; c < 4; c++) {                                                              \
                __m512 v[2];                                                                           \
                NAME##_pair(rows[c] + 2 * groups * BLOCK_BYTES, v);                                    \
                for (int h = 0; h < 2; h++)                                                            \
                    acc[c][h] = lanes_fma(v[h], lanes_load(p->x + 64 * groups + 16 * h), acc[c][h]);   \
            }                                                                                          \
        store_fused(p, column, acc);                                                                   \
    }

#define DEFINE_FUSED_GROUPS(NAME, BLOCK_BYTES)                                                         \
    static void fused_##NAME(const Problem *p, int64_t column, const uint8_t *const rows[4]) {         \
        const int64_t blocks = p->in_features / 256, row_bytes = rows[1] - rows[0];                   \
        Lanes acc[4][CHAINS];                                                                          \
        for (int c = 0; c < 4; c++)                                                                    \
            for (int h = 0; h < CHAINS; h++) acc[c][h] = lanes_zero();                                 \
        for (int64_t b = 0; b < blocks; b++) {                                                         \
            KScales k[4];                                                                              \
            for (int c = 0; c < 4; c++) NAME##_scales(rows[c] + b * BLOCK_BYTES, &k[c]);              \
            for (int g = 0; g < 4; g++)                                                                \
                for (int c = 0; c < 4; c++) {                                                          \
                    __m512 v[4];                                                                       \
                    prefetch_next_group(rows[c] + b * BLOCK_BYTES + g * BLOCK_BYTES / 4, row_bytes);          \
                    NAME##_group(rows[c] + b * BLOCK_BYTES, g, &k[c], v);                              \
                    for (int h = 0; h < CHAINS; h++)                                                   \
                        acc[c][h] = lanes_fma(v[h], lanes_load(p->x + 256 * b + 64 * g + 16 * h), acc[c][h]); \
                }                                                                                      \
        }                                                                                              \
        store_fused(p, column, acc);                                                                   \
    }

DEFINE_FUSED_PAIRS(q4_0, 18)
DEFINE_FUSED_PAIRS(q4_1, 20)
DEFINE_FUSED_PAIRS(q5_0, 22)
DEFINE_FUSED_PAIRS(q8_0, 34)
DEFINE_FUSED_GROUPS(q4_k, 144)
DEFINE_FUSED_GROUPS(q5_k, 176)
DEFINE_FUSED_GROUPS(q6_k, 210)

static fused_fn fused_for(int type) {
    switch (type) {
    case 2: return fused_q4_0;
    case 3: return fused_q4_1;
    case 6: return fused_q5_0;
    case 8: return fused_q8_0;
    case 12: return fused_q4_k;
    case 13: return fused_q5_k;
    case 14: return fused_q6_k;
    default: return NULL;
    }
}
#else
typedef void (*fused_fn)(const Problem *p, int64_t column, const uint8_t *const rows[4]);
static fused_fn fused_for(int type) {
    (void)type;
    return NULL;
}
#endif

/* Outputs [column, column + count) (count 1, or 4 / rows for one or two rows), decoded rows at w. */
static void run_group(const Problem *p, int64_t column, int64_t count, const float *w) {
    if (count == 4) {
        pass_1_4(p, 0, column, w);
    } else if (count == 2) {
        pass_2_2(p, 0, column, w);
    } else {
        for (int64_t first = 0; first < p->rows; first += ROWS) {
            const int64_t rows = p->rows - first < ROWS ? p->rows - first : ROWS;
            PASSES[rows - 1](p, first, column, w);
        }
    }
}

static void run_columns(void *context, int64_t begin, int64_t end) {
    const Problem *p = (const Problem *)context;
    const int64_t group = p->rows <= 2 ? ROWS / p->rows : 1;
    float *w = malloc(sizeof(float) * p->in_features * group);
    if (!w) abort(); /* a few rows of floats: a failure here is the process running out of memory */
    for (int64_t column = begin; column < end; column += group) {
        const int64_t count = end - column < group ? end - column : group;
        const uint8_t *rows[4];
        const BlockType *types[4];
        for (int64_t c = 0; c < count; c++)
            rows[c] = weight_row(p->segments, p->in_features, column + c, 0, &types[c]);
        const int one_type = count == 4 && types[1] == types[0] && types[2] == types[0] && types[3] == types[0];
        const fused_fn fused = one_type ? fused_for(types[0]->type) : NULL;
        if (fused) { /* one row, four columns of one type */
            fused(p, column, rows);
            continue;
        }
        for (int64_t c = 0; c < count; c++)
            types[c]->decode(rows[c], p->in_features / types[c]->block_size, w + c * p->in_features);
        if (count == group) {
            run_group(p, column, count, w);
        } else {
            for (int64_t c = 0; c < count; c++) run_group(p, column + c, 1, w + c * p->in_features);
        }
    }
    free(w);
}

/* Total output columns, or -1 when a segment's type is unknown or in_features is no whole number of
 * its blocks. */
static int64_t checked_columns(const Segment *segments, int64_t in_features) {
    int64_t total = 0;
    for (; segments->out_features > 0; segments++) {
        if (segments->columns) {
            if (!gguf_columns_fits(segments->columns, in_features)) return -1;
        } else {
            const BlockType *type = block_type(segments->type, 1);
            if (!type || in_features % type->block_size) return -1;
        }
        total += segments->out_features;
    }
    return total;
}

static int any_segment(const Segment *segments, int columns) {
    for (; segments->out_features > 0; segments++)
        if ((segments->columns != NULL) == columns) return 1;
    return 0;
}

/* One segment held as the file's rows: its outputs [y_offset, y_offset + its rows) of each y row. */
static void file_segment_linear(void *y, const float *x_f32, const Segment *segment, const float *bias, int64_t rows,
                                int64_t in_features, int64_t y_stride, int64_t y_offset, int io_bf16, int num_threads) {
    const Segment one[2] = {*segment, {0}};
    Problem p = {y, x_f32, one, bias, rows, segment->out_features, in_features, y_stride, y_offset, io_bf16};
    /* Work in threads.h's units: decoding a row costs about what reading it as bfloat16 does. */
    const int64_t passes = (rows + ROWS - 1) / ROWS;
    const int threads = threads_for(segment->out_features * in_features * 2 * passes, num_threads);
    pool_run(run_columns, &p, segment->out_features, columns_per_task(segment->out_features, threads, 16), threads);
}

/* Returns 0; 1 when a segment's type is unknown or in_features is not a multiple of its block size;
 * 2 when out of memory. Each segment is its own parallel call, the input prepared once for all: widened
 * for the file's rows, quantized for column blocks. */
int gguf_linear(void *y, const void *x, const Segment *segments, const float *bias, int64_t rows,
                int64_t in_features, int io_bf16, int gated, int num_threads) {
    const int64_t out_features = checked_columns(segments, in_features);
    if (out_features < 0 || in_features % LANES) return 1;
    float *x_f32 = NULL;
    QuantizedRows x_q = {0};
    int32_t *x_sums = NULL;
    int failed = 0;
    if (any_segment(segments, 0)) failed |= !(x_f32 = widened(x, rows, in_features, in_features, io_bf16, gated));
    if (any_segment(segments, 1) && !failed) {
        failed |= quantize_rows(&x_q, x, rows, in_features, in_features, io_bf16, gated) != 0;
        if (!failed) failed |= !(x_sums = gguf_columns_x_sums(&x_q, rows, in_features));
    }
    for (int64_t offset = 0; !failed && segments->out_features > 0; offset += segments->out_features, segments++) {
        if (segments->columns)
            gguf_columns_linear(y, &x_q, x_sums, segments->columns, bias, rows, in_features, out_features, offset,
                                io_bf16, num_threads);
        else
            file_segment_linear(y, x_f32, segments, bias, rows, in_features, out_features, offset, io_bf16,
                                num_threads);
    }
    free(x_f32);
    free(x_sums);
    if (x_q.x_q) free_quantized_rows(&x_q);
    return failed ? 2 : 0;
}

/* The weight as a plain [O, I] matrix, float32 or (out_bf16) bfloat16 rounded to nearest even:
 * for many rows a plain matrix product beats the kernel above (gguf_linear.py says when). */
typedef struct {
    void *out;
    const Segment *segments;
    int64_t in_features;
    int out_bf16, portable;
} Dequantize;

static void dequantize_columns(void *context, int64_t begin, int64_t end) {
    const Dequantize *c = (const Dequantize *)context;
    float *w = c->out_bf16 ? malloc(sizeof(float) * c->in_features) : NULL;
    if (c->out_bf16 && !w) abort();
    for (int64_t column = begin; column < end; column++) {
        const BlockType *type;
        const uint8_t *row = weight_row(c->segments, c->in_features, column, c->portable, &type);
        float *target = c->out_bf16 ? w : (float *)c->out + column * c->in_features;
        type->decode(row, c->in_features / type->block_size, target);
        if (c->out_bf16)
            for (int64_t k = 0; k < c->in_features; k++)
                ((uint16_t *)c->out)[column * c->in_features + k] = float_to_bf16(w[k]);
    }
    free(w);
}

/* portable: decode the file's rows with gguf_blocks.h's plain C decoders, not the vector ones (for
 * tests). Returns 0, or 1 as gguf_linear. */
int gguf_dequantize(void *out, const Segment *segments, int64_t in_features, int out_bf16, int portable,
                    int num_threads) {
    if (checked_columns(segments, in_features) < 0) return 1;
    for (int64_t offset = 0; segments->out_features > 0; offset += segments->out_features, segments++) {
        void *at = (uint8_t *)out + offset * in_features * (out_bf16 ? 2 : 4);
        if (segments->columns) {
            gguf_columns_dequantize(at, segments->columns, in_features, out_bf16, portable, num_threads);
            continue;
        }
        const Segment one[2] = {*segments, {0}};
        Dequantize context = {at, one, in_features, out_bf16, portable};
        const int threads = threads_for(segments->out_features * in_features * 2, num_threads);
        pool_run(dequantize_columns, &context, segments->out_features,
                 columns_per_task(segments->out_features, threads, 16), threads);
    }
    return 0;
}

/* Rows ids[0 .. count) of the weight as float32 [count, in_features] (an embedding's lookup: ids are
 * checked by the caller). Returns 0, or 1 as gguf_linear. */
typedef struct {
    float *out;
    const Segment *segments;
    const int64_t *ids;
    int64_t in_features;
} Rows;

static void rows_task(void *context, int64_t begin, int64_t end) {
    const Rows *r = (const Rows *)context;
    for (int64_t n = begin; n < end; n++) {
        int64_t row = r->ids[n];
        const Segment *segment = r->segments;
        while (row >= segment->out_features) row -= (segment++)->out_features;
        float *target = r->out + n * r->in_features;
        if (segment->columns) {
            gguf_columns_row(target, segment->columns, r->in_features, row);
        } else {
            const BlockType *type = block_type(segment->type, 0);
            type->decode(segment->blocks + row * (r->in_features / type->block_size * type->block_bytes),
                         r->in_features / type->block_size, target);
        }
    }
}

int gguf_rows(float *out, const Segment *segments, int64_t in_features, const int64_t *ids, int64_t count,
              int num_threads) {
    if (checked_columns(segments, in_features) < 0) return 1;
    Rows context = {out, segments, ids, in_features};
    const int threads = threads_for(count * in_features * 8, num_threads);
    pool_run(rows_task, &context, count, columns_per_task(count, threads, 1), threads);
    return 0;
}
