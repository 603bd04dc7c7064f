/* What the quantized linear kernels (int4_linear.c, int8_linear.c) share: float16 scales widened
 * to float32, and each call's input rows widened to float32 and quantized per group of 32.
 *
 * The products are integer: each group of 32 input values is quantized to int16 with one scale
 * (max |x| / 32767), once per call, and a group's dot product with the weights' integers is exact in
 * 32 bits. Rounding x to 1 part in 65534 of its group's largest value costs far less accuracy than
 * the int8 activations llama.cpp uses, at the same speed here (SmolLM2 Q4_1 against the float32
 * model of the same weights, teacher-forced over 161 tokens, benchmarks/quant_accuracy.py: top-1
 * agreement 98.8% and mean KL 0.0019 nats with int16, 95.0% and 0.0174 with int8).
 */
#ifndef AQUEDUCT_QUANTIZED_INPUTS_H
#define AQUEDUCT_QUANTIZED_INPUTS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "input_rows.h"

#define GROUP 32

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

/* x's rows as float32 [rows, padded_in], zeros after in_features (gated: silu(gate) * up, input_rows.h);
 * NULL when out of memory. */
static inline float *widened(const void *x, int64_t rows, int64_t in_features, int64_t padded_in, int io_bf16,
                             int gated) {
    float *out = calloc(rows * padded_in > 0 ? rows * padded_in : 1, sizeof(float));
    if (out)
        for (int64_t m = 0; m < rows; m++) input_row(out + m * padded_in, x, io_bf16, gated, in_features, m);
    return out;
}

/* x per group of 32 as int16 values times one scale (max |x| / 32767, rounded to nearest), and the
 * sums of x itself (the 4-bit offset term). Worked example (a group of 2 for brevity): x = (0.5, -1.0)
 * -> scale 1 / 32767, x_q = (16384, -32767), sum -0.5. */
static inline void quantize_groups(int16_t *x_q, float *scales, float *sums, const float *x, int64_t count) {
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
        if (sums) sums[group] = sum;
    }
}

/* One call's input rows, quantized: x_q [rows, padded_in], scales and sums [rows, padded_in / 32]. */
typedef struct {
    int16_t *x_q;
    float *scales, *sums;
} QuantizedRows;

static inline void free_quantized_rows(QuantizedRows *q) {
    free(q->x_q);
    free(q->scales);
    free(q->sums);
}

/* padded_in: in_features rounded up to a multiple of 32 (zeros after x's own values).
 * Returns 0, or 2 when out of memory (nothing then stays allocated). */
static inline int quantize_rows(QuantizedRows *q, const void *x, int64_t rows, int64_t in_features, int64_t padded_in,
                                int io_bf16, int gated) {
    const int64_t count = rows * padded_in, groups = count / GROUP > 0 ? count / GROUP : 1;
    float *x_f32 = widened(x, rows, in_features, padded_in, io_bf16, gated);
    q->x_q = malloc(sizeof(int16_t) * (count > 0 ? count : 1));
    q->scales = malloc(sizeof(float) * groups);
    q->sums = malloc(sizeof(float) * groups);
    if (!x_f32 || !q->x_q || !q->scales || !q->sums) {
        free(x_f32);
        free_quantized_rows(q);
        return 2;
    }
    quantize_groups(q->x_q, q->scales, q->sums, x_f32, count);
    free(x_f32);
    return 0;
}

#endif
