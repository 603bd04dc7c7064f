/* y = x W^T (+ b) with W kept as int8 with one scale per output row (CPU; the 4-bit layout has its own
 * kernel, int4_linear.c).
 *
 * Decode reads each weight once per step, so the bytes read set the speed: int8 weights are half of
 * bfloat16's. Each weight row is widened once and multiplied into every input row (up to 8 at a
 * time; more rows go through in groups of 8) while in registers.
 *
 * values [O, I] int8, scales [O] float32: w = q * scale. x is quantized per group of 32 to int16
 * (quantized_inputs.h) when I allows, else multiplied as float32.
 * x [M, I], y [M, O] float32 or bfloat16 as io_bf16 says (bf16.h; y rounded to nearest even), bias [O]
 * float32 or NULL;
 * gated: x is [M, 2 I], a gated MLP's [gate | up] (input_rows.h).
 */
#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"
#include "quantized_inputs.h"
#include "threads.h"

#define MAX_ROWS 8
#define COLUMNS_PER_TASK 32 /* the fewest columns a task takes; larger weights split into longer runs (threads.h) */

typedef struct {
    void *y;
    const float *x;          /* [rows, in_features] float32 (int8 weights) */
    const int16_t *x_q;      /* x quantized per group, [rows, in_features] */
    const float *x_scales;   /* [rows, in_features / GROUP]: x ~ x_q * x_scale */
    const void *values;
    const void *scales;
    const float *bias;
    int64_t rows, out_features, in_features;
    int io_bf16;
} Problem;

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline float horizontal_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* Column o for rows first .. first + M - 1 from x quantized per group (in_features % 32 == 0):
 * scale * sum over groups of x_scale * (q . x_q), q widened to 16 bits; a lane's sum reaches at most
 * 4 * 127 * 32767 < 2^24, so even its conversion to float32 is exact. */
#define DEFINE_INT8_GROUPED_COLUMN(M)                                                                  \
    static void int8_grouped_column_##M(const Problem *p, int64_t first, int64_t o) {                  \
        const int64_t groups = p->in_features / GROUP;                                                 \
        const int8_t *q = (const int8_t *)p->values + o * p->in_features;                              \
        __m256 acc[M];                                                                                 \
        for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();                                      \
        for (int64_t g = 0; g < groups; g++) {                                                         \
            const __m256i w = _mm256_loadu_si256((const __m256i *)(q + g * GROUP));                    \
            const __m256i w_low = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w));                     \
            const __m256i w_high = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1));               \
            for (int m = 0; m < M; m++) {                                                              \
                const int64_t at = (first + m) * groups + g;                                           \
                const int16_t *xq = p->x_q + at * GROUP;                                               \
                const __m256i sums = _mm256_add_epi32(                                                 \
                    _mm256_madd_epi16(w_low, _mm256_loadu_si256((const __m256i *)xq)),                 \
                    _mm256_madd_epi16(w_high, _mm256_loadu_si256((const __m256i *)(xq + 16))));        \
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(p->x_scales[at]), acc[m]); \
            }                                                                                          \
        }                                                                                              \
        const float scale = ((const float *)p->scales)[o];                                             \
        for (int m = 0; m < M; m++)                                                                    \
            store_output(p->y, p->io_bf16, (first + m) * p->out_features + o,                          \
                  horizontal_sum(acc[m]) * scale + (p->bias ? p->bias[o] : 0.0f));                     \
    }

/* Column o for rows first .. first + M - 1: scale * (q . x). */
#define DEFINE_INT8_COLUMN(M)                                                                          \
    static void int8_column_##M(const Problem *p, int64_t first, int64_t o) {                          \
        const int8_t *q = (const int8_t *)p->values + o * p->in_features;                              \
        __m256 acc[M];                                                                                 \
        for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();                                      \
        int64_t i = 0;                                                                                 \
        for (; i + 8 <= p->in_features; i += 8) {                                                      \
            const __m256 w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i)))); \
            for (int m = 0; m < M; m++)                                                                \
                acc[m] = _mm256_fmadd_ps(_mm256_loadu_ps(p->x + (first + m) * p->in_features + i), w, acc[m]); \
        }                                                                                              \
        const float scale = ((const float *)p->scales)[o];                                             \
        for (int m = 0; m < M; m++) {                                                                  \
            float sum = horizontal_sum(acc[m]);                                                        \
            for (int64_t j = i; j < p->in_features; j++) sum += p->x[(first + m) * p->in_features + j] * q[j]; \
            store_output(p->y, p->io_bf16, (first + m) * p->out_features + o,                          \
                  sum * scale + (p->bias ? p->bias[o] : 0.0f));                                        \
        }                                                                                              \
    }

#else /* portable: the compiler vectorizes what it can */

#define DEFINE_INT8_COLUMN(M)                                                                          \
    static void int8_column_##M(const Problem *p, int64_t first, int64_t o) {                          \
        const int8_t *q = (const int8_t *)p->values + o * p->in_features;                              \
        float sums[M] = {0};                                                                           \
        for (int64_t i = 0; i < p->in_features; i++)                                                   \
            for (int m = 0; m < M; m++) sums[m] += p->x[(first + m) * p->in_features + i] * q[i];      \
        const float scale = ((const float *)p->scales)[o];                                             \
        for (int m = 0; m < M; m++)                                                                    \
            store_output(p->y, p->io_bf16, (first + m) * p->out_features + o,                          \
                  sums[m] * scale + (p->bias ? p->bias[o] : 0.0f));                                    \
    }

#define DEFINE_INT8_GROUPED_COLUMN(M)                                                                  \
    static void int8_grouped_column_##M(const Problem *p, int64_t first, int64_t o) {                  \
        const int64_t groups = p->in_features / GROUP;                                                 \
        const int8_t *q = (const int8_t *)p->values + o * p->in_features;                              \
        float sums[M] = {0};                                                                           \
        for (int64_t g = 0; g < groups; g++)                                                           \
            for (int m = 0; m < M; m++) {                                                              \
                const int64_t at = (first + m) * groups + g;                                           \
                int32_t dot = 0;                                                                       \
                for (int j = 0; j < GROUP; j++) dot += q[g * GROUP + j] * p->x_q[at * GROUP + j];      \
                sums[m] += p->x_scales[at] * (float)dot;                                               \
            }                                                                                          \
        const float scale = ((const float *)p->scales)[o];                                             \
        for (int m = 0; m < M; m++)                                                                    \
            store_output(p->y, p->io_bf16, (first + m) * p->out_features + o,                          \
                  sums[m] * scale + (p->bias ? p->bias[o] : 0.0f));                                    \
    }

#endif

#define DEFINE_COLUMNS(M) DEFINE_INT8_COLUMN(M) DEFINE_INT8_GROUPED_COLUMN(M)
DEFINE_COLUMNS(1)
DEFINE_COLUMNS(2)
DEFINE_COLUMNS(3)
DEFINE_COLUMNS(4)
DEFINE_COLUMNS(5)
DEFINE_COLUMNS(6)
DEFINE_COLUMNS(7)
DEFINE_COLUMNS(8)

typedef void (*column_fn)(const Problem *, int64_t, int64_t);
static const column_fn INT8_GROUPED_COLUMNS[MAX_ROWS] = {
    int8_grouped_column_1, int8_grouped_column_2, int8_grouped_column_3, int8_grouped_column_4,
    int8_grouped_column_5, int8_grouped_column_6, int8_grouped_column_7, int8_grouped_column_8};
static const column_fn INT8_COLUMNS[MAX_ROWS] = {int8_column_1, int8_column_2, int8_column_3, int8_column_4,
                                                 int8_column_5, int8_column_6, int8_column_7, int8_column_8};

typedef struct {
    const Problem *problem;
    const column_fn *columns;
} Columns;

/* Every column for every group of up to 8 rows: a task's weight columns stay in cache across the groups. */
static void run_columns(void *context, int64_t begin, int64_t end) {
    const Problem *p = ((const Columns *)context)->problem;
    const column_fn *columns = ((const Columns *)context)->columns;
    const int64_t full_groups = p->rows / MAX_ROWS, rest = p->rows % MAX_ROWS;
    for (int64_t o = begin; o < end; o++) {
        for (int64_t group = 0; group < full_groups; group++) columns[MAX_ROWS - 1](p, group * MAX_ROWS, o);
        if (rest) columns[rest - 1](p, full_groups * MAX_ROWS, o);
    }
}

static void run(const Problem *p, const column_fn *columns, int num_threads) {
    /* Work in threads.h's units: the bytes a bfloat16 weight of this shape would take, per group of
     * rows (widening the quantized values costs about what reading bfloat16 does). */
    const int64_t row_groups = (p->rows + MAX_ROWS - 1) / MAX_ROWS;
    const int threads = threads_for(p->out_features * p->in_features * 2 * row_groups, num_threads);
    Columns context = {p, columns};
    pool_run(run_columns, &context, p->out_features, columns_per_task(p->out_features, threads, COLUMNS_PER_TASK),
             threads);
}

/* Returns 0, 2 when out of memory. x is quantized per group of 32 like the 4-bit path when
 * in_features allows; otherwise the float32 row multiplies the widened weights. */
int quantized_linear_int8(void *y, const void *x, const int8_t *values, const float *scales, const float *bias,
                          int64_t rows, int64_t out_features, int64_t in_features, int io_bf16, int gated,
                          int num_threads) {
    const int64_t count = rows * in_features, groups = count / GROUP;
    float *x_f32 = widened(x, rows, in_features, io_bf16, gated);
    if (!x_f32) return 2;
    if (in_features % GROUP) {
        const Problem p = {y, x_f32, NULL, NULL, values, scales, bias, rows, out_features, in_features, io_bf16};
        run(&p, INT8_COLUMNS, num_threads);
        free(x_f32);
        return 0;
    }
    float *x_scales = malloc(sizeof(float) * (groups > 0 ? groups : 1));
    int16_t *x_q = malloc(sizeof(int16_t) * (count > 0 ? count : 1));
    if (!x_scales || !x_q) {
        free(x_f32);
        free(x_scales);
        free(x_q);
        return 2;
    }
    quantize_groups(x_q, x_scales, NULL, x_f32, count);
    const Problem p = {y, NULL, x_q, x_scales, values, scales, bias, rows, out_features, in_features, io_bf16};
    run(&p, INT8_GROUPED_COLUMNS, num_threads);
    free(x_f32);
    free(x_scales);
    free(x_q);
    return 0;
}

typedef struct {
    void *out;
    const int8_t *values;
    const float *scales;
    int64_t in_features;
    int out_bf16;
} Dequantize;

/* The int8 weight as a plain [O, I] matrix, float32 or (out_bf16) bfloat16: w = q * scale, the values
 * Int8Linear.dequantized() computes; for many rows, as dequantize_int4. */
static void dequantize_int8_rows(void *context, int64_t begin, int64_t end) {
    const Dequantize *c = (const Dequantize *)context;
    for (int64_t o = begin; o < end; o++) {
        const int8_t *q = (const int8_t *)c->values + o * c->in_features;
        const float scale = ((const float *)c->scales)[o];
        if (c->out_bf16) {
            uint16_t *out = (uint16_t *)c->out + o * c->in_features;
            for (int64_t i = 0; i < c->in_features; i++) out[i] = float_to_bf16((float)q[i] * scale);
        } else {
            float *out = (float *)c->out + o * c->in_features;
            for (int64_t i = 0; i < c->in_features; i++) out[i] = (float)q[i] * scale;
        }
    }
}

void dequantize_int8(void *out, const int8_t *values, const float *scales, int64_t out_features, int64_t in_features,
                     int out_bf16, int num_threads) {
    Dequantize context = {out, values, scales, in_features, out_bf16};
    const int threads = threads_for(out_features * in_features * 2, num_threads);
    pool_run(dequantize_int8_rows, &context, out_features,
             columns_per_task(out_features, threads, COLUMNS_PER_TASK), threads);
}
