/* RMSNorm of a step's rows in one call (CPU), Llama's form: y = w * (x / sqrt(mean(x^2) + eps)).
 *
 * torch runs this as several ops per call on the CPU (pow, mean, add, rsqrt, the multiplies and,
 * in bfloat16, the casts), each dispatched separately. One 576-wide row on a 2-core Zen 3 box:
 * 34 us (float32) and 67 us (bfloat16) through torch, 23-24 us here (mostly the call itself);
 * a SmolLM2 step has 61 norms.
 *
 * x, y [rows, dim] and w [dim], all float32 or all bfloat16, contiguous. Sums run in float32
 * (another order than torch's, so the last bits can differ). bfloat16 follows HF's rounding:
 * the normalised row is rounded to bfloat16, then multiplied by w and rounded again.
 * Worked example (dim 2, eps 0, w = 1): x = (3, 4): mean(x^2) = 12.5, y = (0.8485, 1.1314).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "input_rows.h"
#include "threads.h"

/* 16 floats; the compiler splits it where vectors are narrower. */
typedef float lanes __attribute__((vector_size(64)));
typedef uint16_t bf16_lanes __attribute__((vector_size(32)));
typedef uint32_t wide_lanes __attribute__((vector_size(64)));
enum { LANES = 16 };

static inline lanes load_f32(const float *p) {
    lanes v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline lanes load_bf16_lanes(const uint16_t *p) { /* a bfloat16 is a float32's high half */
    bf16_lanes h;
    memcpy(&h, p, sizeof h);
    return (lanes)(__builtin_convertvector(h, wide_lanes) << 16);
}

static inline float lane_sum(lanes v) {
    float sum = 0.0f;
    for (int i = 0; i < LANES; i++) sum += v[i];
    return sum;
}

/* sum of x^2 over a row: 32 running sums side by side, then their total. One running sum is a chain
 * of dependent adds, ~4 cycles each: 32 rows x 576 bfloat16 took 24 us a call that way and 11 us
 * this way, 2,048 rows 698 and 266 us (Zen 4 VM). Another order than torch's, so the last bits can differ. */
static float sum_squares(const void *x, int64_t dim, int bf16) {
    lanes a = {0}, b = {0};
    int64_t i = 0;
    for (; i + 2 * LANES <= dim; i += 2 * LANES) {
        const lanes u = bf16 ? load_bf16_lanes((const uint16_t *)x + i) : load_f32((const float *)x + i);
        const lanes v = bf16 ? load_bf16_lanes((const uint16_t *)x + i + LANES)
                             : load_f32((const float *)x + i + LANES);
        a += u * u;
        b += v * v;
    }
    float sum = lane_sum(a + b);
    for (; i < dim; i++) {
        const float v = bf16 ? bf16_to_float(((const uint16_t *)x)[i]) : ((const float *)x)[i];
        sum += v * v;
    }
    return sum;
}

static void norm_f32(float *y, const float *x, const float *w, int64_t dim, float eps) {
    const float scale = 1.0f / sqrtf(sum_squares(x, dim, 0) / (float)dim + eps);
    for (int64_t i = 0; i < dim; i++) y[i] = w[i] * (x[i] * scale);
}

/* The normalised row rounded to bfloat16, times w, rounded again (HF's order), ROW_LANES at a time
 * (input_rows.h's lanes and rounding; element by element before: the same bits). 60 calls from Python,
 * 2-core Xeon VM: 32 x 576 rows 0.66 against 0.76 ms, 2,048 x 576 rows 22.4 against 25.3 ms. */
static void norm_bf16(uint16_t *y, const uint16_t *x, const uint16_t *w, int64_t dim, float eps) {
    const float scale = 1.0f / sqrtf(sum_squares(x, dim, 1) / (float)dim + eps);
    int64_t i = 0;
    for (; i + ROW_LANES <= dim; i += ROW_LANES) {
        const row_lanes normed = round_bf16_lanes(row_lanes_at(x, 1, i) * scale);
        const row_hlanes halves = to_bf16_lanes(row_lanes_at(w, 1, i) * normed);
        memcpy(y + i, &halves, sizeof halves);
    }
    for (; i < dim; i++)
        y[i] = float_to_bf16(bf16_to_float(w[i]) * round_bf16(bf16_to_float(x[i]) * scale));
}

typedef struct {
    void *y;
    const void *x, *w;
    int64_t dim;
    float eps;
    int bf16;
} Norms;

static void norm_rows(void *context, int64_t begin, int64_t end) {
    const Norms *n = context;
    for (int64_t r = begin; r < end; r++) {
        if (n->bf16)
            norm_bf16((uint16_t *)n->y + r * n->dim, (const uint16_t *)n->x + r * n->dim, (const uint16_t *)n->w,
                      n->dim, n->eps);
        else
            norm_f32((float *)n->y + r * n->dim, (const float *)n->x + r * n->dim, (const float *)n->w, n->dim,
                     n->eps);
    }
}

void rms_norm(void *y, const void *x, const void *w, int64_t rows, int64_t dim, float eps, int bf16,
              int num_threads) {
    /* Rows are independent; threads only pay off for prefill-sized steps. */
    Norms norms = {y, x, w, dim, eps, bf16};
    pool_run(norm_rows, &norms, rows, 16, rows >= 64 ? num_threads : 1);
}
