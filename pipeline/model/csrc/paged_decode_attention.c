/* Paged attention for decode tokens (one query token per sequence), float32, on the CPU.
 *
 * Reads K/V straight from the paged cache through the block table, so no padded copy of the
 * context is ever made. One task = one sequence; within it, each KV head's K/V rows are read
 * once for the G = num_heads / num_kv_heads query heads that share them, walking block by block
 * (no per-token division to find a slot). Softmax is exact (max-subtracted), as in SDPA, with a
 * vectorized exp (below).
 *
 * Layouts (contiguous): q, out [num_seqs, num_heads, head_dim];
 * key_cache, value_cache [num_blocks, block_size, num_kv_heads, head_dim];
 * block_tables [num_seqs, block_table_stride] int32; seq_lens [num_seqs] int32 (>= 1).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* e^x for x <= 0, written so the compiler can vectorize it (libm's expf is a scalar call):
 * x = n ln2 + r with n an integer and |r| <= ln2 / 2; e^r from its Taylor polynomial to r^6
 * (relative error below 2e-7 there, about libm's); 2^n put straight into the exponent bits.
 * Worked example: x = -3 -> n = round(-3 / ln2) = -4, r = -3 + 4 ln2 = -0.2274,
 * e^r = 0.7966, times 2^-4 = 0.04979 = e^-3. */
#pragma omp declare simd notinbranch
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x; /* keeps 2^n a normal float; e^-87 ~ 1.6e-38 counts as 0 here */
    /* Adding then subtracting 1.5 * 2^23 rounds to the nearest integer (no libm call). */
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    /* ln2 = 0.693359375 - 2.12194440e-4: the first part times n is exact in float. */
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { int32_t i; float f; } two_to_n = { .i = ((int32_t)n + 127) << 23 };
    return p * two_to_n.f;
}

static void softmax_rows(float *scores, int64_t num_rows, int64_t len) {
    for (int64_t h = 0; h < num_rows; ++h) {
        float *s = scores + h * len;
        float max = -INFINITY, sum = 0.0f;
        for (int64_t t = 0; t < len; ++t) max = s[t] > max ? s[t] : max;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < len; ++t) {
            s[t] = exp_nonpositive(s[t] - max);
            sum += s[t];
        }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int64_t t = 0; t < len; ++t) s[t] *= inv;
    }
}

/* One (sequence, KV head): its `group` query heads attend over the sequence's `len` tokens.
 * Written for a head_dim known at compile time (see the dispatch below), so the query rows and
 * the output accumulators live in registers and each K/V row is loaded once for the whole group.
 * scores: [group, len] scratch; kv_offset: this KV head's column in a cache row. */
static inline __attribute__((always_inline)) void attend_kv_head(
        float *restrict out, const float *restrict q, const float *restrict key_cache,
        const float *restrict value_cache, const int32_t *restrict blocks, int64_t len, int64_t group,
        const int64_t head_dim, int64_t block_size, int64_t row, int64_t kv_offset, float scale,
        float *restrict scores) {
    for (int64_t start = 0; start < len; start += block_size) {
        const float *block = key_cache + (int64_t)blocks[start / block_size] * block_size * row + kv_offset;
        const int64_t end = start + block_size < len ? start + block_size : len;
        for (int64_t t = start; t < end; ++t) {
            const float *k = block + (t - start) * row;
            for (int64_t g = 0; g < group; ++g) {
                const float *qg = q + g * head_dim;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int64_t d = 0; d < head_dim; ++d) dot += qg[d] * k[d];
                scores[g * len + t] = dot * scale;
            }
        }
    }
    softmax_rows(scores, group, len);
    for (int64_t g = 0; g < group; ++g) {
        float acc[head_dim];
        for (int64_t d = 0; d < head_dim; ++d) acc[d] = 0.0f;
        const float *w = scores + g * len;
        for (int64_t start = 0; start < len; start += block_size) {
            const float *block = value_cache + (int64_t)blocks[start / block_size] * block_size * row + kv_offset;
            const int64_t end = start + block_size < len ? start + block_size : len;
            for (int64_t t = start; t < end; ++t) {
                const float *v = block + (t - start) * row;
                const float wt = w[t];
#pragma omp simd
                for (int64_t d = 0; d < head_dim; ++d) acc[d] += wt * v[d];
            }
        }
        for (int64_t d = 0; d < head_dim; ++d) out[g * head_dim + d] = acc[d];
    }
}

static void attend_kv_head_any(float *out, const float *q, const float *key_cache, const float *value_cache,
                               const int32_t *blocks, int64_t len, int64_t group, int64_t head_dim,
                               int64_t block_size, int64_t row, int64_t kv_offset, float scale, float *scores) {
    /* Constant head_dim for the common sizes: the compiler unrolls and keeps acc in registers. */
    if (head_dim == 64)
        attend_kv_head(out, q, key_cache, value_cache, blocks, len, group, 64, block_size, row, kv_offset, scale,
                       scores);
    else if (head_dim == 128)
        attend_kv_head(out, q, key_cache, value_cache, blocks, len, group, 128, block_size, row, kv_offset, scale,
                       scores);
    else
        attend_kv_head(out, q, key_cache, value_cache, blocks, len, group, head_dim, block_size, row, kv_offset,
                       scale, scores);
}

int paged_decode_attention_f32(float *out, const float *q, const float *key_cache, const float *value_cache,
                               const int32_t *block_tables, int64_t block_table_stride, const int32_t *seq_lens,
                               int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                               int64_t block_size, float scale, int64_t max_seq_len, int num_threads) {
    const int64_t group = num_heads / num_kv_heads;
    const int64_t row = num_kv_heads * head_dim;
    int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        float *scores = malloc(sizeof(float) * group * (max_seq_len > 0 ? max_seq_len : 1));
        if (scores == NULL) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t seq = 0; seq < num_seqs; ++seq) {
            if (failed) continue;
            for (int64_t kv_head = 0; kv_head < num_kv_heads; ++kv_head) {
                const int64_t head = seq * num_heads + kv_head * group;
                attend_kv_head_any(out + head * head_dim, q + head * head_dim, key_cache, value_cache,
                                   block_tables + seq * block_table_stride, seq_lens[seq], group, head_dim,
                                   block_size, row, kv_head * head_dim, scale, scores);
            }
        }
        free(scores);
    }
    return failed;
}
