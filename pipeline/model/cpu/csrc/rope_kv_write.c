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
#include "threads.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "input_rows.h" /* after the pragma: its lanes compile without contraction too */

static void rotate_f32(float *head, const float *cos, const float *sin, int64_t half) {
    for (int64_t i = 0; i < half; ++i) {
        const float x1 = head[i], x2 = head[i + half];
        const float a = x1 * cos[i], b = x2 * sin[i], c = x2 * cos[i], d = x1 * sin[i];
        head[i] = a - b;
        head[i + half] = c + d;
    }
}

/* bfloat16 rotation ROW_LANES elements at a time (input_rows.h's lanes and rounding; the same bits as
 * element by element, the tail still so): 30 calls of SmolLM2's rows (9 q, 3 k heads), 2-core Xeon VM,
 * one thread: 32 tokens 0.44 against 0.50-0.51 ms, 2,048 tokens 38-39 against 42-46 ms. */
static void rotate_bf16(uint16_t *head, const uint16_t *cos, const uint16_t *sin, int64_t half) {
    int64_t i = 0;
    for (; i + ROW_LANES <= half; i += ROW_LANES) {
        const row_lanes x1 = row_lanes_at(head, 1, i), x2 = row_lanes_at(head, 1, i + half);
        const row_lanes co = row_lanes_at(cos, 1, i), si = row_lanes_at(sin, 1, i);
        const row_lanes a = round_bf16_lanes(x1 * co), b = round_bf16_lanes(x2 * si);
        const row_lanes c = round_bf16_lanes(x2 * co), d = round_bf16_lanes(x1 * si);
        const row_hlanes first = to_bf16_lanes(a - b), second = to_bf16_lanes(c + d);
        memcpy(head + i, &first, sizeof first);
        memcpy(head + i + half, &second, sizeof second);
    }
    for (; i < half; ++i) {
        const float x1 = bf16_to_float(head[i]), x2 = bf16_to_float(head[i + half]);
        const float co = bf16_to_float(cos[i]), si = bf16_to_float(sin[i]);
        const float a = round_bf16(x1 * co), b = round_bf16(x2 * si);
        const float c = round_bf16(x2 * co), d = round_bf16(x1 * si);
        head[i] = float_to_bf16(a - b);
        head[i + half] = float_to_bf16(c + d);
    }
}

typedef struct {
    void *qkv;
    const void *cos, *sin;
    void *key_cache, *value_cache;
    const int64_t *slots;
    int64_t num_heads, num_kv_heads, head_dim, elem_size;
} RopeCall;

static void rope_tokens(void *context, int64_t begin, int64_t end) {
    const RopeCall *r = context;
    const int64_t half = r->head_dim / 2, kv_row = r->num_kv_heads * r->head_dim, elem_size = r->elem_size;
    const int64_t row = (r->num_heads + 2 * r->num_kv_heads) * r->head_dim;
    for (int64_t t = begin; t < end; ++t) {
        char *token = (char *)r->qkv + t * row * elem_size;
        const char *c = (const char *)r->cos + t * half * elem_size, *s = (const char *)r->sin + t * half * elem_size;
        for (int64_t h = 0; h < r->num_heads + r->num_kv_heads; ++h) {
            if (elem_size == 4)
                rotate_f32((float *)token + h * r->head_dim, (const float *)c, (const float *)s, half);
            else
                rotate_bf16((uint16_t *)token + h * r->head_dim, (const uint16_t *)c, (const uint16_t *)s, half);
        }
        if (r->slots[t] < 0) continue;
        const int64_t k_offset = r->num_heads * r->head_dim * elem_size, bytes = kv_row * elem_size;
        memcpy((char *)r->key_cache + r->slots[t] * bytes, token + k_offset, bytes);
        memcpy((char *)r->value_cache + r->slots[t] * bytes, token + k_offset + bytes, bytes);
    }
}

/* elem_size 4: float32 everywhere; 2: bfloat16 everywhere (qkv, cos, sin and the cache). Tokens are
 * independent: a prefill's split between the threads (threads.h's rule on the qkv bytes; 30 calls of
 * 2,048 SmolLM2 tokens, 2-core Xeon VM: 19 ms on two threads against 38-39 ms on one). */
void rope_kv_write(void *qkv, const void *cos, const void *sin, void *key_cache, void *value_cache,
                   const int64_t *slots, int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads,
                   int64_t head_dim, int64_t elem_size, int num_threads) {
    RopeCall call = {qkv, cos, sin, key_cache, value_cache, slots, num_heads, num_kv_heads, head_dim, elem_size};
    const int64_t row_bytes = (num_heads + 2 * num_kv_heads) * head_dim * elem_size;
    const int threads = threads_for(num_tokens * row_bytes, num_threads);
    pool_run(rope_tokens, &call, num_tokens, (num_tokens + threads - 1) / threads, threads);
}
