/* The core of a lane-wise e^x (libm's expf is a scalar call), shared by the kernels that need one
 * (paged_decode_attention.c's softmax, input_rows.h's SiLU); each clamps x and builds 2^n its own way.
 *
 * x = n ln2 + r with n an integer and |r| <= ln2 / 2; e^r from its Taylor polynomial to r^6
 * (relative error below 2e-7 there, about libm's). Adding 1.5 * 2^23 rounds x / ln2 to n, which then
 * sits in the low mantissa bits: the float 1.5 * 2^23 + n has bits 0x4B400000 + n (|n| < 2^22), so
 * n = (int bits of *shifted) - 0x4B400000. E.g. n = -4 -> 0x4B3FFFFC.
 * Worked example: x = -3 -> n = round(-3 / ln2) = -4, r = -3 + 4 ln2 = -0.2274, e^r = 0.7966, and
 * e^-3 = 0.7966 * 2^-4 = 0.04979.
 * Rounding as the including file compiles it (fp-contract): an include after its pragmas. */
#ifndef AQUEDUCT_VECTOR_EXP_H
#define AQUEDUCT_VECTOR_EXP_H

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi" /* static inline: no vector crosses an ABI boundary */
#endif
typedef float exp_lanes8 __attribute__((vector_size(32)));
typedef float exp_lanes16 __attribute__((vector_size(64)));

/* e^r for x's r; *shifted = 1.5 * 2^23 + n. The same operations at either width, so a lane's result
 * is the same in exp_reduced (8 lanes) and exp_reduced16. */
#define DEFINE_EXP_REDUCED(NAME, LANES)                                                         \
    static inline LANES NAME(LANES x, LANES *shifted) {                                          \
        *shifted = x * 1.44269504088896341f + 12582912.0f;                                        \
        const LANES n = *shifted - 12582912.0f;                                                    \
        /* ln2 = 0.693359375 - 2.12194440e-4: the first part times n is exact in float. */       \
        const LANES r = (x - n * 0.693359375f) + n * 2.12194440e-4f;                              \
        LANES p = (LANES){0} + 1.0f / 720.0f;                                                      \
        p = p * r + 1.0f / 120.0f;                                                                 \
        p = p * r + 1.0f / 24.0f;                                                                  \
        p = p * r + 1.0f / 6.0f;                                                                   \
        p = p * r + 0.5f;                                                                          \
        p = p * r + 1.0f;                                                                          \
        return p * r + 1.0f;                                                                       \
    }
DEFINE_EXP_REDUCED(exp_reduced, exp_lanes8)
DEFINE_EXP_REDUCED(exp_reduced16, exp_lanes16)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif
