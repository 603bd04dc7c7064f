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
#include "threads.h"

static void norm_f32(float *y, const float *x, const float *w, int64_t dim, float eps) {
    float sum = 0.0f;
    for (int64_t i = 0; i < dim; i++) sum += x[i] * x[i];
    const float scale = 1.0f / sqrtf(sum / (float)dim + eps);
    for (int64_t i = 0; i < dim; i++) y[i] = w[i] * (x[i] * scale);
}

static void norm_bf16(uint16_t *y, const uint16_t *x, const uint16_t *w, int64_t dim, float eps) {
    float sum = 0.0f;
    for (int64_t i = 0; i < dim; i++) {
        const float v = bf16_to_float(x[i]);
        sum += v * v;
    }
    const float scale = 1.0f / sqrtf(sum / (float)dim + eps);
    for (int64_t i = 0; i < dim; i++)
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
