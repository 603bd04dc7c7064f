/* y = x W^T (+ b) for a few rows of x (decode of 1-8 sequences), W float32 or bfloat16 (CPU).
 *
 * With one to eight rows a linear layer is bound by reading W once: each chunk of a weight row
 * is loaded once and multiplied into every input row while it sits in a register. Threads split
 * W's rows. Sums run in float32 with fused multiply-adds, 8 lanes wide (AVX2 + FMA when the
 * compiler targets them, plain C otherwise), so results differ from MKL's or oneDNN's in the last
 * bits (another summation order), as theirs differ from each other.
 *
 * x [M, I] float32, W [O, I] (bfloat16 = the top 16 bits of a float32), bias [O] float32 or NULL,
 * y [M, O] float32; all contiguous, 1 <= M <= 8.
 * Worked example (M = 2, I = 2, O = 1): x = [[1, 2], [3, 4]], W = [[5, 6]] -> y = [[17], [39]].
 */
#include <stdint.h>
#include <string.h>

#define MAX_ROWS 8

static inline float bf16_to_float(uint16_t x) {
    const uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

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

/* Output column o for M rows; two accumulators per row hide the FMA latency when M is small. */
#define DEFINE_COLUMN(M)                                                                               \
    static void column_##M(float *y, const float *x, const void *weight, const float *bias,          \
                           int64_t out_features, int64_t in_features, int bf16, int64_t o) {          \
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

#define DEFINE_COLUMN(M)                                                                               \
    static void column_##M(float *y, const float *x, const void *weight, const float *bias,          \
                           int64_t out_features, int64_t in_features, int bf16, int64_t o) {          \
        float sums[M] = {0};                                                                           \
        for (int64_t i = 0; i < in_features; i++) {                                                    \
            const float w = weight_at(weight, bf16, o * in_features + i);                              \
            for (int m = 0; m < M; m++) sums[m] += x[m * in_features + i] * w;                         \
        }                                                                                              \
        for (int m = 0; m < M; m++) y[m * out_features + o] = sums[m] + (bias ? bias[o] : 0.0f);       \
    }

#endif

DEFINE_COLUMN(1)
DEFINE_COLUMN(2)
DEFINE_COLUMN(3)
DEFINE_COLUMN(4)
DEFINE_COLUMN(5)
DEFINE_COLUMN(6)
DEFINE_COLUMN(7)
DEFINE_COLUMN(8)

typedef void (*column_fn)(float *, const float *, const void *, const float *, int64_t, int64_t, int, int64_t);
static const column_fn COLUMNS[MAX_ROWS] = {column_1, column_2, column_3, column_4,
                                            column_5, column_6, column_7, column_8};

/* Returns 0, or 1 when rows is out of range (the caller takes another path). */
int few_rows_linear(float *y, const float *x, const void *weight, const float *bias, int64_t rows,
                    int64_t out_features, int64_t in_features, int bf16, int num_threads) {
    if (rows < 1 || rows > MAX_ROWS) return 1;
    const column_fn column = COLUMNS[rows - 1];
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t o = 0; o < out_features; o++)
        column(y, x, weight, bias, out_features, in_features, bf16, o);
    return 0;
}
