/* gguf_blocks.h's decoders, 16 weights per instruction (AVX-512 with BW and VL). The values are
 * the same bits: the same float32 multiply, then add or subtract, lane by lane; only the unpacking
 * of bits into bytes is vectorised. Scalar decoding cost ~10x the product at one row (Q4_K, 5632 x
 * 2048, Zen 4: 2.0 ms to decode the weight, 0.2 ms for the int8 kernel's whole product).
 *
 * Each type gives its weights as 16-float vectors: a 32-weight block's pair, or 64 weights (four
 * vectors) of a 256-weight one, each vector 16 small integers widened to float32 with the block's
 * scale (and offset) applied. Worked example (Q4_K): bytes 0x3A, ... with scale 0.5, min 1 -> low
 * nibble 10 -> 0.5 * 10 - 1 = 4. The decoders store them; gguf_linear.c's one-row path multiplies
 * them by x as they come, without the store.
 */
#ifndef AQUEDUCT_GGUF_BLOCKS_AVX512_H
#define AQUEDUCT_GGUF_BLOCKS_AVX512_H

#include <immintrin.h>

#include "gguf_blocks.h"

static inline __m128i low_nibbles(__m128i bytes) { return _mm_and_si128(bytes, _mm_set1_epi8(0x0F)); }
static inline __m128i high_nibbles(__m128i bytes) {
    return _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
}
static inline __m128i load16(const uint8_t *at) { return _mm_loadu_si128((const __m128i *)at); }

/* scale * (float)q - offset, q unsigned bytes. */
static inline __m512 unsigned_weights(__m128i q, float scale, float offset) {
    const __m512 value = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q));
    return _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(scale), value), _mm512_set1_ps(offset));
}

/* scale * (float)q, q signed bytes. */
static inline __m512 signed_weights(__m128i q, float scale) {
    return _mm512_mul_ps(_mm512_set1_ps(scale), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
}

/* One 32-weight block's two vectors (weights 0-15, 16-31). */
static inline void q4_0_pair(const uint8_t *block, __m512 v[2]) {
    const __m128i eight = _mm_set1_epi8(8), qs = load16(block + 2);
    const float d = read_half(block);
    v[0] = signed_weights(_mm_sub_epi8(low_nibbles(qs), eight), d);
    v[1] = signed_weights(_mm_sub_epi8(high_nibbles(qs), eight), d);
}

static inline void q4_1_pair(const uint8_t *block, __m512 v[2]) {
    const float d = read_half(block), m = read_half(block + 2);
    const __m128i qs = load16(block + 4);
    v[0] = unsigned_weights(low_nibbles(qs), d, -m); /* d * q - (-m): the same float as d * q + m */
    v[1] = unsigned_weights(high_nibbles(qs), d, -m);
}

static inline void q5_0_pair(const uint8_t *block, __m512 v[2]) {
    const __m128i sixteen = _mm_set1_epi8(16), qs = load16(block + 6);
    const float d = read_half(block);
    uint32_t qh;
    memcpy(&qh, block + 2, sizeof qh);
    /* fifth bits as 16 where set: weight j's is bit j of qh */
    const __m128i low_top = _mm_maskz_mov_epi8((__mmask16)(qh & 0xFFFF), sixteen);
    const __m128i high_top = _mm_maskz_mov_epi8((__mmask16)(qh >> 16), sixteen);
    v[0] = signed_weights(_mm_sub_epi8(_mm_or_si128(low_nibbles(qs), low_top), sixteen), d);
    v[1] = signed_weights(_mm_sub_epi8(_mm_or_si128(high_nibbles(qs), high_top), sixteen), d);
}

static inline void q8_0_pair(const uint8_t *block, __m512 v[2]) {
    const float d = read_half(block);
    v[0] = signed_weights(load16(block + 2), d);
    v[1] = signed_weights(load16(block + 18), d);
}

/* A 256-weight block's scales as floats, computed once for its four groups: Q4_K and Q5_K's eight
 * (d * sc, dmin * m) pairs (gguf_blocks.h's k_scales), Q6_K's sixteen d * sc. */
typedef struct {
    float scaled[16], mins[8];
} KScales;

static inline void q4_k_scales(const uint8_t *block, KScales *k) { k_scales(block, k->scaled, k->mins); }
static inline void q5_k_scales(const uint8_t *block, KScales *k) { k_scales(block, k->scaled, k->mins); }
static inline void q6_k_scales(const uint8_t *block, KScales *k) {
    const int8_t *sc = (const int8_t *)(block + 192);
    const float d = read_half(block + 208);
    for (int i = 0; i < 16; i++) k->scaled[i] = d * (float)sc[i];
}

/* Weights 64 g .. 64 g + 63 of a 256-weight block as four vectors (g = 0..3): Q4_K's sub-blocks
 * 2 g (low nibbles of run g) and 2 g + 1 (high nibbles). */
static inline void q4_k_group(const uint8_t *block, int g, const KScales *k, __m512 v[4]) {
    const uint8_t *qs = block + 16 + 32 * g;
    for (int half = 0; half < 2; half++) {
        const __m128i bytes = load16(qs + 16 * half);
        v[half] = unsigned_weights(low_nibbles(bytes), k->scaled[2 * g], k->mins[2 * g]);
        v[2 + half] = unsigned_weights(high_nibbles(bytes), k->scaled[2 * g + 1], k->mins[2 * g + 1]);
    }
}

static inline void q5_k_group(const uint8_t *block, int g, const KScales *k, __m512 v[4]) {
    const __m128i one = _mm_set1_epi8(1);
    const uint8_t *qh = block + 16, *qs = block + 48 + 32 * g;
    for (int half = 0; half < 2; half++) {
        const __m128i bytes = load16(qs + 16 * half), high_bits = load16(qh + 16 * half);
        const __m128i top_low = _mm_and_si128(_mm_srli_epi16(high_bits, 2 * g), one);
        const __m128i top_high = _mm_and_si128(_mm_srli_epi16(high_bits, 2 * g + 1), one);
        v[half] = unsigned_weights(_mm_or_si128(low_nibbles(bytes), _mm_slli_epi16(top_low, 4)), k->scaled[2 * g],
                                   k->mins[2 * g]);
        v[2 + half] = unsigned_weights(_mm_or_si128(high_nibbles(bytes), _mm_slli_epi16(top_high, 4)),
                                       k->scaled[2 * g + 1], k->mins[2 * g + 1]);
    }
}

/* Q6_K's 64 g .. 64 g + 63: half h = g / 2, r = 2 (g % 2) and r + 1 (gguf_blocks.h). */
static inline void q6_k_group(const uint8_t *block, int g, const KScales *k, __m512 v[4]) {
    const __m128i three = _mm_set1_epi8(3), thirty_two = _mm_set1_epi8(32);
    const uint8_t *ql = block + 64 * (g / 2), *qh = block + 128 + 32 * (g / 2);
    const int shift = 4 * (g % 2); /* r = 2 (g % 2) + i / 2: the high nibbles for r >= 2 */
    for (int i = 0; i < 4; i++) {
        const int r = 2 * (g % 2) + i / 2, half = i % 2;
        const __m128i low_bytes = load16(ql + 32 * (r & 1) + 16 * half);
        const __m128i low = _mm_and_si128(_mm_srli_epi16(low_bytes, shift), _mm_set1_epi8(0x0F));
        const __m128i top = _mm_and_si128(_mm_srli_epi16(load16(qh + 16 * half), 2 * r), three);
        const __m128i q = _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(top, 4)), thirty_two);
        v[i] = signed_weights(q, k->scaled[4 * g + i]);
    }
}

/* decode_blocks_fn from a pair or group function: `count` blocks stored as floats. */
#define DEFINE_PAIR_DECODER(NAME, BLOCK_BYTES)                                                         \
    static void decode_##NAME##_avx512(const uint8_t *blocks, int64_t count, float *w) {               \
        for (int64_t b = 0; b < count; b++, blocks += BLOCK_BYTES, w += 32) {                         \
            __m512 v[2];                                                                               \
            NAME##_pair(blocks, v);                                                                    \
            _mm512_storeu_ps(w, v[0]);                                                                 \
            _mm512_storeu_ps(w + 16, v[1]);                                                            \
        }                                                                                              \
    }
#define DEFINE_GROUP_DECODER(NAME, BLOCK_BYTES)                                                        \
    static void decode_##NAME##_avx512(const uint8_t *blocks, int64_t count, float *w) {               \
        for (int64_t b = 0; b < count; b++, blocks += BLOCK_BYTES) {                                  \
            KScales k;                                                                                 \
            NAME##_scales(blocks, &k);                                                                 \
            for (int g = 0; g < 4; g++, w += 64) {                                                     \
                __m512 v[4];                                                                           \
                NAME##_group(blocks, g, &k, v);                                                        \
                for (int i = 0; i < 4; i++) _mm512_storeu_ps(w + 16 * i, v[i]);                        \
            }                                                                                          \
        }                                                                                              \
    }

DEFINE_PAIR_DECODER(q4_0, 18)
DEFINE_PAIR_DECODER(q4_1, 20)
DEFINE_PAIR_DECODER(q5_0, 22)
DEFINE_PAIR_DECODER(q8_0, 34)
DEFINE_GROUP_DECODER(q4_k, 144)
DEFINE_GROUP_DECODER(q5_k, 176)
DEFINE_GROUP_DECODER(q6_k, 210)

/* BLOCK_TYPES with these decoders. */
static const BlockType BLOCK_TYPES_AVX512[] = {
    {2, 18, 32, decode_q4_0_avx512},     {3, 20, 32, decode_q4_1_avx512},
    {6, 22, 32, decode_q5_0_avx512},     {8, 34, 32, decode_q8_0_avx512},
    {12, 144, 256, decode_q4_k_avx512}, {13, 176, 256, decode_q5_k_avx512},
    {14, 210, 256, decode_q6_k_avx512},
};

#endif
