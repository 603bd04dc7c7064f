/* GGUF's quantized blocks (ggml's layouts) decoded to float32, value for value what gguf-py's
 * gguf.quants.dequantize gives: the same float32 operations in the same order (d * sc first, then
 * times q, then minus dmin * m), each rounded to float32 (the library builds with -ffp-contract=off,
 * so nothing here is fused). gguf_linear.c multiplies by these values; the tests compare them with
 * gguf-py's.
 *
 * Each decoder writes `count` consecutive blocks of one row. Types (ggml's type ids, block bytes,
 * weights per block) and their per-block layouts, d and dmin float16, little-endian:
 *   Q4_0 (2, 18, 32):  d, qs[16]                 w = d * (q - 8)
 *   Q4_1 (3, 20, 32):  d, m, qs[16]              w = d * q + m
 *       qs[j]: weight j in the low nibble, weight j + 16 in the high one.
 *   Q5_0 (6, 22, 32):  d, qh[4], qs[16]          w = d * (q - 16), q = nibble | bit << 4
 *       nibbles as Q4_0; weight j's fifth bit is bit j of qh read as one little-endian uint32.
 *       Worked example: qs[3] = 0x5A, qh = 0x00080000 -> weight 3 = 0xA (bit 3 clear) = 10,
 *       weight 19 = 0x5 | 1 << 4 = 21 (bit 19 set).
 *   Q8_0 (8, 34, 32):  d, qs[32] int8            w = q * d
 *   Q4_K (12, 144, 256): d, dmin, scales[12], qs[128]
 *       eight sub-blocks of 32, each with a 6-bit scale sc and min m: w = (d * sc) * q - dmin * m.
 *       qs in four runs of 32 bytes: run r's low nibbles are sub-block 2 r, its high ones 2 r + 1.
 *       scales (bits, high first): bytes 0-3 `EEAAAAAA`, 4-7 `eeaaaaaa`, 8-11 `eeeeEEEE`: sc of
 *       sub-block j < 4 is byte j's low 6 bits, its m byte j + 4's; sub-block j + 4 takes its
 *       low 4 bits from byte j + 8 (sc the low nibble, m the high) and its top 2 from the top 2
 *       of byte j (sc) or j + 4 (m). Worked example: bytes 1 = 0xC5, 9 = 0x3B -> sc of sub-block 1
 *       = 0x05, sc of sub-block 5 = 0xB | 0x3 << 4 = 59.
 *   Q5_K (13, 176, 256): d, dmin, scales[12], qh[32], qs[128]
 *       as Q4_K with a fifth bit: sub-block i's weight l takes bit i of qh[l].
 *   Q6_K (14, 210, 256): ql[128], qh[64], scales[16] int8, d
 *       sixteen sub-blocks of 16: w = (d * sc) * (q - 32), q = 4 low bits | 2 high bits << 4.
 *       Two halves of 128 weights (h = 0, 1); in half h, weight 32 r + l (r = 0..3, l = 0..31)
 *       takes its low bits from ql[64 h + 32 (r & 1) + l] (low nibble for r < 2, high for r >= 2)
 *       and its high bits from bits 2 r, 2 r + 1 of qh[32 h + l]. Worked example: weight 70
 *       (h 0, r 2, l 6): ql[6] >> 4 and (qh[6] >> 4) & 3, scale sc[70 / 16] = sc[4].
 */
#ifndef AQUEDUCT_GGUF_BLOCKS_H
#define AQUEDUCT_GGUF_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "quantized_inputs.h" /* half_to_float */

typedef void (*decode_blocks_fn)(const uint8_t *blocks, int64_t count, float *w);

typedef struct {
    int type;           /* ggml's id */
    int64_t block_bytes; /* bytes per block */
    int64_t block_size;  /* weights per block */
    decode_blocks_fn decode;
} BlockType;

static inline float read_half(const uint8_t *at) {
    uint16_t h;
    memcpy(&h, at, sizeof h);
    return half_to_float(h);
}

static void decode_q4_0(const uint8_t *blocks, int64_t count, float *w) {
    for (int64_t b = 0; b < count; b++, blocks += 18, w += 32) {
        const float d = read_half(blocks);
        for (int j = 0; j < 16; j++) {
            w[j] = d * (float)((blocks[2 + j] & 0x0F) - 8);
            w[j + 16] = d * (float)((blocks[2 + j] >> 4) - 8);
        }
    }
}

static void decode_q4_1(const uint8_t *blocks, int64_t count, float *w) {
    for (int64_t b = 0; b < count; b++, blocks += 20, w += 32) {
        const float d = read_half(blocks), m = read_half(blocks + 2);
        for (int j = 0; j < 16; j++) {
            w[j] = d * (float)(blocks[4 + j] & 0x0F) + m;
            w[j + 16] = d * (float)(blocks[4 + j] >> 4) + m;
        }
    }
}

static void decode_q5_0(const uint8_t *blocks, int64_t count, float *w) {
    for (int64_t b = 0; b < count; b++, blocks += 22, w += 32) {
        const float d = read_half(blocks);
        uint32_t qh;
        memcpy(&qh, blocks + 2, sizeof qh);
        const uint8_t *qs = blocks + 6;
        for (int j = 0; j < 16; j++) {
            const int low = (qs[j] & 0x0F) | (int)((qh >> j) & 1) << 4;
            const int high = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            w[j] = d * (float)(low - 16);
            w[j + 16] = d * (float)(high - 16);
        }
    }
}

static void decode_q8_0(const uint8_t *blocks, int64_t count, float *w) {
    for (int64_t b = 0; b < count; b++, blocks += 34, w += 32) {
        const float d = read_half(blocks);
        for (int j = 0; j < 32; j++) w[j] = (float)(int8_t)blocks[2 + j] * d;
    }
}

/* Q4_K's and Q5_K's eight 6-bit (scale, min) pairs as floats times d and dmin (header comment). */
static inline void k_scales(const uint8_t *block, float *scaled, float *mins) {
    const float d = read_half(block), dmin = read_half(block + 2);
    const uint8_t *s = block + 4;
    for (int j = 0; j < 4; j++) {
        scaled[j] = d * (float)(s[j] & 63);
        mins[j] = dmin * (float)(s[j + 4] & 63);
        scaled[j + 4] = d * (float)((s[j + 8] & 0x0F) | (s[j] >> 6) << 4);
        mins[j + 4] = dmin * (float)((s[j + 8] >> 4) | (s[j + 4] >> 6) << 4);
    }
}

static void decode_q4_k(const uint8_t *blocks, int64_t count, float *w) {
    for (int64_t b = 0; b < count; b++, blocks += 144, w += 256) {
        float scaled[8], mins[8];
        k_scales(blocks, scaled, mins);
        const uint8_t *qs = blocks + 16;
        for (int r = 0; r < 4; r++)
            for (int l = 0; l < 32; l++) {
                w[64 * r + l] = scaled[2 * r] * (float)(qs[32 * r + l] & 0x0F) - mins[2 * r];
                w[64 * r + 32 + l] = scaled[2 * r + 1] * (float)(qs[32 * r + l] >> 4) - mins[2 * r + 1];
            }
    }
}

static void decode_q5_k(const uint8_t *blocks, int64_t count, float *w) {
    for (int64_t b = 0; b < count; b++, blocks += 176, w += 256) {
        float scaled[8], mins[8];
        k_scales(blocks, scaled, mins);
        const uint8_t *qh = blocks + 16, *qs = blocks + 48;
        for (int r = 0; r < 4; r++)
            for (int l = 0; l < 32; l++) {
                const int low = (qs[32 * r + l] & 0x0F) | ((qh[l] >> (2 * r)) & 1) << 4;
                const int high = (qs[32 * r + l] >> 4) | ((qh[l] >> (2 * r + 1)) & 1) << 4;
                w[64 * r + l] = scaled[2 * r] * (float)low - mins[2 * r];
                w[64 * r + 32 + l] = scaled[2 * r + 1] * (float)high - mins[2 * r + 1];
            }
    }
}

static void decode_q6_k(const uint8_t *blocks, int64_t count, float *w) {
    for (int64_t b = 0; b < count; b++, blocks += 210, w += 256) {
        const uint8_t *ql = blocks, *qh = blocks + 128;
        const int8_t *sc = (const int8_t *)(blocks + 192);
        const float d = read_half(blocks + 208);
        float scaled[16];
        for (int i = 0; i < 16; i++) scaled[i] = d * (float)sc[i];
        for (int h = 0; h < 2; h++)
            for (int r = 0; r < 4; r++)
                for (int l = 0; l < 32; l++) {
                    const int low = (ql[64 * h + 32 * (r & 1) + l] >> (4 * (r >> 1))) & 0x0F;
                    const int q = low | ((qh[32 * h + l] >> (2 * r)) & 3) << 4;
                    const int k = 128 * h + 32 * r + l;
                    w[k] = scaled[k / 16] * (float)(q - 32);
                }
    }
}

static const BlockType BLOCK_TYPES[] = {
    {2, 18, 32, decode_q4_0},     {3, 20, 32, decode_q4_1},     {6, 22, 32, decode_q5_0},
    {8, 34, 32, decode_q8_0},     {12, 144, 256, decode_q4_k}, {13, 176, 256, decode_q5_k},
    {14, 210, 256, decode_q6_k},
};

/* The entry of `table` (`size` entries) for ggml type id `type`, or NULL when it is not one of these. */
static inline const BlockType *find_block_type(const BlockType *table, size_t size, int64_t type) {
    for (size_t i = 0; i < size; i++)
        if (table[i].type == type) return &table[i];
    return NULL;
}

#endif
