/* bfloat16 <-> float32 for the CPU kernels: a bfloat16 is the high half of a float32's bits.
 * Worked example: 0x3FC0 -> 0x3FC00000 = 1.5. */
#ifndef AQUEDUCT_BF16_H
#define AQUEDUCT_BF16_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_float(uint16_t x) {
    const uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Round to nearest even (NaN kept a quiet NaN), as torch converts float to bfloat16. */
static inline uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

static inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

/* A linear kernel's io_bf16 argument: 0 = x and y float32; 1 = x and y bfloat16; 2 = x bfloat16,
 * y float32 holding the bfloat16-rounded values (what a bfloat16 layer's output gives after
 * .float(), without a separate op: for a 49k-token LM head that op cost ~100 us on 2 threads). */
enum { IO_FLOAT32 = 0, IO_BF16 = 1, IO_BF16_TO_FLOAT32 = 2 };

static inline void store_output(void *y, int io_bf16, int64_t index, float value) {
    if (io_bf16 == IO_BF16)
        ((uint16_t *)y)[index] = float_to_bf16(value);
    else
        ((float *)y)[index] = io_bf16 == IO_BF16_TO_FLOAT32 ? round_bf16(value) : value;
}

#endif
