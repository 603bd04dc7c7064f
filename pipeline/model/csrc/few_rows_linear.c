/* y = x W^T (+ b) for a few rows of x (decode of 1-8 sequences), W float32 or bfloat16 (CPU).
 *
 * With one to eight rows a linear layer is bound by reading W once: each chunk of a weight row
 * is loaded once and multiplied into every input row while it sits in a register. Threads split
 * W's rows. Sums run in float32 with fused multiply-adds, 8 lanes wide (AVX2 + FMA when the
 * compiler targets them, plain C otherwise), so results differ from MKL's or oneDNN's in the last
 * bits (another summation order), as theirs differ from each other.
 *
 * x [M, I] and y [M, O] float32 or bfloat16 (x is widened once, y rounded to nearest even as torch
 * rounds), W [O, I] float32 or bfloat16 (the top 16 bits of a float32), bias [O] float32 or NULL;
 * all contiguous, 1 <= M <= 8.
 * Worked example (M = 2, I = 2, O = 1): x = [[1, 2], [3, 4]], W = [[5, 6]] -> y = [[17], [39]].
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#define MAX_ROWS 8

static inline float weight_at(const void *weight, int bf16, int64_t index) {
    return bf16 ? bf16_to_float(((const uint16_t *)weight)[index]) : ((const float *)weight)[index];
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VECTOR 8

static inline __m256 load_weights(const void *weight, int bf16, int64_t index) {
    if (bf16) {  /* 8 bfloat16 -> 8 float32: widen to 32 bits, shift into the top half */
        const __m128i half = _mm_loadu_si128((const __m128i *)((const uint16_t *)weight + index));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
    }
    return _mm256_loadu_ps((const float *)weight + index);
}

static inline float horizontal_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* Output column o for M rows; two accumulators per row hide the FMA latency when M is small.
 * BF16 is a constant per instance, so the weight format's branch leaves the inner loop. */
#define DEFINE_COLUMN_FORMAT(M, BF16)                                                                  \
    static void column_##M##_##BF16(float *y, const float *x, const void *weight, const float *bias, \
                                    int64_t out_features, int64_t in_features, int64_t o) {           \
        const int bf16 = BF16;                                                                         \
        __m256 even[M], odd[M];                                                                        \
        for (int m = 0; m < M; m++) even[m] = odd[m] = _mm256_setzero_ps();                            \
        const int64_t row = o * in_features;                                                          \
        int64_t i = 0;                                                                                 \
        for (; i + 2 * VECTOR <= in_features; i += 2 * VECTOR) {                                       \
            const __m256 w0 = load_weights(weight, bf16, row + i);                                     \
            const __m256 w1 = load_weights(weight, bf16, row + i + VECTOR);                            \
            for (int m = 0; m < M; m++) {                                                              \
                even[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * in_features + i), w0, even[m]);      \
                odd[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * in_features + i + VECTOR), w1, odd[m]); \
            }                                                                                          \
        }                                                                                              \
        for (; i + VECTOR <= in_features; i += VECTOR) {                                               \
            const __m256 w0 = load_weights(weight, bf16, row + i);                                     \
            for (int m = 0; m < M; m++)                                                                \
                even[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * in_features + i), w0, even[m]);      \
        }                                                                                              \
        for (int m = 0; m < M; m++) {                                                                  \
            float sum = horizontal_sum(_mm256_add_ps(even[m], odd[m]));                                \
            for (int64_t j = i; j < in_features; j++)                                                  \
                sum += x[m * in_features + j] * weight_at(weight, bf16, row + j);                      \
            y[m * out_features + o] = sum + (bias ? bias[o] : 0.0f);                                   \
        }                                                                                              \
    }

#else  /* portable: the compiler vectorizes what it can */

#define DEFINE_COLUMN_FORMAT(M, BF16)                                                                  \
    static void column_##M##_##BF16(float *y, const float *x, const void *weight, const float *bias, \
                                    int64_t out_features, int64_t in_features, int64_t o) {           \
        const int bf16 = BF16;                                                                         \
        float sums[M] = {0};                                                                           \
        for (int64_t i = 0; i < in_features; i++) {                                                    \
            const float w = weight_at(weight, bf16, o * in_features + i);                              \
            for (int m = 0; m < M; m++) sums[m] += x[m * in_features + i] * w;                         \
        }                                                                                              \
        for (int m = 0; m < M; m++) y[m * out_features + o] = sums[m] + (bias ? bias[o] : 0.0f);       \
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

typedef void (*column_fn)(float *, const float *, const void *, const float *, int64_t, int64_t, int64_t);
static const column_fn COLUMNS[2][MAX_ROWS] = {
    {column_1_0, column_2_0, column_3_0, column_4_0, column_5_0, column_6_0, column_7_0, column_8_0},
    {column_1_1, column_2_1, column_3_1, column_4_1, column_5_1, column_6_1, column_7_1, column_8_1}};

/* Returns 0; 1 when rows is out of range (the caller takes another path), 2 when out of memory. */
int few_rows_linear(void *y, const void *x, const void *weight, const float *bias, int64_t rows,
                    int64_t out_features, int64_t in_features, int bf16, int io_bf16, int num_threads) {
    if (rows < 1 || rows > MAX_ROWS) return 1;
    const column_fn column = COLUMNS[bf16 != 0][rows - 1];
    float *x_f32 = (float *)x, *y_f32 = (float *)y;
    if (io_bf16) {  /* sums run in float32: widen x once, round y once at the end */
        x_f32 = malloc(sizeof(float) * rows * (in_features + out_features));
        if (!x_f32) return 2;
        y_f32 = x_f32 + rows * in_features;
        for (int64_t i = 0; i < rows * in_features; i++) x_f32[i] = bf16_to_float(((const uint16_t *)x)[i]);
    }
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t o = 0; o < out_features; o++)
        column(y_f32, x_f32, weight, bias, out_features, in_features, o);
    if (io_bf16) {
        for (int64_t i = 0; i < rows * out_features; i++) ((uint16_t *)y)[i] = float_to_bf16(y_f32[i]);
        free(x_f32);
    }
    return 0;
}
