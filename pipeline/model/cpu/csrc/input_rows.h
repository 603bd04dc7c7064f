/* A linear kernel's input rows, widened to float32 once per call (and its output rows' stores).
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
#include <string.h>
#include <stdint.h>

#include "bf16.h"
#include "vector_exp.h"

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

/* ---- whole rows, a vector at a time -------------------------------------------------------------
 *
 * The same values as input_value, element by element, for a whole row: the scalar loop's expf and
 * bfloat16 roundings took longer than some of the products they feed (SmolLM2's down projection, 32
 * bfloat16 rows: 588 us gated against 268 us plain). GCC vector extensions: one AVX register (AVX-512
 * where the CPU has it), split by the compiler where vectors are narrower. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi" /* static inline helpers: no vector crosses an ABI boundary */
#endif
#if defined(__AVX512F__) /* one AVX-512 register: the gating's exponentials and roundings at half the instructions */
enum { ROW_LANES = 16 };
#define row_exp_reduced exp_reduced16
#else
enum { ROW_LANES = 8 };
#define row_exp_reduced exp_reduced
#endif
typedef float row_lanes __attribute__((vector_size(ROW_LANES * 4)));
typedef int32_t row_ilanes __attribute__((vector_size(ROW_LANES * 4)));
typedef uint16_t row_hlanes __attribute__((vector_size(ROW_LANES * 2)));

static inline row_lanes row_lanes_at(const void *x, int io_bf16, int64_t index) {
    if (io_bf16) {
        row_hlanes h;
        memcpy(&h, (const uint16_t *)x + index, sizeof h);
        return (row_lanes)(__builtin_convertvector(h, row_ilanes) << 16);
    }
    row_lanes v;
    memcpy(&v, (const float *)x + index, sizeof v);
    return v;
}

static inline row_lanes row_select(row_ilanes mask, row_lanes a, row_lanes b) {
    return (row_lanes)((mask & (row_ilanes)a) | (~mask & (row_ilanes)b));
}

/* float_to_bf16's rounding (nearest even, NaN kept quiet), lane-wise, back as float32 values. */
static inline row_lanes round_bf16_lanes(row_lanes v) {
    const row_ilanes bits = (row_ilanes)v;
    const row_ilanes rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & (int32_t)0xFFFF0000u;
    const row_ilanes quiet_nan = (bits | 0x400000) & (int32_t)0xFFFF0000u;
    return row_select((bits & 0x7FFFFFFF) > 0x7F800000, (row_lanes)quiet_nan, (row_lanes)rounded);
}

/* float_to_bf16 lane-wise: each lane's bfloat16 bits (round_bf16_lanes' rounding, the high halves). */
static inline row_hlanes to_bf16_lanes(row_lanes v) {
    return __builtin_convertvector((row_ilanes)round_bf16_lanes(v) >> 16, row_hlanes);
}

/* e^x lane-wise (vector_exp.h), 2^n built in the exponent bits as 2^(n/2) * 2^(n - n/2) so that n up
 * to 128 stays finite. Past 88.72 the result is inf (as expf's); below -87.3 it is e^-87.3 instead of
 * a subnormal (both add nothing to 1 in 1 + e^-x). */
static inline row_lanes exp_lanes(row_lanes x) {
    const row_ilanes overflow = x > 88.7228f;
    x = row_select(x < -87.3f, (row_lanes){0} - 87.3f, x);
    x = row_select(overflow, (row_lanes){0}, x);
    row_lanes shifted;
    const row_lanes p = row_exp_reduced(x, &shifted);
    const row_ilanes whole = (row_ilanes)shifted - 0x4B400000, half = whole >> 1;
    const row_lanes scaled = p * (row_lanes)((half + 127) << 23) * (row_lanes)((whole - half + 127) << 23);
    return row_select(overflow, (row_lanes){0} + INFINITY, scaled);
}

/* silu(gate) = gate / (1 + e^-gate) lane-wise, in float32. */
static inline row_lanes silu_lanes(row_lanes gate) { return gate / (1.0f + exp_lanes(-gate)); }

/* A bfloat16 gate has 65,536 values, so its rounded SiLU is looked up where the CPU gathers 16 lanes
 * (AVX-512): silu_table.c fills aq_silu_bf16 with round_bf16_lanes(silu_lanes(g)) for every g, the
 * very operations gate_lanes otherwise runs, so a lane's value is the same either way. One gather from
 * the 128 KiB table (in L2) replaces the exponential, the exact quotient and a rounding. SmolLM2's 30
 * gated down projections on AMX (2 threads, 2-core Xeon VM, two alternated runs):
 * 2,048 rows 76.6-78.2 against 105.4-106.5 ms, 32 rows 2.00-2.14 against 2.60-2.74 ms. */
#if defined(__AVX512F__)
#include <immintrin.h>
extern uint16_t aq_silu_bf16[65536 + 1]; /* + 1: a 32-bit gather of the last entry reads 2 bytes past it */
static inline row_lanes rounded_silu_bf16(row_lanes gate) {
    const __m512i index = _mm512_srli_epi32((__m512i)gate, 16); /* a widened bfloat16: its high half */
    return (row_lanes)_mm512_slli_epi32(_mm512_i32gather_epi32(index, (const void *)aq_silu_bf16, 2), 16);
}
#else
static inline row_lanes rounded_silu_bf16(row_lanes gate) { return round_bf16_lanes(silu_lanes(gate)); }
#endif

/* silu(gate) * up lane-wise, rounded as input_value rounds it. */
static inline row_lanes gate_lanes(row_lanes gate, row_lanes up, int io_bf16) {
    return io_bf16 ? round_bf16_lanes(rounded_silu_bf16(gate) * up) : silu_lanes(gate) * up;
}

/* out[0, in_features) = row m's input values (input_value's, with exp_lanes for expf in whole lanes).
 * Which elements take exp_lanes does not depend on the vector width: every whole 8 (with 16 lanes, a
 * last 8 in a half-filled vector), the rest expf, so each value is the same in every build. */
static inline void input_row(float *out, const void *x, int io_bf16, int gated, int64_t in_features, int64_t m) {
    const int64_t width = gated ? 2 * in_features : in_features;
    int64_t i = 0;
    for (; i + ROW_LANES <= in_features; i += ROW_LANES) {
        row_lanes v = row_lanes_at(x, io_bf16, m * width + i);
        if (gated) v = gate_lanes(v, row_lanes_at(x, io_bf16, m * width + in_features + i), io_bf16);
        memcpy(out + i, &v, sizeof v);
    }
    if (ROW_LANES > 8 && gated && i + 8 <= in_features) {
        float gate[ROW_LANES] = {0}, up[ROW_LANES] = {0};
        for (int j = 0; j < 8; ++j) {
            gate[j] = element(x, io_bf16, m * width + i + j);
            up[j] = element(x, io_bf16, m * width + in_features + i + j);
        }
        row_lanes g, u;
        memcpy(&g, gate, sizeof g);
        memcpy(&u, up, sizeof u);
        const row_lanes v = gate_lanes(g, u, io_bf16);
        memcpy(out + i, &v, 8 * sizeof(float));
        i += 8;
    }
    for (; i < in_features; ++i) out[i] = input_value(x, io_bf16, gated, in_features, m, i);
}

/* out[0, n) = float_to_bf16(in[0, n)). */
static inline void bf16_row(uint16_t *out, const float *in, int64_t n) {
    int64_t i = 0;
    for (; i + ROW_LANES <= n; i += ROW_LANES) {
        row_lanes v;
        memcpy(&v, in + i, sizeof v);
        const row_hlanes h = to_bf16_lanes(v);
        memcpy(out + i, &h, sizeof h);
    }
    for (; i < n; ++i) out[i] = float_to_bf16(in[i]);
}

/* y[index, index + n) = values + bias (bias NULL: none), stored as io_bf16 says (store_output's
 * roundings, a vector at a time). */
static inline void store_outputs(void *y, int io_bf16, int64_t index, const float *values, const float *bias,
                                 int64_t n) {
    int64_t i = 0;
    for (; i + ROW_LANES <= n; i += ROW_LANES) {
        row_lanes v, b = {0};
        memcpy(&v, values + i, sizeof v);
        if (bias) memcpy(&b, bias + i, sizeof b);
        v += b;
        if (io_bf16 == IO_BF16) {
            const row_hlanes h = to_bf16_lanes(v);
            memcpy((uint16_t *)y + index + i, &h, sizeof h);
        } else {
            if (io_bf16 == IO_BF16_TO_FLOAT32) v = round_bf16_lanes(v);
            memcpy((float *)y + index + i, &v, sizeof v);
        }
    }
    for (; i < n; ++i) store_output(y, io_bf16, index + i, values[i] + (bias ? bias[i] : 0.0f));
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif
