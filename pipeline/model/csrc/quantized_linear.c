/* y = x W^T (+ b) with W kept quantized (CPU): 4-bit in groups of 32 (GGUF's Q4_0 / Q4_1 blocks)
 * or int8 with one scale per output row.
 *
 * Decode reads each weight once per step, so the bytes read set the speed: 4-bit weights are a
 * quarter of bfloat16's. Each group of a weight row is widened once and multiplied into every input
 * row (up to 8 at a time; more rows go through in groups of 8) while in registers.
 *
 * The products are integer: each group of 32 input values is quantized to int16 with one scale
 * (max |x| / 32767), once per call, and a group's dot product with the weights' integers is exact in
 * 32 bits. Rounding x to 1 part in 65534 of its group's largest value costs far less accuracy than
 * the int8 activations llama.cpp uses, at the same speed here (SmolLM2 Q4_1 against the float32
 * model of the same weights, teacher-forced over 161 tokens, benchmarks/quant_accuracy.py: top-1
 * agreement 98.8% and mean KL 0.0019 nats with int16, 95.0% and 0.0174 with int8; 40-46 vs 38-40
 * tokens/s single stream, alternating runs).
 *
 * int4: nibbles [O, I / 2] uint8, group g of row o in bytes 16 g .. 16 g + 15: byte j holds weight
 *   32 g + j in its low half and 32 g + j + 16 in its high half (GGUF's order); scales and offsets
 *   [O, 2, I / 32] float16 (each row's d, then its m): w = q * d + m. GGUF Q4_1 is (d, m) as stored,
 *   Q4_0 (d, -8 d).
 *   Worked example: d = 0.5, m = -1, byte 0x3A -> w0 = 0.5 * 10 - 1 = 4, w16 = 0.5 * 3 - 1 = 0.5.
 *   Sum over a group: d * x_scale * (q . x_q) + m * sum(x); the sums of x per group are taken once.
 * int8: values [O, I] int8, scales [O] float32: w = q * scale. x is quantized per group as above
 *   when I allows, else multiplied as float32.
 * x [M, I], y [M, O] float32 or bfloat16 as io_bf16 says (bf16.h; y rounded to nearest even), bias [O]
 * float32 or NULL;
 * gated: x is [M, 2 I], a gated MLP's [gate | up] (input_rows.h).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "input_rows.h"
#include "threads.h"

#define GROUP 32
#define MAX_ROWS 8
#define MAX_GROUPS 2048 /* 4-bit in_features up to 65536: a column's per-group scales stay on the stack */
#define COLUMNS_PER_TASK 32 /* the fewest columns a task takes; larger weights split into longer runs (threads.h) */

#if defined(__F16C__)
#include <immintrin.h>
static inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }
#else
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
    uint32_t bits;
    if (exponent == 0x1F) {
        bits = sign | 0x7F800000u | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else { /* subnormal: shift the mantissa up until its leading one is the implicit bit */
        int shift = 0;
        uint32_t m = mantissa;
        while (!(m & 0x400)) {
            m <<= 1;
            shift++;
        }
        bits = sign | ((uint32_t)(113 - shift) << 23) | ((m & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
#endif

typedef struct {
    void *y;
    const float *x;          /* [rows, in_features] float32 (int8 weights) */
    const int16_t *x_q;      /* x quantized per group, [rows, in_features] */
    const float *x_scales;   /* [rows, in_features / GROUP]: x ~ x_q * x_scale */
    const float *group_sums; /* [rows, in_features / GROUP]: sums of x itself */
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

/* Per row of a column: d * x_scale for every group (dxs [M, groups]) and the offset term
 * sum over groups of m * sum(x) (offsets [M]), eight groups per vector. The column's float16 d
 * and m are widened once for all its rows (with 8 rows per call that was most of this function's
 * work: 576 = 18 groups left 2 per row to widen one by one). */
static inline void column_scales(const Problem *p, const uint16_t *d_half, const uint16_t *m_half, int64_t first,
                                 int rows, int64_t groups, float *dxs, float *offsets) {
    float d[MAX_GROUPS], mins[MAX_GROUPS];
    int64_t g = 0;
    for (; g + 8 <= groups; g += 8) {
        _mm256_storeu_ps(d + g, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d_half + g))));
        _mm256_storeu_ps(mins + g, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m_half + g))));
    }
    for (; g < groups; g++) {
        d[g] = half_to_float(d_half[g]);
        mins[g] = half_to_float(m_half[g]);
    }
    for (int m = 0; m < rows; m++) {
        const float *x_scales = p->x_scales + (first + m) * groups, *sums = p->group_sums + (first + m) * groups;
        __m256 offset = _mm256_setzero_ps();
        for (g = 0; g + 8 <= groups; g += 8) {
            const __m256 scales = _mm256_mul_ps(_mm256_loadu_ps(d + g), _mm256_loadu_ps(x_scales + g));
            _mm256_storeu_ps(dxs + m * groups + g, scales);
            offset = _mm256_fmadd_ps(_mm256_loadu_ps(mins + g), _mm256_loadu_ps(sums + g), offset);
        }
        float tail = 0.0f;
        for (; g < groups; g++) {
            dxs[m * groups + g] = d[g] * x_scales[g];
            tail += mins[g] * sums[g];
        }
        offsets[m] = horizontal_sum(offset) + tail;
    }
}

/* One group g of the column into acc[0 .. M - 1]. Each byte widened to 16 bits holds both its
 * weights: low nibble = bits 0-3, high nibble = bits 4-7 with nothing above, so one mask and one
 * shift split them. */
#define INT4_GROUP(M, g, acc)                                                                          \
    do {                                                                                               \
        const __m256i wide = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(nibbles + (g) * 16))); \
        const __m256i q_low = _mm256_and_si256(wide, _mm256_set1_epi16(0x0F));                         \
        const __m256i q_high = _mm256_srli_epi16(wide, 4);                                             \
        for (int m = 0; m < M; m++) {                                                                  \
            const int16_t *xq = p->x_q + ((first + m) * groups + (g)) * GROUP;                         \
            const __m256i sums = _mm256_add_epi32(                                                     \
                _mm256_madd_epi16(q_low, _mm256_loadu_si256((const __m256i *)xq)),                     \
                _mm256_madd_epi16(q_high, _mm256_loadu_si256((const __m256i *)(xq + 16))));            \
            acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_broadcast_ss(dxs + m * groups + (g)), acc[m]); \
        }                                                                                              \
    } while (0)

/* Column o for rows first .. first + M - 1: sum over groups of d * x_scale * (q . x_q) + m * sum(x).
 * The 4-bit values (0..15), widened to 16 bits, and x_q multiply in pairs summed to 32 bits (at
 * most 4 * 15 * 32767 per lane): an exact integer dot product per group.
 * With one row, even and odd groups sum into separate accumulators: a single chain of fused
 * multiply-adds would make each group wait for the previous one's (4 cycles), longer than its other
 * work (C harness, SmolLM2's 30 layers, one thread, Zen 4: 5.0 vs 5.5 ms in cache, 5.8 vs 6.0 ms from
 * memory). More rows give the core independent chains already (4 rows: no gain, 4% slower). */
#define DEFINE_INT4_COLUMN(M)                                                                          \
    static void int4_column_##M(const Problem *p, int64_t first, int64_t o) {                          \
        const int64_t groups = p->in_features / GROUP;                                                 \
        const uint8_t *nibbles = (const uint8_t *)p->values + o * (p->in_features / 2);                \
        const uint16_t *d_half = (const uint16_t *)p->scales + o * groups * 2, *m_half = d_half + groups; \
        float dxs[M * MAX_GROUPS], offsets[M];                                                         \
        column_scales(p, d_half, m_half, first, M, groups, dxs, offsets);                              \
        __m256 even[M], odd[M];                                                                        \
        for (int m = 0; m < M; m++) even[m] = odd[m] = _mm256_setzero_ps();                            \
        int64_t g = 0;                                                                                 \
        if ((M) == 1)                                                                                  \
            for (; g + 2 <= groups; g += 2) {                                                          \
                INT4_GROUP(M, g, even);                                                                \
                INT4_GROUP(M, g + 1, odd);                                                             \
            }                                                                                          \
        for (; g < groups; g++) INT4_GROUP(M, g, even);                                                \
        for (int m = 0; m < M; m++)                                                                    \
            store_output(p->y, p->io_bf16, (first + m) * p->out_features + o,                          \
                  horizontal_sum(_mm256_add_ps(even[m], odd[m])) + offsets[m] + (p->bias ? p->bias[o] : 0.0f)); \
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

#define DEFINE_INT4_COLUMN(M)                                                                          \
    static void int4_column_##M(const Problem *p, int64_t first, int64_t o) {                          \
        const int64_t groups = p->in_features / GROUP;                                                 \
        const uint8_t *nibbles = (const uint8_t *)p->values + o * (p->in_features / 2);                \
        const uint16_t *d_half = (const uint16_t *)p->scales + o * groups * 2, *m_half = d_half + groups; \
        float sums[M] = {0};                                                                           \
        for (int64_t g = 0; g < groups; g++) {                                                         \
            const float d = half_to_float(d_half[g]), offset = half_to_float(m_half[g]);               \
            for (int m = 0; m < M; m++) {                                                              \
                const int64_t at = (first + m) * groups + g;                                           \
                const int16_t *xq = p->x_q + at * GROUP;                                               \
                int32_t dot = 0;                                                                       \
                for (int j = 0; j < 16; j++) {                                                         \
                    const uint8_t byte = nibbles[g * 16 + j];                                          \
                    dot += xq[j] * (byte & 0x0F) + xq[j + 16] * (byte >> 4);                           \
                }                                                                                      \
                sums[m] += d * p->x_scales[at] * (float)dot + offset * p->group_sums[at];              \
            }                                                                                          \
        }                                                                                              \
        for (int m = 0; m < M; m++)                                                                    \
            store_output(p->y, p->io_bf16, (first + m) * p->out_features + o,                          \
                         sums[m] + (p->bias ? p->bias[o] : 0.0f));                                     \
    }

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

#define DEFINE_COLUMNS(M) DEFINE_INT4_COLUMN(M) DEFINE_INT8_COLUMN(M) DEFINE_INT8_GROUPED_COLUMN(M)
DEFINE_COLUMNS(1)
DEFINE_COLUMNS(2)
DEFINE_COLUMNS(3)
DEFINE_COLUMNS(4)
DEFINE_COLUMNS(5)
DEFINE_COLUMNS(6)
DEFINE_COLUMNS(7)
DEFINE_COLUMNS(8)

typedef void (*column_fn)(const Problem *, int64_t, int64_t);
static const column_fn INT4_COLUMNS[MAX_ROWS] = {int4_column_1, int4_column_2, int4_column_3, int4_column_4,
                                                 int4_column_5, int4_column_6, int4_column_7, int4_column_8};
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

static float *widened(const void *x, int64_t rows, int64_t in_features, int io_bf16, int gated) {
    float *out = malloc(sizeof(float) * (rows * in_features > 0 ? rows * in_features : 1));
    if (out)
        for (int64_t m = 0; m < rows; m++)
            for (int64_t i = 0; i < in_features; i++)
                out[m * in_features + i] = input_value(x, io_bf16, gated, in_features, m, i);
    return out;
}

/* x per group of 32 as int16 values times one scale (max |x| / 32767, rounded to nearest), and the
 * sums of x itself for the offset term. Worked example (a group of 2 for brevity): x = (0.5, -1.0)
 * -> scale 1 / 32767, x_q = (16384, -32767), sum -0.5. */
static void quantize_groups(int16_t *x_q, float *scales, float *sums, const float *x, int64_t count) {
    for (int64_t group = 0; group < count / GROUP; group++) {
        const float *xg = x + group * GROUP;
        float largest = 0.0f, sum = 0.0f;
        for (int j = 0; j < GROUP; j++) {
            largest = fmaxf(largest, fabsf(xg[j]));
            sum += xg[j];
        }
        const float scale = largest / 32767.0f, inverse = largest > 0.0f ? 32767.0f / largest : 0.0f;
        for (int j = 0; j < GROUP; j++) x_q[group * GROUP + j] = (int16_t)lrintf(xg[j] * inverse);
        scales[group] = scale;
        sums[group] = sum;
    }
}

/* Returns 0, 1 when in_features is not a multiple of 32 (or above 32 * MAX_GROUPS), 2 when out of memory. */
int quantized_linear_int4(void *y, const void *x, const uint8_t *nibbles, const uint16_t *scales_offsets,
                          const float *bias, int64_t rows, int64_t out_features, int64_t in_features, int io_bf16,
                          int gated, int num_threads) {
    if (in_features % GROUP || in_features / GROUP > MAX_GROUPS) return 1;
    const int64_t count = rows * in_features, groups = count / GROUP;
    float *x_f32 = widened(x, rows, in_features, io_bf16, gated);
    float *per_group = malloc(sizeof(float) * 2 * (groups > 0 ? groups : 1));
    int16_t *x_q = malloc(sizeof(int16_t) * (count > 0 ? count : 1));
    if (!x_f32 || !per_group || !x_q) {
        free(x_f32);
        free(per_group);
        free(x_q);
        return 2;
    }
    quantize_groups(x_q, per_group, per_group + groups, x_f32, count);
    const Problem p = {y, NULL, x_q, per_group, per_group + groups, nibbles, scales_offsets, bias,
                       rows, out_features, in_features, io_bf16};
    run(&p, INT4_COLUMNS, num_threads);
    free(x_f32);
    free(per_group);
    free(x_q);
    return 0;
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
        const Problem p = {y, x_f32, NULL, NULL, NULL, values, scales, bias, rows, out_features, in_features, io_bf16};
        run(&p, INT8_COLUMNS, num_threads);
        free(x_f32);
        return 0;
    }
    float *per_group = malloc(sizeof(float) * 2 * (groups > 0 ? groups : 1));
    int16_t *x_q = malloc(sizeof(int16_t) * (count > 0 ? count : 1));
    if (!per_group || !x_q) {
        free(x_f32);
        free(per_group);
        free(x_q);
        return 2;
    }
    quantize_groups(x_q, per_group, per_group + groups, x_f32, count);
    const Problem p = {y, NULL, x_q, per_group, NULL, values, scales, bias, rows, out_features, in_features, io_bf16};
    run(&p, INT8_GROUPED_COLUMNS, num_threads);
    free(x_f32);
    free(per_group);
    free(x_q);
    return 0;
}

/* The 4-bit weight as a plain [O, I] matrix, float32 or (out_bf16) bfloat16 rounded to nearest even:
 * w = q * d + m per group, multiplied then added in float32 (no fused multiply-add), the values
 * Int4Linear.dequantized() computes. For many rows a plain matrix product beats the per-group
 * kernel above (quantized_linear.py says when), and writing the weight out costs about one pass. */
typedef struct {
    void *out;
    const void *values; /* 4-bit: nibbles; int8: values */
    const void *scales; /* 4-bit: float16 scales and offsets; int8: float32 scales */
    int64_t in_features;
    int out_bf16;
} Dequantize;

static void dequantize_rows(void *context, int64_t begin, int64_t end) {
    const Dequantize *c = (const Dequantize *)context;
    const int64_t groups = c->in_features / GROUP;
    float values[GROUP];
    for (int64_t o = begin; o < end; o++) {
        const uint8_t *nibbles = (const uint8_t *)c->values + o * (c->in_features / 2);
        const uint16_t *d_half = (const uint16_t *)c->scales + o * groups * 2, *m_half = d_half + groups;
        for (int64_t g = 0; g < groups; g++) {
            const float d = half_to_float(d_half[g]), m = half_to_float(m_half[g]);
            for (int j = 0; j < GROUP / 2; j++) {
                const uint8_t byte = nibbles[g * (GROUP / 2) + j];
                values[j] = (float)(byte & 0x0F) * d + m;
                values[j + GROUP / 2] = (float)(byte >> 4) * d + m;
            }
            const int64_t at = o * c->in_features + g * GROUP;
            if (c->out_bf16)
                for (int j = 0; j < GROUP; j++) ((uint16_t *)c->out)[at + j] = float_to_bf16(values[j]);
            else
                memcpy((float *)c->out + at, values, sizeof values);
        }
    }
}

/* Returns 0, 1 when in_features is not a multiple of 32. */
int dequantize_int4(void *out, const uint8_t *nibbles, const uint16_t *scales_offsets, int64_t out_features,
                    int64_t in_features, int out_bf16, int num_threads) {
    if (in_features % GROUP) return 1;
    Dequantize context = {out, nibbles, scales_offsets, in_features, out_bf16};
    const int threads = threads_for(out_features * in_features * 2, num_threads);
    pool_run(dequantize_rows, &context, out_features, columns_per_task(out_features, threads, COLUMNS_PER_TASK),
             threads);
    return 0;
}

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
