/* Paged attention for decode tokens (one query token per sequence), float32, on the CPU.
 *
 * Reads K/V straight from the paged cache through the block table, so no padded copy of the
 * context is ever made. One task = one sequence, in three passes:
 *   1. scores[h][t] = scale * q_h . k_t for every query head h and token t, TILE tokens at a time:
 *      each of a tile's dot products gets its own vector accumulator, so their FMAs are
 *      independent (not one dependent chain per token) and one transposing sum finishes all TILE;
 *   2. an exact (max-subtracted) softmax over each head's scores, as in SDPA, with a vectorized exp;
 *   3. out_h = sum_t w[h][t] v_t, TILE tokens at a time, a slice of out_h held in registers.
 * Passes 1 and 3 take a tile's rows for all KV heads and query heads together, so each K/V row
 * comes from memory once and its re-reads (one per query head of a GQA group) hit the L1 cache;
 * and they prefetch the rows AHEAD tokens on, since the next block may lie anywhere in the cache.
 * Token t's row sits in block blocks[t / block_size] at slot t % block_size; those offsets are
 * worked out once per sequence (offsets_of) and shared by K and V, which have the same layout.
 * A sequence is padded to whole tiles by repeating its last token, which then gets weight 0.
 *
 * Layouts (contiguous): q, out [num_seqs, num_heads, head_dim];
 * key_cache, value_cache [num_blocks, block_size, num_kv_heads, head_dim];
 * block_tables [num_seqs, block_table_stride] int32; seq_lens [num_seqs] int32 (>= 1).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

/* GCC in -std=c11 mode never contracts a * b + c into one FMA instruction (clang does by
 * default); every accumulation here wants the FMA: half the instructions, one rounding not two. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=fast")
/* Built for x86 without AVX, GCC warns that 32-byte vector arguments have no settled ABI; every
 * function here is static and inlined, so no such value crosses an ABI boundary. */
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

/* 8 floats: one AVX register; the compiler splits it where vectors are narrower (SSE, NEON). */
typedef float vec __attribute__((vector_size(32)));
typedef int32_t ivec __attribute__((vector_size(32)));
enum { VL = 8, TILE = 8, AHEAD = 16 };

static inline vec load(const float *p) {
    vec v;
    memcpy(&v, p, sizeof v); /* an unaligned load */
    return v;
}

static inline void store(float *p, vec v) { memcpy(p, &v, sizeof v); }

static inline vec splat(float x) { return (vec){0} + x; }

static inline float sum_lanes(vec v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }

/* {sum_lanes(a[0]), ..., sum_lanes(a[7])} (TILE = VL = 8). */
static inline vec sum_lanes_of(const vec a[8]) {
#if defined(__AVX__)
    /* hadd(x, y) = {x0+x1, x2+x3, y0+y1, y2+y3 | x4+x5, x6+x7, y4+y5, y6+y7}, so after two rounds
     * s0123 = {a[0] lanes 0-3, a[1] 0-3, a[2] 0-3, a[3] 0-3 | the same for lanes 4-7}, each summed,
     * and s4567 likewise for a[4..7]; pairing up the 128-bit halves then adds lanes 0-3 to 4-7. */
    const __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
    return _mm256_permute2f128_ps(s0123, s4567, 0x20) + _mm256_permute2f128_ps(s0123, s4567, 0x31);
#else
    vec sums;
    for (int t = 0; t < 8; ++t) sums[t] = sum_lanes(a[t]);
    return sums;
#endif
}

/* Lane-wise select: where mask (all ones) pick a, elsewhere b. */
static inline vec blend(ivec mask, vec a, vec b) { return (vec)((mask & (ivec)a) | (~mask & (ivec)b)); }

static inline float max_lanes(vec v) {
    float m = v[0];
    for (int i = 1; i < VL; ++i) m = v[i] > m ? v[i] : m;
    return m;
}

/* e^x for x <= 0, lane-wise (libm's expf is a scalar call): x = n ln2 + r with n an integer and
 * |r| <= ln2 / 2; e^r from its Taylor polynomial to r^6 (relative error below 2e-7 there, about
 * libm's); 2^n put straight into the exponent bits.
 * Worked example: x = -3 -> n = round(-3 / ln2) = -4, r = -3 + 4 ln2 = -0.2274,
 * e^r = 0.7966, times 2^-4 = 0.04979 = e^-3. */
static inline vec exp_nonpositive(vec x) {
    const vec lowest = splat(-87.0f); /* keeps 2^n a normal float; e^-87 ~ 1.6e-38 counts as 0 */
    x = blend(x < lowest, lowest, x);
    /* Adding 1.5 * 2^23 rounds x / ln2 to an integer n, which then sits in the low mantissa bits:
     * the float 1.5 * 2^23 + n has bits 0x4B400000 + n (for |n| < 2^22). E.g. n = -4 -> 0x4B3FFFFC. */
    const vec shifted = x * 1.44269504088896341f + 12582912.0f;
    const vec n = shifted - 12582912.0f;
    /* ln2 = 0.693359375 - 2.12194440e-4: the first part times n is exact in float. */
    const vec r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    vec p = splat(1.0f / 720.0f);
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const ivec two_to_n = ((ivec)shifted - 0x4B400000 + 127) << 23; /* biased exponent n + 127 */
    return p * (vec)two_to_n;
}

/* Softmax over the first len entries of each row, in place; the padding up to stride (a multiple
 * of VL) becomes weight 0. The padding repeats the last token's score, so it leaves the max alone. */
static void softmax_rows(float *scores, int64_t num_rows, int64_t len, int64_t stride) {
    for (int64_t h = 0; h < num_rows; ++h) {
        float *s = scores + h * stride;
        vec max = load(s);
        for (int64_t t = VL; t < stride; t += VL) {
            const vec x = load(s + t);
            max = blend(x > max, x, max);
        }
        const float m = max_lanes(max);
        for (int64_t t = 0; t < stride; t += VL) store(s + t, exp_nonpositive(load(s + t) - m));
        for (int64_t t = len; t < stride; ++t) s[t] = 0.0f;
        vec sum = {0};
        for (int64_t t = 0; t < stride; t += VL) sum += load(s + t);
        const float inv = 1.0f / sum_lanes(sum);
        for (int64_t t = 0; t < stride; t += VL) store(s + t, load(s + t) * inv);
    }
}

/* Offset of each token's row in the cache (in floats), padded to a whole number of tiles by
 * repeating the last token, so every tile is full: the padding scores as the last token does
 * (leaving the max alone) and gets weight 0. Worked example: block_size 4, blocks {7, 2}, len 6 -> rows 28 29 30 31 8 9
 * (then 9 9 as padding), each times row = num_kv_heads * head_dim. */
static void offsets_of(int64_t *offsets, const int32_t *blocks, int64_t len, int64_t padded_len,
                       int64_t block_size, int64_t row) {
    int64_t t = 0;
    for (int64_t b = 0; t < len; ++b)
        for (int64_t slot = 0; slot < block_size && t < len; ++slot, ++t)
            offsets[t] = ((int64_t)blocks[b] * block_size + slot) * row;
    for (; t < padded_len; ++t) offsets[t] = offsets[len - 1];
}

/* scores[t] = scale * q . k_t for the TILE rows k_t = k + offsets[t] (one head's column). */
static inline __attribute__((always_inline)) void dot_tile(float *restrict scores, const float *restrict q,
                                                           const float *restrict k, const int64_t *offsets,
                                                           const int64_t head_dim, float scale) {
    vec acc[TILE];
    for (int t = 0; t < TILE; ++t) acc[t] = (vec){0};
    int64_t d = 0;
    for (; d + VL <= head_dim; d += VL) {
        const vec qd = load(q + d);
        for (int t = 0; t < TILE; ++t) acc[t] += qd * load(k + offsets[t] + d);
    }
    vec dots = sum_lanes_of(acc);
    for (; d < head_dim; ++d) /* head_dim % VL tail */
        for (int t = 0; t < TILE; ++t) dots[t] += q[d] * k[offsets[t] + d];
    store(scores, dots * scale);
}

/* out[0, num_vecs * VL) += sum_t w[t] v_t over the TILE rows v_t = v + offsets[t]; num_vecs is a
 * compile-time constant at each call, so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void weighted_sum_tile(float *restrict out, const float *restrict w,
                                                                    const float *restrict v, const int64_t *offsets,
                                                                    const int num_vecs) {
    vec acc[8]; /* num_vecs <= 8 */
    for (int i = 0; i < num_vecs; ++i) acc[i] = load(out + i * VL);
    for (int t = 0; t < TILE; ++t) {
        const vec wt = splat(w[t]);
        for (int i = 0; i < num_vecs; ++i) acc[i] += wt * load(v + offsets[t] + i * VL);
    }
    for (int i = 0; i < num_vecs; ++i) store(out + i * VL, acc[i]);
}

/* Start loading the rows of tokens [from, to) (clamped to len) into the cache ahead of their use:
 * the blocks of a sequence lie anywhere in the cache, so the hardware prefetcher can't follow
 * from one block to the next. */
static inline void prefetch_rows(const float *cache, const int64_t *offsets, int64_t from, int64_t to, int64_t len,
                                 int64_t row) {
    for (int64_t t = from; t < (to < len ? to : len); ++t)
        for (int64_t i = 0; i < row; i += 64 / sizeof(float)) __builtin_prefetch(cache + offsets[t] + i);
}

/* One sequence: out, q [num_heads, head_dim]; scores [num_heads, stride]; offsets [stride]. */
static inline __attribute__((always_inline)) void attend_sequence(
        float *restrict out, const float *restrict q, const float *restrict key_cache,
        const float *restrict value_cache, const int64_t *restrict offsets, int64_t len, int64_t stride,
        int64_t num_heads, int64_t num_kv_heads, const int64_t head_dim, float scale, float *restrict scores) {
    const int64_t group = num_heads / num_kv_heads, row = num_kv_heads * head_dim;
    prefetch_rows(key_cache, offsets, 0, AHEAD, len, row);
    for (int64_t t = 0; t < len; t += TILE) {
        prefetch_rows(key_cache, offsets, t + AHEAD, t + AHEAD + TILE, len, row);
        for (int64_t h = 0; h < num_heads; ++h)
            dot_tile(scores + h * stride + t, q + h * head_dim, key_cache + h / group * head_dim, offsets + t,
                     head_dim, scale);
    }
    prefetch_rows(value_cache, offsets, 0, AHEAD, len, row);
    softmax_rows(scores, num_heads, len, stride);
    memset(out, 0, sizeof(float) * num_heads * head_dim);
    for (int64_t t = 0; t < len; t += TILE) {
        prefetch_rows(value_cache, offsets, t + AHEAD, t + AHEAD + TILE, len, row);
        for (int64_t h = 0; h < num_heads; ++h) {
            float *o = out + h * head_dim;
            const float *w = scores + h * stride + t, *v = value_cache + h / group * head_dim;
            int64_t d = 0;
            for (; d + 8 * VL <= head_dim; d += 8 * VL) weighted_sum_tile(o + d, w, v + d, offsets + t, 8);
            for (; d + 4 * VL <= head_dim; d += 4 * VL) weighted_sum_tile(o + d, w, v + d, offsets + t, 4);
            for (; d + VL <= head_dim; d += VL) weighted_sum_tile(o + d, w, v + d, offsets + t, 1);
            for (; d < head_dim; ++d) /* head_dim % VL tail */
                for (int u = 0; u < TILE; ++u) o[d] += w[u] * v[offsets[t + u] + d];
        }
    }
}

int paged_decode_attention_f32(float *out, const float *q, const float *key_cache, const float *value_cache,
                               const int32_t *block_tables, int64_t block_table_stride, const int32_t *seq_lens,
                               int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                               int64_t block_size, float scale, int64_t max_seq_len, int num_threads) {
    const int64_t row = num_kv_heads * head_dim;
    const int64_t max_stride = ((max_seq_len > 0 ? max_seq_len : 1) + TILE - 1) / TILE * TILE;
    int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        float *scores = malloc(sizeof(float) * num_heads * max_stride);
        int64_t *offsets = malloc(sizeof(int64_t) * max_stride);
        if (scores == NULL || offsets == NULL) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t seq = 0; seq < num_seqs; ++seq) {
            if (failed) continue;
            const int64_t len = seq_lens[seq], stride = (len + TILE - 1) / TILE * TILE;
            offsets_of(offsets, block_tables + seq * block_table_stride, len, stride, block_size, row);
            float *o = out + seq * num_heads * head_dim;
            const float *qs = q + seq * num_heads * head_dim;
            /* Constant head_dim for the common sizes: the compiler unrolls the head_dim loops. */
            if (head_dim == 64)
                attend_sequence(o, qs, key_cache, value_cache, offsets, len, stride, num_heads, num_kv_heads, 64,
                                scale, scores);
            else if (head_dim == 128)
                attend_sequence(o, qs, key_cache, value_cache, offsets, len, stride, num_heads, num_kv_heads, 128,
                                scale, scores);
            else
                attend_sequence(o, qs, key_cache, value_cache, offsets, len, stride, num_heads, num_kv_heads,
                                head_dim, scale, scores);
        }
        free(scores);
        free(offsets);
    }
    return failed;
}
