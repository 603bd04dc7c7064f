/* Paged attention for decode tokens (one query token per sequence), float32, on the CPU.
 *
 * Reads K/V straight from the paged cache through the block table, so no padded copy of the
 * context is ever made. One task = one (sequence, KV head); its G = num_heads / num_kv_heads
 * query heads share each K/V row read. Softmax is exact (max-subtracted), as in SDPA.
 *
 * Layouts (contiguous): q, out [num_seqs, num_heads, head_dim];
 * key_cache, value_cache [num_blocks, block_size, num_kv_heads, head_dim];
 * block_tables [num_seqs, block_table_stride] int32; seq_lens [num_seqs] int32 (>= 1).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void attend_one(float *out, const float *q_group, const float *key_cache, const float *value_cache,
                       const int32_t *blocks, int64_t len, int64_t group, int64_t head_dim, int64_t block_size,
                       int64_t token_stride, int64_t kv_offset, float scale, float *scores, float *acc) {
    const int64_t block_stride = block_size * token_stride;
    for (int64_t t = 0; t < len; ++t) {
        const float *k = key_cache + (int64_t)blocks[t / block_size] * block_stride
                         + (t % block_size) * token_stride + kv_offset;
        for (int64_t g = 0; g < group; ++g) {
            const float *qg = q_group + g * head_dim;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < head_dim; ++d) dot += qg[d] * k[d];
            scores[g * len + t] = dot * scale;
        }
    }
    for (int64_t g = 0; g < group; ++g) {
        float *row = scores + g * len;
        float max = -INFINITY, sum = 0.0f;
        for (int64_t t = 0; t < len; ++t) max = row[t] > max ? row[t] : max;
        for (int64_t t = 0; t < len; ++t) {
            row[t] = expf(row[t] - max);
            sum += row[t];
        }
        for (int64_t t = 0; t < len; ++t) row[t] /= sum;
    }
    memset(acc, 0, sizeof(float) * group * head_dim);
    for (int64_t t = 0; t < len; ++t) {
        const float *v = value_cache + (int64_t)blocks[t / block_size] * block_stride
                         + (t % block_size) * token_stride + kv_offset;
        for (int64_t g = 0; g < group; ++g) {
            const float w = scores[g * len + t];
            float *a = acc + g * head_dim;
#pragma omp simd
            for (int64_t d = 0; d < head_dim; ++d) a[d] += w * v[d];
        }
    }
    memcpy(out, acc, sizeof(float) * group * head_dim);
}

int paged_decode_attention_f32(float *out, const float *q, const float *key_cache, const float *value_cache,
                               const int32_t *block_tables, int64_t block_table_stride, const int32_t *seq_lens,
                               int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                               int64_t block_size, float scale, int64_t max_seq_len, int num_threads) {
    const int64_t group = num_heads / num_kv_heads;
    const int64_t token_stride = num_kv_heads * head_dim;
    int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        float *scores = malloc(sizeof(float) * group * (max_seq_len > 0 ? max_seq_len : 1));
        float *acc = malloc(sizeof(float) * group * head_dim);
        if (scores == NULL || acc == NULL) failed = 1;
#pragma omp for schedule(dynamic, 2)
        for (int64_t task = 0; task < num_seqs * num_kv_heads; ++task) {
            if (failed) continue;
            const int64_t seq = task / num_kv_heads, kv_head = task % num_kv_heads;
            const int64_t head = seq * num_heads + kv_head * group;
            attend_one(out + head * head_dim, q + head * head_dim, key_cache, value_cache,
                       block_tables + seq * block_table_stride, seq_lens[seq], group, head_dim, block_size,
                       token_stride, kv_head * head_dim, scale, scores, acc);
        }
        free(scores);
        free(acc);
    }
    return failed;
}
