/* y = x W^T (+ b) for a few rows of x (decode of 1-8 sequences), W float32 or bfloat16 (CPU).
 *
 * With one to eight rows a linear layer is bound by reading W once: each chunk of a weight row
 * is loaded once and multiplied into every input row while it sits in a register. Sums run in
 * float32 with fused multiply-adds, 16 lanes wide with AVX-512, else 8 (AVX2 + FMA when the compiler
 * targets them, plain C otherwise), so results differ from MKL's or oneDNN's in the last bits (another
 * summation order), as theirs differ from each other.
 *
 * bfloat16 weights are widened without shuffles: one 256-bit load holds 16 of them, and as 32-bit
 * lanes the even-indexed ones are the low halves (shift left 16 -> float32) and the odd-indexed
 * ones the high halves (mask the low half off). So x is reordered to match, once per call: in
 * every 16-element chunk its 8 even-indexed values, then its 8 odd-indexed ones.
 * Worked example, one chunk: x = (x0, x1, ..., x15) -> (x0, x2, ..., x14, x1, x3, ..., x15).
 *
 * x [M, I] and y [M, O] float32 or bfloat16 as io_bf16 says (bf16.h; x is widened once, y rounded to
 * nearest even as torch rounds), W [O, I] float32 or bfloat16 (the top 16 bits of a float32), bias [O] float32 or NULL;
 * all contiguous, 1 <= M <= 8. gated: x is [M, 2 I], a gated MLP's [gate | up] (input_rows.h).
 * Worked example (M = 2, I = 2, O = 1): x = [[1, 2], [3, 4]], W = [[5, 6]] -> y = [[17], [39]].
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "input_rows.h"
#include "threads.h"

#define MAX_ROWS 8
#define CHUNK 16 /* weights per row and inner-loop step: two 8-lane vectors */
/* The fewest columns a thread claims at a time; larger weights split into longer runs (threads.h). */
#define COLUMNS_PER_TASK 32

static inline float weight_at(const void *weight, int bf16, int64_t index) {
    return bf16 ? bf16_to_float(((const uint16_t *)weight)[index]) : ((const float *)weight)[index];
}

/* Where x's element i sits in the reordered copy (the module comment's worked example). */
static inline int64_t reordered(int64_t i, int64_t in_features, int bf16) {
    const int64_t chunk_start = i - i % CHUNK;
    if (!bf16 || chunk_start + CHUNK > in_features) return i; /* the tail keeps its order */
    const int64_t offset = i % CHUNK;
    return chunk_start + (offset % 2 ? CHUNK / 2 : 0) + offset / 2;
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>

/* A chunk of 16 weights as one float32 vector, in the order x was reordered to: for bfloat16 its 8
 * even-indexed weights, then its 8 odd-indexed ones (module comment). */
static inline __m512 load_chunk(const void *weight, int bf16, int64_t index) {
    if (bf16) {
        const __m256i both = _mm256_loadu_si256((const __m256i *)((const uint16_t *)weight + index));
        const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(both, 16));
        const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(both, _mm256_set1_epi32(-65536)));
        return _mm512_insertf32x8(_mm512_castps256_ps512(even), odd, 1);
    }
    return _mm512_loadu_ps((const float *)weight + index);
}

/* Output column o for M rows, 16 lanes wide: where the CPU runs 512-bit FMAs at full width (Zen 5),
 * twice the products per instruction of the AVX2 version below, which several rows are bound by
 * (SmolLM2's 30 layers, 4 rows, 2 threads, Zen 5: float32 12.2 -> 10.1 ms, bfloat16 10.8 -> 5.8-6.6
 * ms; one row, bound by memory, unchanged; 8 rows too, where the loads of x, 18 per 16 FMAs, set the
 * pace; variants that paired columns to reuse each x load were slower at 3-6 rows).
 * Each row sums into two accumulators (two chunks per step): 2-16 independent FMA chains. */
#define DEFINE_COLUMN_FORMAT(M, BF16)                                                                  \
    static void column_##M##_##BF16(void *y, int io_bf16, const float *x, const void *weight,          \
                                    const float *bias, int64_t out_features, int64_t in_features,      \
                                    int64_t o) {                                                       \
        const int bf16 = BF16;                                                                         \
        __m512 first[M], second[M];                                                                    \
        for (int m = 0; m < M; m++) first[m] = second[m] = _mm512_setzero_ps();                        \
        const int64_t row = o * in_features;                                                           \
        int64_t i = 0;                                                                                 \
        for (; i + 2 * CHUNK <= in_features; i += 2 * CHUNK) {                                         \
            const __m512 w0 = load_chunk(weight, bf16, row + i);                                       \
            const __m512 w1 = load_chunk(weight, bf16, row + i + CHUNK);                               \
            for (int m = 0; m < M; m++) {                                                              \
                const float *xm = x + m * in_features + i;                                             \
                first[m] = _mm512_fmadd_ps(_mm512_loadu_ps(xm), w0, first[m]);                         \
                second[m] = _mm512_fmadd_ps(_mm512_loadu_ps(xm + CHUNK), w1, second[m]);               \
            }                                                                                          \
        }                                                                                              \
        for (; i + CHUNK <= in_features; i += CHUNK) {                                                 \
            const __m512 w0 = load_chunk(weight, bf16, row + i);                                       \
            for (int m = 0; m < M; m++)                                                                \
                first[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * in_features + i), w0, first[m]);   \
        }                                                                                              \
        for (int m = 0; m < M; m++) {                                                                  \
            float sum = _mm512_reduce_add_ps(_mm512_add_ps(first[m], second[m]));                      \
            for (int64_t j = i; j < in_features; j++)                                                  \
                sum += x[m * in_features + j] * weight_at(weight, bf16, row + j);                      \
            store_output(y, io_bf16, m * out_features + o, sum + (bias ? bias[o] : 0.0f));             \
        }                                                                                              \
    }

#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* A chunk of 16 weights as two float32 vectors, in the order x was reordered to. */
static inline void load_chunk(const void *weight, int bf16, int64_t index, __m256 *first, __m256 *second) {
    if (bf16) {
        const __m256i both = _mm256_loadu_si256((const __m256i *)((const uint16_t *)weight + index));
        *first = _mm256_castsi256_ps(_mm256_slli_epi32(both, 16));                          /* even */
        *second = _mm256_castsi256_ps(_mm256_and_si256(both, _mm256_set1_epi32(-65536)));  /* odd */
    } else {
        *first = _mm256_loadu_ps((const float *)weight + index);
        *second = _mm256_loadu_ps((const float *)weight + index + 8);
    }
}

static inline float horizontal_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* Output column o for M rows. Each row sums into two accumulators (one per vector of the chunk)
 * or, for one row, four (two chunks per step), so enough independent FMA chains run to hide
 * their latency without running out of the 16 vector registers at eight rows.
 * BF16 is a constant per instance, so the weight format's branch leaves the inner loop. */
#define DEFINE_COLUMN_FORMAT(M, BF16)                                                                  \
    static void column_##M##_##BF16(void *y, int io_bf16, const float *x, const void *weight,          \
                                    const float *bias, int64_t out_features, int64_t in_features,      \
                                    int64_t o) {                                                       \
        const int bf16 = BF16;                                                                         \
        __m256 first[M], second[M], third[M], fourth[M];                                               \
        for (int m = 0; m < M; m++) first[m] = second[m] = third[m] = fourth[m] = _mm256_setzero_ps(); \
        const int64_t row = o * in_features;                                                           \
        int64_t i = 0;                                                                                 \
        __m256 w0, w1, w2, w3;                                                                         \
        if (M == 1) {                                                                                  \
            for (; i + 2 * CHUNK <= in_features; i += 2 * CHUNK) {                                     \
                load_chunk(weight, bf16, row + i, &w0, &w1);                                           \
                load_chunk(weight, bf16, row + i + CHUNK, &w2, &w3);                                   \
                first[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), w0, first[0]);                      \
                second[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), w1, second[0]);                \
                third[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), w2, third[0]);                 \
                fourth[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), w3, fourth[0]);               \
            }                                                                                          \
        }                                                                                              \
        for (; i + CHUNK <= in_features; i += CHUNK) {                                                 \
            load_chunk(weight, bf16, row + i, &w0, &w1);                                               \
            for (int m = 0; m < M; m++) {                                                              \
                const float *xm = x + m * in_features + i;                                             \
                first[m] = _mm256_fmadd_ps(_mm256_loadu_ps(xm), w0, first[m]);                         \
                second[m] = _mm256_fmadd_ps(_mm256_loadu_ps(xm + 8), w1, second[m]);                   \
            }                                                                                          \
        }                                                                                              \
        for (int m = 0; m < M; m++) {                                                                  \
            const __m256 pairs = _mm256_add_ps(_mm256_add_ps(first[m], second[m]),                     \
                                               _mm256_add_ps(third[m], fourth[m]));                    \
            float sum = horizontal_sum(pairs);                                                         \
            for (int64_t j = i; j < in_features; j++)                                                  \
                sum += x[m * in_features + j] * weight_at(weight, bf16, row + j);                      \
            store_output(y, io_bf16, m * out_features + o, sum + (bias ? bias[o] : 0.0f));             \
        }                                                                                              \
    }

#else /* portable: the compiler vectorizes what it can */

#define DEFINE_COLUMN_FORMAT(M, BF16)                                                                  \
    static void column_##M##_##BF16(void *y, int io_bf16, const float *x, const void *weight,          \
                                    const float *bias, int64_t out_features, int64_t in_features,      \
                                    int64_t o) {                                                       \
        const int bf16 = BF16;                                                                         \
        float sums[M] = {0};                                                                           \
        for (int64_t i = 0; i < in_features; i++) {                                                    \
            const float w = weight_at(weight, bf16, o * in_features + i);                              \
            const int64_t at = reordered(i, in_features, bf16);                                        \
            for (int m = 0; m < M; m++) sums[m] += x[m * in_features + at] * w;                        \
        }                                                                                              \
        for (int m = 0; m < M; m++)                                                                    \
            store_output(y, io_bf16, m * out_features + o, sums[m] + (bias ? bias[o] : 0.0f));         \
    }

#endif

#define DEFINE_COLUMN(M) DEFINE_COLUMN_FORMAT(M, 0) DEFINE_COLUMN_FORMAT(M, 1)
DEFINE_COLUMN(1)
DEFINE_COLUMN(2)
DEFINE_COLUMN(3)
DEFINE_COLUMN(4)
DEFINE_COLUMN(5)
DEFINE_COLUMN(6)
DEFINE_COLUMN(7)
DEFINE_COLUMN(8)

typedef void (*column_fn)(void *, int, const float *, const void *, const float *, int64_t, int64_t, int64_t);
static const column_fn COLUMNS[2][MAX_ROWS] = {
    {column_1_0, column_2_0, column_3_0, column_4_0, column_5_0, column_6_0, column_7_0, column_8_0},
    {column_1_1, column_2_1, column_3_1, column_4_1, column_5_1, column_6_1, column_7_1, column_8_1}};

/* x widened to float32 and, for bfloat16 weights, reordered chunk by chunk (module comment). */
static void prepare_rows(float *out, const void *x, int64_t rows, int64_t in_features, int io_bf16, int gated,
                         int bf16, float *row) {
    for (int64_t m = 0; m < rows; m++) {
        input_row(row, x, io_bf16, gated, in_features, m);
        for (int64_t i = 0; i < in_features; i++) out[m * in_features + reordered(i, in_features, bf16)] = row[i];
    }
}

typedef struct {
    column_fn column;
    void *y;
    int io_bf16;
    const float *x;
    const void *weight;
    const float *bias;
    int64_t out_features, in_features;
} Columns;

static void run_columns(void *context, int64_t begin, int64_t end) {
    const Columns *c = context;
    for (int64_t o = begin; o < end; o++)
        c->column(c->y, c->io_bf16, c->x, c->weight, c->bias, c->out_features, c->in_features, o);
}

/* Returns 0; 1 when rows is out of range (the caller takes another path), 2 when out of memory. */
int few_rows_linear(void *y, const void *x, const void *weight, const float *bias, int64_t rows,
                    int64_t out_features, int64_t in_features, int bf16, int io_bf16, int gated, int num_threads) {
    if (rows < 1 || rows > MAX_ROWS) return 1;
    float *x_f32 = malloc(sizeof(float) * (rows + 1) * in_features); /* the rows, then one row of scratch */
    if (!x_f32) return 2;
    prepare_rows(x_f32, x, rows, in_features, io_bf16, gated, bf16, x_f32 + rows * in_features);
    Columns columns = {COLUMNS[bf16 != 0][rows - 1], y, io_bf16, x_f32, weight, bias, out_features, in_features};
    const int64_t weight_bytes = out_features * in_features * (bf16 ? 2 : 4);
    const int threads = threads_for(weight_bytes, num_threads);
    pool_run(run_columns, &columns, out_features, columns_per_task(out_features, threads, COLUMNS_PER_TASK), threads);
    free(x_f32);
    return 0;
}
