/* Rotary embedding of q and k, and the K/V cache write, in one pass over a step's qkv rows (CPU).
 *
 * In torch this is ~16 small ops per layer (chunk, four multiplies, a subtract, an add, a cat,
 * split, two slices, two index_copy_ ...); for a one-token decode step each costs more in dispatch
 * than in arithmetic. Here it is one call per layer.
 *
 * qkv [T, (H + 2 H_kv) * D], contiguous: per token the H query heads, then the H_kv key heads,
 * then the H_kv value heads. q and k heads are rotated in place, neox style (rotate-half, HF):
 *     x1' = x1 * cos - x2 * sin,   x2' = x2 * cos + x1 * sin   (x1, x2 the halves of a head)
 * with cos, sin [T, D / 2] per token. Then token t's k and v rows go to cache slot slots[t]
 * (key_cache, value_cache [slots, H_kv * D]); slots[t] < 0 is padding, not written.
 *
 * The arithmetic is torch's, op for op: no FMA fusing here (the library's -ffp-contract=off, and
 * the pragma below), each product rounded as torch rounds it, and for bfloat16 every product, sum
 * and difference is rounded to bfloat16 as torch's bfloat16 ops round it (to nearest even), so the
 * results are bit-identical to the torch path in float32 and in bfloat16.
 * Worked example (float32, D = 2): x = (1, 2), cos 0.6, sin 0.8 -> (0.6 - 1.6, 1.2 + 0.8) = (-1, 2).
 */
#include <stdint.h>
#include <string.h>

#include "bf16.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif

static void rotate_f32(float *head, const float *cos, const float *sin, int64_t half) {
    for (int64_t i = 0; i < half; ++i) {
        const float x1 = head[i], x2 = head[i + half];
        const float a = x1 * cos[i], b = x2 * sin[i], c = x2 * cos[i], d = x1 * sin[i];
        head[i] = a - b;
        head[i + half] = c + d;
    }
}

static void rotate_bf16(uint16_t *head, const uint16_t *cos, const uint16_t *sin, int64_t half) {
    for (int64_t i = 0; i < half; ++i) {
        const float x1 = bf16_to_float(head[i]), x2 = bf16_to_float(head[i + half]);
        const float co = bf16_to_float(cos[i]), si = bf16_to_float(sin[i]);
        const float a = round_bf16(x1 * co), b = round_bf16(x2 * si);
        const float c = round_bf16(x2 * co), d = round_bf16(x1 * si);
        head[i] = float_to_bf16(a - b);
        head[i + half] = float_to_bf16(c + d);
    }
}

/* elem_size 4: float32 everywhere; 2: bfloat16 everywhere (qkv, cos, sin and the cache). */
void rope_kv_write(void *qkv, const void *cos, const void *sin, void *key_cache, void *value_cache,
                   const int64_t *slots, int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads,
                   int64_t head_dim, int64_t elem_size) {
    const int64_t half = head_dim / 2, kv_row = num_kv_heads * head_dim;
    const int64_t row = (num_heads + 2 * num_kv_heads) * head_dim;
    for (int64_t t = 0; t < num_tokens; ++t) {
        char *token = (char *)qkv + t * row * elem_size;
        const char *c = (const char *)cos + t * half * elem_size, *s = (const char *)sin + t * half * elem_size;
        for (int64_t h = 0; h < num_heads + num_kv_heads; ++h) {
            if (elem_size == 4)
                rotate_f32((float *)token + h * head_dim, (const float *)c, (const float *)s, half);
            else
                rotate_bf16((uint16_t *)token + h * head_dim, (const uint16_t *)c, (const uint16_t *)s, half);
        }
        if (slots[t] < 0) continue;
        const int64_t k_offset = num_heads * head_dim * elem_size, bytes = kv_row * elem_size;
        memcpy((char *)key_cache + slots[t] * bytes, token + k_offset, bytes);
        memcpy((char *)value_cache + slots[t] * bytes, token + k_offset + bytes, bytes);
    }
}
