/* A linear kernel's input rows, widened to float32 once per call.
 *
 * `gated`: the down projection of a SiLU-gated MLP takes the gate_up projection's output as it is,
 * x = [gate | up] with 2 * in_features values per row, and its input value i is
 * silu(gate_i) * up_i. That saves the split, the SiLU and the multiply as separate torch ops. Each
 * op rounds as torch's does: in bfloat16 the SiLU is rounded, then the product.
 * Worked example (float32): gate 0, up 3 -> silu(0) = 0 / (1 + e^0) = 0 -> 0.
 */
#ifndef AQUEDUCT_INPUT_ROWS_H
#define AQUEDUCT_INPUT_ROWS_H

#include <math.h>
#include <stdint.h>

#include "bf16.h"

static inline float element(const void *x, int io_bf16, int64_t index) {
    return io_bf16 ? bf16_to_float(((const uint16_t *)x)[index]) : ((const float *)x)[index];
}

/* Row m's input value i (in_features values per row). */
static inline float input_value(const void *x, int io_bf16, int gated, int64_t in_features, int64_t m, int64_t i) {
    if (!gated) return element(x, io_bf16, m * in_features + i);
    const float gate = element(x, io_bf16, m * 2 * in_features + i);
    const float up = element(x, io_bf16, m * 2 * in_features + in_features + i);
    const float silu = gate / (1.0f + expf(-gate));
    return io_bf16 ? round_bf16(round_bf16(silu) * up) : silu * up;
}

#endif
