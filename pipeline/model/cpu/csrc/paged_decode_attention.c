/* Paged attention for decode tokens (one query token per sequence) on the CPU: q and out float32
 * or bfloat16 (io_bf16: widened on the way in, rounded to nearest even on the way out), the K/V
 * cache float32, bfloat16 or fp8 (kv_format below; widened to float32 as it is read, so
 * every product and sum is in float32 whatever the cache holds).
 *
 * Reads K/V straight from the paged cache through the block table, so no padded copy of the
 * context is ever made. The work is split in units of one sequence's KV head (with the query heads
 * that share it), so a single long sequence can use every thread; a task takes consecutive units,
 * usually whole sequences. Per run of units of one sequence, three passes:
 *   1. scores[h][t] = scale * q_h . k_t for every query head h and token t;
 *   2. an exact (max-subtracted) softmax over each head's scores, as in SDPA, with a vectorized exp;
 *   3. out_h = sum_t w[h][t] v_t.
 * While a run's passes compute, the task's next run's K/V rows are prefetched a few at a time (Ahead).
 * Passes 1 and 3 walk the tokens in order, 8 at a time for float32/bfloat16 caches (one at a time
 * for fp8, decoded row by row), and finish those rows for all of the run's KV heads and query heads
 * before the next: the cache is read in address order, a block at a time.
 * That is what the memory system rewards: the earlier version took 8 tokens per query head, so
 * each sweep touched the same 8 rows once per head at a 2-line stride, and on a Zen 4 VM it
 * read K/V at 10-15 GB/s where this order reads 22-27 GB/s (1.5-2.3x the calls per second on
 * contiguous blocks, 1.1-1.2x on scattered ones), though its arithmetic is no faster in cache.
 * Token t's row sits in block blocks[t / block_size] at slot t % block_size; those offsets are
 * worked out once per sequence (offsets_of) and shared by K and V, which have the same layout.
 * The scores are padded to a multiple of 8 for the vectorized softmax by repeating the last
 * token's score, which leaves the max alone, and the padding then gets weight 0.
 *
 * Sliding window (window > 0): a sequence of len tokens attends to its last min(len, window)
 * tokens only (HF: keys with position > query position - window); blocks before them are never
 * read, so their block-table entries may be anything. Chunked local attention (chunk > 0, Llama 4):
 * a sequence of len tokens attends to the keys of its last token's chunk only, positions
 * (len - 1) / chunk * chunk .. len - 1 (HF: keys in the query's chunk of `chunk` positions); blocks
 * before them are likewise never read. Soft-capping (softcap > 0, Gemma 2):
 * scores become softcap * tanh(scores / softcap) before the softmax. Attention sinks (sinks != NULL,
 * gpt-oss: one float32 logit per query head): the sink joins the max and the softmax denominator but has
 * no value, so a head's weights sum to less than 1.
 *
 * kv_format: 0 = float32, 3 = bfloat16 (read in place), 1 = fp8 e4m3, 2 = fp8 e5m2. An fp8 cache
 * holds one byte per element, and value = decoded byte * k_scale (or v_scale); each token's K (or V)
 * row is decoded into a small float buffer just before use (decode_fp8_row), and the passes are
 * then the float32 ones.
 *
 * Layouts (contiguous): q, out [num_seqs, num_heads, head_dim] float32 (bfloat16 with io_bf16);
 * key_cache, value_cache [num_blocks, block_size, num_kv_heads, head_dim] (elements of kv_format);
 * block_tables [num_seqs, block_table_stride] int32; seq_lens [num_seqs] int32 (>= 1).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "bf16.h"
#include "threads.h"

/* The library is built with -ffp-contract=off (and GCC in -std=c11 mode never contracts anyway);
 * every accumulation here wants a * b + c as one FMA instruction: half the instructions, one
 * rounding not two. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=fast")
/* Built for x86 without AVX, GCC warns that 32-byte vector arguments have no settled ABI; every
 * function here is static and inlined, so no such value crosses an ABI boundary. */
#pragma GCC diagnostic ignored "-Wpsabi"
#elif defined(__clang__)
#pragma clang fp contract(fast)
#endif

/* 8 floats: one AVX register; the compiler splits it where vectors are narrower (SSE, NEON). */
#include "vector_exp.h" /* after the pragmas: its polynomial contracts to FMAs, as this file's arithmetic */

typedef float vec __attribute__((vector_size(32)));
typedef int32_t ivec __attribute__((vector_size(32)));
enum { VL = 8 };

static inline vec load(const float *p) {
    vec v;
    memcpy(&v, p, sizeof v); /* an unaligned load */
    return v;
}

/* 8 bfloat16 -> 8 float32: a bfloat16 is the high half of a float32's bits.
 * Worked example: 0x3FC0 -> 0x3FC00000 = 1.5. */
#if defined(__AVX2__)
#include <immintrin.h>
static inline vec load_bf16(const uint16_t *p) { /* one widening load and a shift (the generic form took 5) */
    return (vec)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
#else
static inline vec load_bf16(const uint16_t *p) {
    typedef uint16_t hvec __attribute__((vector_size(16)));
    hvec h;
    memcpy(&h, p, sizeof h);
    return (vec)(__builtin_convertvector(h, ivec) << 16);
}
#endif

/* Lane loads and scalar reads of a K/V row, float32 or bfloat16 (kv_bf16 is a constant after inlining). */
static inline __attribute__((always_inline)) vec load_kv(const void *row, int64_t d, const int kv_bf16) {
    return kv_bf16 ? load_bf16((const uint16_t *)row + d) : load((const float *)row + d);
}

static inline __attribute__((always_inline)) float kv_at(const void *row, int64_t d, const int kv_bf16) {
    return kv_bf16 ? bf16_to_float(((const uint16_t *)row)[d]) : ((const float *)row)[d];
}

static inline void store(float *p, vec v) { memcpy(p, &v, sizeof v); }

static inline vec splat(float x) { return (vec){0} + x; }

/* a * b + c with one rounding. Where the target has FMA the instruction is spelled out: GCC fused
 * pass 3's a * b + c in some inlined copies of it and not in others, and a head split between tasks
 * (SplitCall) must sum each element as attend_units does, to the bit. */
#if defined(__FMA__) && defined(__AVX2__) /* immintrin.h is included above */
static inline vec fma_lanes(vec a, vec b, vec c) { return (vec)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
#else
static inline vec fma_lanes(vec a, vec b, vec c) { return a * b + c; }
#endif

static inline float sum_lanes(vec v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }

/* The lane sums of 8 vectors as one vector: r[j] = sum of a[j]'s lanes. Three rounds of pairwise
 * adds of shuffled halves (7 adds, 14 shuffles) instead of 8 separate sums of 8 lanes. Worked
 * example, round 1 on a0, a1: (a0[0] + a0[1], a1[0] + a1[1], a0[2] + a0[3], a1[2] + a1[3], ...). */
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
static inline vec sums_of_8(const vec a[8]) {
    vec pairs[4], quads[2];
    for (int i = 0; i < 4; ++i)
        pairs[i] = SHUFFLE(a[2 * i], a[2 * i + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
                   SHUFFLE(a[2 * i], a[2 * i + 1], 1, 9, 3, 11, 5, 13, 7, 15);
    for (int i = 0; i < 2; ++i)
        quads[i] = SHUFFLE(pairs[2 * i], pairs[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
                   SHUFFLE(pairs[2 * i], pairs[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    return SHUFFLE(quads[0], quads[1], 0, 1, 2, 3, 8, 9, 10, 11) +
           SHUFFLE(quads[0], quads[1], 4, 5, 6, 7, 12, 13, 14, 15);
}
#undef SHUFFLE
#else
static inline vec sums_of_8(const vec a[8]) {
    vec r;
    for (int j = 0; j < VL; ++j) r[j] = sum_lanes(a[j]);
    return r;
}
#endif

/* Lane-wise select: where mask (all ones) pick a, elsewhere b. */
static inline vec blend(ivec mask, vec a, vec b) { return (vec)((mask & (ivec)a) | (~mask & (ivec)b)); }

static inline float max_lanes(vec v) {
    float m = v[0];
    for (int i = 1; i < VL; ++i) m = v[i] > m ? v[i] : m;
    return m;
}

/* e^x for x <= 0, lane-wise (vector_exp.h), 2^n put straight into the exponent bits. */
static inline vec exp_nonpositive(vec x) {
    const vec lowest = splat(-87.0f); /* keeps 2^n a normal float; e^-87 ~ 1.6e-38 counts as 0 */
    x = blend(x < lowest, lowest, x);
    vec shifted;
    const vec p = exp_reduced(x, &shifted);
    const ivec two_to_n = ((ivec)shifted - 0x4B400000 + 127) << 23; /* biased exponent n + 127 */
    return p * (vec)two_to_n;
}

/* Softmax over the first len entries of each row, in place; the padding up to stride (a multiple
 * of VL) becomes weight 0. The padding repeats the last token's score, so it leaves the max alone.
 * sinks (NULL: none): row h's sink logit, in the max and the denominator only. */
static void softmax_rows(float *scores, int64_t num_rows, int64_t len, int64_t stride, const float *sinks) {
    for (int64_t h = 0; h < num_rows; ++h) {
        float *s = scores + h * stride;
        vec max = load(s);
        for (int64_t t = VL; t < stride; t += VL) {
            const vec x = load(s + t);
            max = blend(x > max, x, max);
        }
        float m = max_lanes(max);
        if (sinks != NULL && sinks[h] > m) m = sinks[h];
        for (int64_t t = 0; t < stride; t += VL) store(s + t, exp_nonpositive(load(s + t) - m));
        for (int64_t t = len; t < stride; ++t) s[t] = 0.0f;
        vec sum = {0};
        for (int64_t t = 0; t < stride; t += VL) sum += load(s + t);
        const float inv = 1.0f / (sum_lanes(sum) + (sinks != NULL ? expf(sinks[h] - m) : 0.0f));
        for (int64_t t = 0; t < stride; t += VL) store(s + t, load(s + t) * inv);
    }
}

/* Offset of the rows of tokens first .. end - 1 in the cache, in elements (row = num_kv_heads * head_dim).
 * Worked example: block_size 4, blocks {7, 2}, tokens 0 .. 5 -> rows 28 29 30 31 8 9, each times row;
 * tokens 3 .. 5 -> rows 31 8 9. */
static void offsets_of(int64_t *offsets, const int32_t *blocks, int64_t first, int64_t end, int64_t block_size,
                       int64_t row) {
    for (int64_t t = first; t < end; ++t)
        offsets[t - first] = ((int64_t)blocks[t / block_size] * block_size + t % block_size) * row;
}

/* scores -> softcap * tanh(scores / softcap), the first len of each of num_rows rows. */
static void softcap_rows(float *scores, int64_t num_rows, int64_t len, int64_t stride, float softcap) {
    const float inv = 1.0f / softcap;
    for (int64_t h = 0; h < num_rows; ++h)
        for (int64_t t = 0; t < len; ++t) scores[h * stride + t] = softcap * tanhf(scores[h * stride + t] * inv);
}

/* Pass 2 over num_rows rows of scores (row pitch stride): soft-capping (softcap > 0), the padding
 * up to stride set to the last token's score (which leaves the max alone), then the softmax. */
static void normalize_rows(float *scores, int64_t num_rows, int64_t len, int64_t stride, float softcap,
                           const float *sinks) {
    if (softcap > 0.0f) softcap_rows(scores, num_rows, len, stride, softcap);
    for (int64_t h = 0; h < num_rows; ++h)
        for (int64_t t = len; t < stride; ++t) scores[h * stride + t] = scores[h * stride + len - 1];
    softmax_rows(scores, num_rows, len, stride, sinks);
}

/* q . k over head_dim, with two accumulators so consecutive FMAs do not wait on each other. */
static inline __attribute__((always_inline)) float dot(const float *restrict q, const void *restrict k,
                                                       const int64_t head_dim, const int kv_bf16) {
    vec acc0 = {0}, acc1 = {0};
    int64_t d = 0;
    for (; d + 2 * VL <= head_dim; d += 2 * VL) {
        acc0 += load(q + d) * load_kv(k, d, kv_bf16);
        acc1 += load(q + d + VL) * load_kv(k, d + VL, kv_bf16);
    }
    for (; d + VL <= head_dim; d += VL) acc0 += load(q + d) * load_kv(k, d, kv_bf16);
    float sum = sum_lanes(acc0 + acc1);
    for (; d < head_dim; ++d) sum += q[d] * kv_at(k, d, kv_bf16); /* head_dim % VL tail */
    return sum;
}

/* out[0, head_dim) += w * v. */
static inline __attribute__((always_inline)) void add_scaled(float *restrict out, float w, const void *restrict v,
                                                             const int64_t head_dim, const int kv_bf16) {
    const vec wv = splat(w);
    int64_t d = 0;
    for (; d + VL <= head_dim; d += VL) store(out + d, load(out + d) + wv * load_kv(v, d, kv_bf16));
    for (; d < head_dim; ++d) out[d] += w * kv_at(v, d, kv_bf16);
}

enum { KV_F32 = 0, KV_E4M3 = 1, KV_E5M2 = 2, KV_BF16 = 3 };

/* fp8 -> float32 by bit placement, 8 lanes at a time. The byte's exponent and mantissa bits, shifted
 * so the mantissa's top bit lands at float bit 22, read as a float32 whose exponent is too small by
 * 127 - bias (e4m3: bias 7, shift 20, factor 2^120; e5m2: bias 15, shift 21, factor 2^112); one
 * multiply fixes it, and fp8 subnormals land on float32 subnormals, so they come out right too.
 * Worked example (e4m3): 0x4C = 0 1001 100 -> bits 0x04C00000 = 1.5 * 2^-118, times 2^120 = 6.0,
 * and 6.0 = 1.5 * 2^(9 - 7). NaN/inf bytes never occur: writes saturate. */
typedef uint8_t bytes8 __attribute__((vector_size(8)));

static inline vec fp8_lanes(const uint8_t *p, int shift, float factor) {
    bytes8 b;
    memcpy(&b, p, sizeof b);
    const ivec x = __builtin_convertvector(b, ivec);
    const vec magnitude = (vec)((x & 0x7F) << shift) * factor;
    return (vec)((ivec)magnitude | ((x & 0x80) << 24));
}

/* row[0, n) = decoded bytes * scale. */
static void decode_fp8_row(float *restrict row, const uint8_t *restrict bytes, int64_t n, int kv_format,
                           float scale) {
    const int shift = kv_format == KV_E4M3 ? 20 : 21;
    const float factor = kv_format == KV_E4M3 ? 0x1p120f : 0x1p112f;
    int64_t i = 0;
    for (; i + VL <= n; i += VL) store(row + i, fp8_lanes(bytes + i, shift, factor) * scale);
    for (; i < n; ++i) {
        const int32_t x = bytes[i], bits = (x & 0x7F) << shift;
        float magnitude;
        memcpy(&magnitude, &bits, sizeof magnitude);
        row[i] = (x & 0x80 ? -magnitude : magnitude) * factor * scale;
    }
}

/* Where a token's K or V row is read from: the cache itself (float32, bfloat16), or `scratch`
 * after decoding its bytes (fp8). `offset` is in elements (bytes for fp8). */
typedef struct {
    const void *cache;
    float scale;
    int64_t row;
    float *scratch;
} RowSource;

/* kv_format is a constant after inlining, so each instance has no per-row branch on it. */
static inline __attribute__((always_inline)) const void *row_at(const RowSource *src, int64_t offset,
                                                                const int kv_format) {
    if (kv_format == KV_BF16) return (const uint16_t *)src->cache + offset;
    if (kv_format == KV_F32) return (const float *)src->cache + offset;
    decode_fp8_row(src->scratch, (const uint8_t *)src->cache + offset, src->row, kv_format, src->scale);
    return src->scratch;
}

/* Address of element `offset` of a row as row_at returns it (bfloat16, else float32). */
static inline __attribute__((always_inline)) const void *kv_element(const void *row, int64_t offset,
                                                                    const int kv_bf16) {
    return kv_bf16 ? (const void *)((const uint16_t *)row + offset) : (const void *)((const float *)row + offset);
}

/* The rows of tokens t0 .. t0 + 7 (a partial last block repeats token len - 1's row, so a pass always
 * takes 8 rows). */
static inline __attribute__((always_inline)) void block_rows(const void *rows[VL], const void *cache,
                                                             const int64_t *restrict offsets, int64_t t0, int64_t len,
                                                             const int kv_bf16) {
    for (int j = 0; j < VL; ++j) rows[j] = kv_element(cache, offsets[t0 + j < len ? t0 + j : len - 1], kv_bf16);
}

/* The slices of KV head kv in a block's 8 rows as float32: pointers into the cache (float32), or
 * into `widened` [8, head_dim] after one widening that every query head of the group then reads
 * (bfloat16: widening each slice once per query head was most of a long sequence's instructions). */
static inline __attribute__((always_inline)) void block_slices(const float *slices[VL], float *restrict widened,
                                                               const void *const rows[VL], int64_t column,
                                                               const int64_t head_dim, const int kv_bf16) {
    for (int j = 0; j < VL; ++j) {
        if (!kv_bf16) {
            slices[j] = (const float *)rows[j] + column;
            continue;
        }
        float *slice = widened + j * head_dim;
        int64_t d = 0;
        for (; d + VL <= head_dim; d += VL) store(slice + d, load_bf16((const uint16_t *)rows[j] + column + d));
        for (; d < head_dim; ++d) slice[d] = bf16_to_float(((const uint16_t *)rows[j])[column + d]);
        slices[j] = slice;
    }
}

/* Prefetch the KV heads kv_first .. kv_end - 1 (`bytes` of each row from `column`) of tokens
 * begin .. end - 1's rows into L1 (the rows a pass reads next; the next run's rows, further off, go to
 * L2: Ahead). Into L1 rather than L2, the engine's loop over 32 prompts (`aqueduct bench --serve`'s,
 * in process, 2-core Xeon VM with AMX, four alternated runs) took a median decode step of 30.8-33.7
 * against 31.7-38.7 ms. */
static void prefetch_rows(const void *cache, const int64_t *restrict offsets, int64_t begin, int64_t end,
                          int64_t column, int64_t bytes, const int kv_bf16) {
    for (int64_t t = begin; t < end; ++t) {
        const char *start = kv_element(cache, offsets[t] + column, kv_bf16);
        for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(start + b, 0, 3);
    }
}

/* Each pass asks for the rows ROLL tokens ahead of the block it computes, and a pass over rows
 * nothing fetched ahead (a task's first run; pass 3's V) first asks for its first ROLL tokens. A
 * sequence's blocks lie anywhere in the cache and each layer's K/V are read once a step, from
 * memory, so the passes would otherwise stall at each block's first lines. The earlier form asked
 * for the whole sequence's rows at once, before pass 1: for long sequences (600 tokens are 460 KB of
 * float32 K and as much V) most were evicted again before use. 2-core Zen 3 VM (C harness, 30
 * layers' calls, SmolLM2's 9 query / 3 KV heads, min of 6 alternated runs a call): one sequence of
 * 600 tokens, float32, 2 threads 115 -> 92 us; of 4000 tokens 721 -> 648 us; 32 sequences of 300
 * tokens 977 -> 929 us (float32), 650 -> 641 us (bfloat16). Ahead (below) still brings the next
 * run's rows a few per block; ROLL keeps a fixed distance in front within this run. */
enum { ROLL = 16 };

static inline void prefetch_rolling(const void *cache, const int64_t *restrict offsets, int64_t t0, int64_t len,
                                    int64_t column, int64_t bytes, const int kv_bf16) {
    if (t0 + ROLL < len)
        prefetch_rows(cache, offsets, t0 + ROLL, t0 + ROLL + VL < len ? t0 + ROLL + VL : len, column, bytes, kv_bf16);
}

/* The next run of units' K and V rows, prefetched a few tokens at a time while this run's passes
 * compute (prefetch_ahead, once per 8-token block of either pass, into L2): with a prefetch of each
 * sequence's whole rows before its passes alone, its reads and arithmetic took turns. Zen 4 VM, 30
 * layers' calls for 32 sequences of 280 tokens (bfloat16 / float32 cache): blocks scattered 28-31
 * -> 19 ms / 36-37 -> 24 ms, contiguous 18 -> 14-16 ms / 30-32 -> 20 ms. Larger tasks (fewer first
 * runs) gained nothing measurable. */
typedef struct {
    const char *keys, *values;    /* the caches, as bytes */
    const int64_t *offsets;       /* the next run's token rows, in elements */
    int64_t len, column, bytes;   /* tokens; its first KV head's element in a row; bytes a row */
    int64_t element_size, token;  /* token: the next one to prefetch */
    int64_t tokens_per_block;     /* spread over this run's two passes */
} Ahead;

static inline void prefetch_ahead(Ahead *ahead) {
    if (ahead == NULL) return;
    const int64_t end = ahead->token + ahead->tokens_per_block < ahead->len ? ahead->token + ahead->tokens_per_block
                                                                            : ahead->len;
    for (; ahead->token < end; ++ahead->token) {
        const int64_t at = (ahead->offsets[ahead->token] + ahead->column) * ahead->element_size;
        for (int64_t b = 0; b < ahead->bytes; b += 64) {
            __builtin_prefetch(ahead->keys + at + b, 0, 2);
            __builtin_prefetch(ahead->values + at + b, 0, 2);
        }
    }
}

/* Pass 1 for float32/bfloat16 caches, 8 tokens at a time: each query head's dot products with the
 * block's 8 K rows accumulate lane-wise, then sums_of_8 reduces them together and the 8 scores
 * are stored as one vector (scores rows are padded to a multiple of 8, so the store stays in the
 * row). A last, partial block repeats its last row: always 8 rows keeps the accumulators in
 * registers, and what lands past len is replaced by the padding afterwards. */
static inline __attribute__((always_inline)) void scores_in_blocks(
        float *restrict scores, const float *restrict q, const void *cache, const int64_t *restrict offsets,
        int64_t len, int64_t stride, int64_t group, int64_t kv_first, int64_t kv_end, const int64_t head_dim,
        float scale, float *restrict widened, Ahead *ahead, const int kv_bf16) {
    const int64_t span = (kv_end - kv_first) * head_dim * (kv_bf16 ? 2 : 4);
    for (int64_t t0 = 0; t0 < len; t0 += VL) {
        prefetch_ahead(ahead);
        prefetch_rolling(cache, offsets, t0, len, kv_first * head_dim, span, kv_bf16);
        const void *rows[VL];
        block_rows(rows, cache, offsets, t0, len, kv_bf16);
        for (int64_t kv = kv_first; kv < kv_end; ++kv) {
            const float *k[VL];
            block_slices(k, widened, rows, kv * head_dim, head_dim, kv_bf16);
            for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
                const float *qh = q + h * head_dim;
                vec acc[VL] = {{0}};
                int64_t d = 0;
                for (; d + VL <= head_dim; d += VL) {
                    const vec qd = load(qh + d);
                    for (int j = 0; j < VL; ++j) acc[j] += qd * load(k[j] + d);
                }
                vec sums = sums_of_8(acc);
                for (; d < head_dim; ++d) /* head_dim % VL tail */
                    for (int j = 0; j < VL; ++j) sums[j] += qh[d] * k[j][d];
                store(scores + h * stride + t0, sums * scale);
            }
        }
    }
}

/* Pass 3 for float32/bfloat16 caches: out_h += w[h][t] v_t, token by token in order as the generic
 * pass does (the same sums), but with up to 64 of out_h's floats held in registers over a block of
 * 8 tokens instead of loaded and stored once per token, and bfloat16 V widened once per block. Of
 * a partial last block only the rows before len are summed. Only elements d_first .. d_first +
 * width - 1 of each head (all of them: 0, head_dim): each element's sum is the same whichever
 * others a call computes beside it, so a head may be split between tasks (SplitCall below). */
static inline __attribute__((always_inline)) void weighted_sum_in_blocks(
        float *restrict out, const float *restrict scores, const void *cache, const int64_t *restrict offsets,
        int64_t len, int64_t stride, int64_t group, int64_t kv_first, int64_t kv_end, const int64_t head_dim,
        const int64_t d_first, const int64_t width, float *restrict widened, Ahead *ahead, const int kv_bf16) {
    enum { HELD = 8 }; /* vectors of out_h held at once */
    for (int64_t h = kv_first * group; h < kv_end * group; ++h)
        memset(out + h * head_dim + d_first, 0, sizeof(float) * width);
    const int64_t column = kv_first * head_dim + d_first;
    const int64_t span = ((kv_end - kv_first - 1) * head_dim + width) * (kv_bf16 ? 2 : 4);
    prefetch_rows(cache, offsets, 0, len < ROLL ? len : ROLL, column, span, kv_bf16);
    for (int64_t t0 = 0; t0 < len; t0 += VL) {
        prefetch_ahead(ahead);
        prefetch_rolling(cache, offsets, t0, len, column, span, kv_bf16);
        const int64_t n = len - t0 < VL ? len - t0 : VL;
        const void *rows[VL];
        block_rows(rows, cache, offsets, t0, len, kv_bf16);
        for (int64_t kv = kv_first; kv < kv_end; ++kv) {
            const float *v[VL];
            block_slices(v, widened, rows, kv * head_dim + d_first, width, kv_bf16);
            for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
                float *oh = out + h * head_dim + d_first;
                const float *w = scores + h * stride + t0;
                for (int64_t d = 0; d + VL <= width; d += HELD * VL) {
                    const int64_t count = (width - d) / VL < HELD ? (width - d) / VL : HELD;
                    vec o[HELD];
                    for (int64_t i = 0; i < count; ++i) o[i] = load(oh + d + i * VL);
                    for (int64_t j = 0; j < n; ++j) {
                        const vec wj = splat(w[j]);
                        for (int64_t i = 0; i < count; ++i) o[i] = fma_lanes(wj, load(v[j] + d + i * VL), o[i]);
                    }
                    for (int64_t i = 0; i < count; ++i) store(oh + d + i * VL, o[i]);
                }
                for (int64_t d = width / VL * VL; d < width; ++d) /* width % VL tail */
                    for (int64_t j = 0; j < n; ++j) oh[d] += w[j] * v[j][d];
            }
        }
    }
}

/* One sequence's KV heads kv_first .. kv_end - 1 and the query heads that read them: out, q
 * [num_heads, head_dim] (only those heads' rows are read and written); scores [num_heads, stride];
 * offsets [len]. Query heads h = kv * group + g share KV head kv (as HF's repeat_kv). */
static inline __attribute__((always_inline)) void attend_sequence(
        float *restrict out, const float *restrict q, const RowSource *keys, const RowSource *values,
        const int64_t *restrict offsets, int64_t len, int64_t stride, int64_t num_heads, int64_t num_kv_heads,
        int64_t kv_first, int64_t kv_end, const int64_t head_dim, float scale, float softcap, const float *sinks,
        float *restrict scores, float *restrict widened, Ahead *ahead, int prefetched, const int kv_format) {
    const int64_t group = num_heads / num_kv_heads, h_first = kv_first * group, h_end = kv_end * group;
    const int bf16 = kv_format == KV_BF16, in_place = kv_format == KV_F32 || kv_format == KV_BF16;
    /* fp8 rows are decoded into one scratch row just before use, so they go token by token. */
    if (in_place) {
        const int64_t span = (kv_end - kv_first) * head_dim * (bf16 ? 2 : 4);
        if (!prefetched) /* a task's first run: nothing fetched its first rows ahead */
            prefetch_rows(keys->cache, offsets, 0, len < ROLL ? len : ROLL, kv_first * head_dim, span, bf16);
        scores_in_blocks(scores, q, keys->cache, offsets, len, stride, group, kv_first, kv_end, head_dim, scale,
                         widened, ahead, bf16);
    } else {
        for (int64_t t = 0; t < len; ++t) {
            const void *k = row_at(keys, offsets[t], kv_format);
            for (int64_t h = h_first; h < h_end; ++h)
                scores[h * stride + t] = scale * dot(q + h * head_dim, kv_element(k, h / group * head_dim, bf16),
                                                     head_dim, bf16);
        }
    }
    float *own_scores = scores + h_first * stride;
    normalize_rows(own_scores, h_end - h_first, len, stride, softcap, sinks == NULL ? NULL : sinks + h_first);
    if (in_place) {
        weighted_sum_in_blocks(out, scores, values->cache, offsets, len, stride, group, kv_first, kv_end, head_dim,
                               0, head_dim, widened, ahead, bf16);
        return;
    }
    memset(out + h_first * head_dim, 0, sizeof(float) * (h_end - h_first) * head_dim);
    for (int64_t t = 0; t < len; ++t) {
        const void *v = row_at(values, offsets[t], kv_format);
        for (int64_t h = h_first; h < h_end; ++h)
            add_scaled(out + h * head_dim, scores[h * stride + t], kv_element(v, h / group * head_dim, bf16),
                       head_dim, bf16);
    }
}

/* BODY(HEAD_DIM, BF16) for head_dim and an in-place cache format (bf16: bfloat16, else float32), with
 * head_dim 64 and 128 as constants (attend_dispatch below says why). */
#define FOR_FORMAT_AND_HEAD_DIM(BODY, bf16, head_dim)                                                  \
    do {                                                                                               \
        if (bf16) {                                                                                    \
            if ((head_dim) == 64) BODY(64, 1); else if ((head_dim) == 128) BODY(128, 1); else BODY(head_dim, 1); \
        } else {                                                                                       \
            if ((head_dim) == 64) BODY(64, 0); else if ((head_dim) == 128) BODY(128, 0); else BODY(head_dim, 0); \
        }                                                                                              \
    } while (0)

/* One sequence, with head_dim and the cache format as compile-time constants for the common cases
 * (the compiler unrolls the head_dim loops and drops the other formats' branches). fp8 decoding
 * costs more than the loops, so its instances keep head_dim a variable. */
static void attend_dispatch(float *out, const float *q, const RowSource *keys, const RowSource *values,
                            const int64_t *offsets, int64_t len, int64_t stride, int64_t num_heads,
                            int64_t num_kv_heads, int64_t kv_first, int64_t kv_end, int64_t head_dim, float scale,
                            float softcap, const float *sinks, float *scores, float *widened, Ahead *ahead,
                            int prefetched, int kv_format) {
#define ATTEND(HEAD_DIM, FORMAT)                                                                       \
    attend_sequence(out, q, keys, values, offsets, len, stride, num_heads, num_kv_heads, kv_first, kv_end, \
                    HEAD_DIM, scale, softcap, sinks, scores, widened, ahead, prefetched, FORMAT)
#define ATTEND_IN_PLACE(HEAD_DIM, BF16) ATTEND(HEAD_DIM, (BF16) ? KV_BF16 : KV_F32)
    if (kv_format == KV_E4M3) ATTEND(head_dim, KV_E4M3);
    else if (kv_format == KV_E5M2) ATTEND(head_dim, KV_E5M2);
    else FOR_FORMAT_AND_HEAD_DIM(ATTEND_IN_PLACE, kv_format == KV_BF16, head_dim);
#undef ATTEND_IN_PLACE
#undef ATTEND
}

/* A call's work in threads.h's units (bytes of a read-bound product): the K and V bytes it reads, times
 * the query heads that share each KV head (each element read feeds that many dot products). Threads
 * only pay off for long contexts or many sequences. */
/* The first key position a sequence of len tokens attends to (its window's or chunk's first). */
static int64_t first_key(int64_t len, int64_t window, int64_t chunk) {
    if (chunk > 0) return (len - 1) / chunk * chunk;
    return window > 0 && len > window ? len - window : 0;
}

static int64_t kv_bytes_read(const int32_t *seq_lens, int64_t num_seqs, int64_t window, int64_t chunk, int64_t row,
                             int kv_format) {
    const int64_t element_size = kv_format == KV_F32 ? 4 : kv_format == KV_BF16 ? 2 : 1;
    int64_t tokens = 0;
    for (int64_t seq = 0; seq < num_seqs; ++seq)
        tokens += seq_lens[seq] - first_key(seq_lens[seq], window, chunk);
    return tokens * 2 * row * element_size;
}

typedef struct {
    void *out;
    const void *q;
    const void *key_cache, *value_cache;
    const int32_t *block_tables, *seq_lens;
    int64_t block_table_stride, num_heads, num_kv_heads, head_dim, block_size, max_stride, window, chunk;
    float scale, softcap, k_scale, v_scale;
    int kv_format, io_bf16, failed;
    const float *sinks; /* [num_heads] float32, or NULL */
} Call;

/* A task's run of units of one sequence: its KV heads kv_first .. kv_end - 1 and the len keys it
 * attends to, from position first. */
typedef struct {
    int64_t seq, kv_first, kv_end, first, len;
} Run;

/* The run that starts at `unit`, within units .. end - 1. */
static Run run_at(const Call *c, int64_t unit, int64_t end) {
    const int64_t seq = unit / c->num_kv_heads, kv_first = unit % c->num_kv_heads;
    const int64_t kv_end = end - seq * c->num_kv_heads < c->num_kv_heads ? end - seq * c->num_kv_heads
                                                                        : c->num_kv_heads;
    const int64_t last = c->seq_lens[seq], first = first_key(last, c->window, c->chunk);
    return (Run){seq, kv_first, kv_end, first, last - first};
}

/* Units begin .. end - 1, unit i = KV head i % num_kv_heads of sequence i / num_kv_heads, with
 * scratch buffers of their own (tasks run on any thread). A task's units cover whole sequences
 * except at its ends; splitting a sequence by KV head lets one long sequence use every thread. Each
 * head's arithmetic is the same however the heads are split, so results do not depend on threads.
 * Worked example (2 KV heads, units 1 .. 4): sequence 0 head 1, sequence 1 heads 0-1, sequence 2 head 0. */
static void attend_units(void *context, int64_t begin, int64_t end) {
    Call *c = context;
    const int64_t row = c->num_kv_heads * c->head_dim, width = c->num_heads * c->head_dim;
    const int64_t group = c->num_heads / c->num_kv_heads;
    const int fp8 = c->kv_format == KV_E4M3 || c->kv_format == KV_E5M2;
    float *scores = malloc(sizeof(float) * c->num_heads * c->max_stride);
    int64_t *offsets = malloc(sizeof(int64_t) * c->max_stride), *next_offsets = malloc(sizeof(int64_t) * c->max_stride);
    float *rows = fp8 ? malloc(sizeof(float) * 2 * row) : NULL; /* decoded K and V rows */
    float *q_out = c->io_bf16 ? malloc(sizeof(float) * 2 * width) : NULL; /* one sequence's q and out in float32 */
    const int bf16 = c->kv_format == KV_BF16;
    float *widened = bf16 ? malloc(sizeof(float) * VL * c->head_dim) : NULL; /* a block's K or V slices */
    if (scores == NULL || offsets == NULL || next_offsets == NULL || (fp8 && rows == NULL) || (c->io_bf16 && q_out == NULL) ||
        (bf16 && widened == NULL)) {
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
    } else {
        const RowSource keys = {c->key_cache, c->k_scale, row, rows};
        const RowSource values = {c->value_cache, c->v_scale, row, rows == NULL ? NULL : rows + row};
        const int in_place = c->kv_format == KV_F32 || c->kv_format == KV_BF16;
        const int64_t element_size = c->kv_format == KV_F32 ? 4 : 2;
        Run run = run_at(c, begin, end);
        offsets_of(offsets, c->block_tables + run.seq * c->block_table_stride, run.first, run.first + run.len,
                   c->block_size, row);
        for (int prefetched = 0;;) {
            const int64_t seq = run.seq, kv_first = run.kv_first, kv_end = run.kv_end, len = run.len;
            const int64_t stride = (len + VL - 1) / VL * VL, next_unit = seq * c->num_kv_heads + kv_end;
            /* The next run's rows, to be prefetched during this run's passes (2 x stride / VL blocks). */
            const Run next = next_unit < end ? run_at(c, next_unit, end) : (Run){0};
            if (next_unit < end)
                offsets_of(next_offsets, c->block_tables + next.seq * c->block_table_stride, next.first,
                           next.first + next.len, c->block_size, row);
            Ahead ahead = {(const char *)c->key_cache, (const char *)c->value_cache, next_offsets, next.len,
                           next.kv_first * c->head_dim, (next.kv_end - next.kv_first) * c->head_dim * element_size,
                           element_size, 0, (next.len + 2 * stride / VL - 1) / (2 * stride / VL)};
            /* The q and out elements of this unit range's query heads. */
            const int64_t first_element = kv_first * group * c->head_dim, end_element = kv_end * group * c->head_dim;
            const float *q = (const float *)c->q + seq * width;
            float *out = (float *)c->out + seq * width;
            if (c->io_bf16) {
                for (int64_t i = first_element; i < end_element; ++i)
                    q_out[i] = bf16_to_float(((const uint16_t *)c->q)[seq * width + i]);
                q = q_out;
                out = q_out + width;
            }
            attend_dispatch(out, q, &keys, &values, offsets, len, stride, c->num_heads, c->num_kv_heads, kv_first,
                            kv_end, c->head_dim, c->scale, c->softcap, c->sinks, scores, widened,
                            in_place && next_unit < end ? &ahead : NULL, prefetched, c->kv_format);
            if (c->io_bf16)
                for (int64_t i = first_element; i < end_element; ++i)
                    ((uint16_t *)c->out)[seq * width + i] = float_to_bf16(out[i]);
            if (next_unit >= end) break;
            int64_t *swap = offsets;
            offsets = next_offsets;
            next_offsets = swap;
            run = next;
            prefetched = in_place;
        }
    }
    free(scores);
    free(offsets);
    free(next_offsets);
    free(rows);
    free(q_out);
    free(widened);
}

/* Few units, long sequences (one sequence's 3 KV heads on 2 threads: one thread takes two units
 * while the other idles for a third of the call; one KV head: all on one thread): the passes run
 * as three parallel calls over the tokens instead. Pass 1 in slabs of a sequence's tokens (every
 * KV head of each row, read in address order), then each head's softmax, then pass 3 by KV head
 * and half of head_dim. Each score, each softmax and each output element is computed by the same
 * operations in the same order as in attend_units (weighted_sum_in_blocks sums an element over the
 * tokens in order whichever elements a task takes), so the outputs are bit for bit the same. */
enum { SPLIT_MIN_TOKENS = 512 }; /* shorter: the two extra handovers cost about what the idle thread does */

typedef struct {
    Call *c;
    const float *q;             /* [num_seqs, num_heads * head_dim] float32 */
    float *out;                 /* the same, float32 */
    float *scores;              /* [num_seqs, num_heads, max_stride] */
    int64_t *offsets;           /* [num_seqs, max_stride]: the rows of the keys each sequence attends to */
    int64_t *lens;              /* [num_seqs]: how many keys */
    int64_t *slab_starts;       /* [num_seqs + 1]: the pass-1 tasks before each sequence's */
    int64_t slab, slices;       /* tokens a pass-1 task; pass-3 tasks a KV head */
} SplitCall;

static void split_failed(SplitCall *s) { __atomic_store_n(&s->c->failed, 1, __ATOMIC_RELAXED); }

static void split_scores(void *context, int64_t begin, int64_t end) {
    SplitCall *s = context;
    const Call *c = s->c;
    const int bf16 = c->kv_format == KV_BF16;
    const int64_t head_dim = c->head_dim, group = c->num_heads / c->num_kv_heads;
    float *widened = bf16 ? malloc(sizeof(float) * VL * head_dim) : NULL;
    if (bf16 && widened == NULL) return split_failed(s);
    for (int64_t task = begin; task < end; ++task) {
        int64_t seq = 0;
        while (s->slab_starts[seq + 1] <= task) ++seq;
        const int64_t first = (task - s->slab_starts[seq]) * s->slab;
        const int64_t count = s->lens[seq] - first < s->slab ? s->lens[seq] - first : s->slab;
        float *scores = s->scores + seq * c->num_heads * c->max_stride + first;
        const int64_t *offsets = s->offsets + seq * c->max_stride + first;
        const float *q = s->q + seq * c->num_heads * head_dim;
        const int64_t row_bytes = c->num_kv_heads * head_dim * (bf16 ? 2 : 4);
        prefetch_rows(c->key_cache, offsets, 0, count < ROLL ? count : ROLL, 0, row_bytes, bf16);
#define SCORES(HEAD_DIM, BF16)                                                                         \
        scores_in_blocks(scores, q, c->key_cache, offsets, count, c->max_stride, group, 0, c->num_kv_heads, HEAD_DIM, \
                         c->scale, widened, NULL, BF16)
        FOR_FORMAT_AND_HEAD_DIM(SCORES, bf16, head_dim);
#undef SCORES
    }
    free(widened);
}

static void split_softmax(void *context, int64_t begin, int64_t end) {
    SplitCall *s = context;
    const Call *c = s->c;
    for (int64_t r = begin; r < end; ++r) { /* row r: head r % num_heads of sequence r / num_heads */
        const int64_t len = s->lens[r / c->num_heads], stride = (len + VL - 1) / VL * VL, h = r % c->num_heads;
        const float *sinks = c->sinks == NULL ? NULL : c->sinks + h;
        normalize_rows(s->scores + r * c->max_stride, 1, len, stride, c->softcap, sinks);
    }
}

static void split_sums(void *context, int64_t begin, int64_t end) {
    SplitCall *s = context;
    const Call *c = s->c;
    const int bf16 = c->kv_format == KV_BF16;
    const int64_t head_dim = c->head_dim, group = c->num_heads / c->num_kv_heads, width = head_dim / s->slices;
    float *widened = bf16 ? malloc(sizeof(float) * VL * head_dim) : NULL;
    if (bf16 && widened == NULL) return split_failed(s);
    for (int64_t task = begin; task < end; ++task) { /* slice task % slices of KV head unit % num_kv_heads ... */
        const int64_t unit = task / s->slices, seq = unit / c->num_kv_heads, kv = unit % c->num_kv_heads;
        const int64_t d_first = task % s->slices * width;
        float *out = s->out + seq * c->num_heads * head_dim;
        const float *scores = s->scores + seq * c->num_heads * c->max_stride;
        const int64_t *offsets = s->offsets + seq * c->max_stride;
#define SUMS(HEAD_DIM, BF16)                                                                           \
        weighted_sum_in_blocks(out, scores, c->value_cache, offsets, s->lens[seq], c->max_stride, group, kv, kv + 1, \
                               HEAD_DIM, d_first, width, widened, NULL, BF16)
        FOR_FORMAT_AND_HEAD_DIM(SUMS, bf16, head_dim);
#undef SUMS
    }
    free(widened);
}

/* The most keys any of the sequences attends to. */
static int64_t longest_keys(const int32_t *seq_lens, int64_t num_seqs, int64_t window, int64_t chunk) {
    int64_t longest = 0;
    for (int64_t seq = 0; seq < num_seqs; ++seq) {
        const int64_t len = seq_lens[seq] - first_key(seq_lens[seq], window, chunk);
        longest = len > longest ? len : longest;
    }
    return longest;
}

/* The call as SplitCall's three parallel calls; returns c->failed. */
static int attend_split(Call *c, int64_t num_seqs, int threads) {
    const int64_t width = c->num_heads * c->head_dim, row = c->num_kv_heads * c->head_dim;
    SplitCall s = {c, c->q, c->out, malloc(sizeof(float) * num_seqs * c->num_heads * c->max_stride),
                   malloc(sizeof(int64_t) * num_seqs * c->max_stride), malloc(sizeof(int64_t) * num_seqs),
                   malloc(sizeof(int64_t) * (num_seqs + 1)), 0, c->head_dim % (2 * VL) == 0 ? 2 : 1};
    float *q_out = c->io_bf16 ? malloc(sizeof(float) * 2 * num_seqs * width) : NULL; /* q and out in float32 */
    if (s.scores == NULL || s.offsets == NULL || s.lens == NULL || s.slab_starts == NULL ||
        (c->io_bf16 && q_out == NULL)) {
        c->failed = 1;
    } else {
        if (c->io_bf16) {
            for (int64_t i = 0; i < num_seqs * width; ++i) q_out[i] = bf16_to_float(((const uint16_t *)c->q)[i]);
            s.q = q_out;
            s.out = q_out + num_seqs * width;
        }
        int64_t total = 0;
        for (int64_t seq = 0; seq < num_seqs; ++seq) {
            const int64_t last = c->seq_lens[seq], first = first_key(last, c->window, c->chunk);
            s.lens[seq] = last - first;
            offsets_of(s.offsets + seq * c->max_stride, c->block_tables + seq * c->block_table_stride, first, last,
                       c->block_size, row);
            total += s.lens[seq];
        }
        /* About four slabs a thread, each a multiple of the 8-token block and at least 64 tokens. */
        const int64_t spread = (total + 4 * threads - 1) / (4 * threads);
        s.slab = spread < 64 ? 64 : (spread + VL - 1) / VL * VL;
        s.slab_starts[0] = 0;
        for (int64_t seq = 0; seq < num_seqs; ++seq)
            s.slab_starts[seq + 1] = s.slab_starts[seq] + (s.lens[seq] + s.slab - 1) / s.slab;
        pool_run(split_scores, &s, s.slab_starts[num_seqs], 1, threads);
        pool_run(split_softmax, &s, num_seqs * c->num_heads, 1, threads);
        pool_run(split_sums, &s, num_seqs * c->num_kv_heads * s.slices, 1, threads);
        if (c->io_bf16)
            for (int64_t i = 0; i < num_seqs * width; ++i) ((uint16_t *)c->out)[i] = float_to_bf16(s.out[i]);
    }
    free(s.scores);
    free(s.offsets);
    free(s.lens);
    free(s.slab_starts);
    free(q_out);
    return c->failed;
}

/* ---- Runs of prefill rows, in tiles ---------------------------------------------------------
 * A short float32 prefill comes here as one row per query token (groups.py's rows_as_sequences): rows
 * i, i + 1, ... of a sequence share its block table and attend to len, len + 1, ... keys. Row by row,
 * each row reads its whole prefix of K and V again (SmolLM2: 200 KB a layer for 256 keys, from L2),
 * one load per multiply-add. Such a run of rows is taken TILE_ROWS rows at a time instead: each block
 * of 8 K rows (then V rows) is read once per tile and multiplied into every query head of the tile's
 * rows, each load feeding three query heads (pass 1) or two (pass 3). Each score, softmax and output element is computed by the same
 * operations in the same order as row by row (scores_in_blocks, normalize_rows,
 * weighted_sum_in_blocks), so the results are bit for bit the same; rows of other sequences (decodes
 * in the same step) are tiles of one row. Only calls without windows or chunks (every row attends
 * from key 0), with float32 q, a float32 or bfloat16 cache and head_dim a multiple of 8 take this path.
 * 2-core Zen 4 VM, SmolLM2's heads, 8 prompts of 256 rows: 6.2-6.7 against 8.3-8.6 ms a call (one
 * thread 12.1-12.4 against 16.5-16.8); the batch benchmark's three float32 prefill steps (4,560 prompt
 * tokens, alternated runs): attention 0.53-0.62 against 0.69 s, the steps 5.58-5.73 against 5.75-5.79 s. */
enum { TILE_ROWS = 8 };

/* Whether row r + 1 continues row r's run: one key more, through the same blocks. */
static int continues_run(const Call *c, int64_t r) {
    if (c->seq_lens[r + 1] != c->seq_lens[r] + 1) return 0;
    const int64_t blocks = (c->seq_lens[r + 1] + c->block_size - 1) / c->block_size;
    return memcmp(c->block_tables + r * c->block_table_stride, c->block_tables + (r + 1) * c->block_table_stride,
                  sizeof(int32_t) * blocks) == 0;
}

typedef struct {
    Call *c;
    const int64_t *tile_first; /* [num_tiles + 1]: each tile's first row, then num_seqs */
} TileCall;

/* A tile's query heads: vector v = i * group + g is head kv * group + g of the tile's row i, with its
 * q and out (rows of [num_heads, head_dim]), its scores (a row of max_stride) and its keys. */
typedef struct {
    const float **q;
    float **out;
    int64_t *len;
    float *scores;
    int64_t group, kv, first_len, max_stride;
} Tile;

/* Pass 1 for query heads v .. v + n - 1 (n <= SCORE_HEADS) against the 8 K slices k: scores_in_blocks'
 * arithmetic for each, every K load feeding n multiply-adds. */
enum { SCORE_HEADS = 3 }; /* 24 accumulators of the 32 vector registers */

static inline __attribute__((always_inline)) void tile_block_scores(const Tile *t, int64_t v, const int n,
                                                                    const float *k[VL], int64_t t0,
                                                                    const int64_t head_dim, float scale) {
    vec acc[SCORE_HEADS][VL];
    for (int i = 0; i < n; ++i) /* not an initializer: GCC zeroed that with a call to memset */
        for (int j = 0; j < VL; ++j) acc[i][j] = (vec){0};
    int64_t d = 0;
    for (; d + VL <= head_dim; d += VL) {
        vec qd[SCORE_HEADS];
        for (int i = 0; i < n; ++i) qd[i] = load(t->q[v + i] + d);
        for (int j = 0; j < VL; ++j) {
            vec kd = load(k[j] + d);
            __asm__("" : "+v"(kd)); /* one load in a register for all n, not n folded loads */
            for (int i = 0; i < n; ++i) acc[i][j] = fma_lanes(qd[i], kd, acc[i][j]);
        }
    }
    for (int i = 0; i < n; ++i) {
        vec sums = sums_of_8(acc[i]);
        for (int64_t e = d; e < head_dim; ++e) /* head_dim % VL tail */
            for (int j = 0; j < VL; ++j) sums[j] += t->q[v + i][e] * k[j][e];
        store(t->scores + (v + i) * t->max_stride + t0, sums * scale);
    }
}

/* Pass 3 for query heads v0 and v1 (v1 < 0: v0 alone), n of the block's 8 V slices: weighted_sum_in_blocks'
 * arithmetic for each (out_h += w[t] v_t, token by token in order). */
static inline __attribute__((always_inline)) void tile_block_sums(const Tile *t, int64_t v0, int64_t v1,
                                                                  const float *v[VL], int64_t t0, int64_t n,
                                                                  const int64_t head_dim) {
    enum { HELD = 8 };
    float *o0 = t->out[v0], *o1 = t->out[v1 < 0 ? v0 : v1];
    const float *w0 = t->scores + v0 * t->max_stride + t0, *w1 = t->scores + (v1 < 0 ? v0 : v1) * t->max_stride + t0;
    for (int64_t d = 0; d + VL <= head_dim; d += HELD * VL) {
        const int64_t count = (head_dim - d) / VL < HELD ? (head_dim - d) / VL : HELD;
        vec a[HELD], b[HELD];
        for (int64_t i = 0; i < count; ++i) {
            a[i] = load(o0 + d + i * VL);
            b[i] = load(o1 + d + i * VL);
        }
        for (int64_t j = 0; j < n; ++j) {
            const vec w0j = splat(w0[j]), w1j = splat(w1[j]);
            for (int64_t i = 0; i < count; ++i) {
                vec vd = load(v[j] + d + i * VL);
                __asm__("" : "+v"(vd));
                a[i] = fma_lanes(w0j, vd, a[i]);
                if (v1 >= 0) b[i] = fma_lanes(w1j, vd, b[i]);
            }
        }
        for (int64_t i = 0; i < count; ++i) {
            store(o0 + d + i * VL, a[i]);
            if (v1 >= 0) store(o1 + d + i * VL, b[i]);
        }
    }
    for (int64_t d = head_dim / VL * VL; d < head_dim; ++d) /* head_dim % VL tail */
        for (int64_t j = 0; j < n; ++j) {
            o0[d] += w0[j] * v[j][d];
            if (v1 >= 0) o1[d] += w1[j] * v[j][d];
        }
}

/* The first of a tile's query heads whose row has keys past t0 (rows hold first_len, first_len + 1, ...
 * keys, so every later one does too). */
static inline int64_t first_vector_past(const Tile *t, int64_t t0) {
    return t0 < t->first_len ? 0 : (t0 - t->first_len + 1) * t->group;
}

/* Block t0's 8 slices of a KV head (at `column`, `span` bytes of each row), the rows ahead prefetched. */
static inline __attribute__((always_inline)) void tile_block(const float *slices[VL], float *restrict widened,
                                                             const void *cache, const int64_t *restrict offsets,
                                                             int64_t t0, int64_t len, int64_t column, int64_t span,
                                                             const int64_t head_dim, const int kv_bf16) {
    prefetch_rolling(cache, offsets, t0, len, column, span, kv_bf16);
    const void *rows[VL];
    block_rows(rows, cache, offsets, t0, len, kv_bf16);
    block_slices(slices, widened, rows, column, head_dim, kv_bf16);
}

/* One tile of `rows` rows against KV head t->kv: pass 1 over the longest row's keys (a row's query
 * heads skip the blocks past its own keys), pass 2 per query head, pass 3 as pass 1. */
static inline __attribute__((always_inline)) void attend_tile(const Tile *t, int64_t rows, const void *key_cache,
                                                              const void *value_cache, const int64_t *offsets,
                                                              const int64_t head_dim, float scale, float softcap,
                                                              const float *sinks, float *widened, const int kv_bf16) {
    const int64_t vectors = rows * t->group, len = t->first_len + rows - 1;
    const int64_t column = t->kv * head_dim, span = head_dim * (kv_bf16 ? 2 : 4);
    prefetch_rows(key_cache, offsets, 0, len < ROLL ? len : ROLL, column, span, kv_bf16);
    for (int64_t t0 = 0; t0 < len; t0 += VL) {
        const float *k[VL];
        tile_block(k, widened, key_cache, offsets, t0, len, column, span, head_dim, kv_bf16);
        int64_t v = first_vector_past(t, t0);
        for (; v + SCORE_HEADS <= vectors; v += SCORE_HEADS) tile_block_scores(t, v, SCORE_HEADS, k, t0, head_dim, scale);
        if (vectors - v == 2) tile_block_scores(t, v, 2, k, t0, head_dim, scale);
        else if (vectors - v == 1) tile_block_scores(t, v, 1, k, t0, head_dim, scale);
    }
    for (int64_t v = 0; v < vectors; ++v) {
        const int64_t own = t->len[v], h = t->kv * t->group + v % t->group;
        normalize_rows(t->scores + v * t->max_stride, 1, own, (own + VL - 1) / VL * VL, softcap,
                       sinks == NULL ? NULL : sinks + h);
        memset(t->out[v], 0, sizeof(float) * head_dim);
    }
    prefetch_rows(value_cache, offsets, 0, len < ROLL ? len : ROLL, column, span, kv_bf16);
    for (int64_t t0 = 0; t0 < len; t0 += VL) {
        const float *vs[VL];
        tile_block(vs, widened, value_cache, offsets, t0, len, column, span, head_dim, kv_bf16);
        int64_t v = first_vector_past(t, t0);
        /* Pairs of query heads with all 8 of the block's keys; a row whose keys end in the block alone. */
        for (; v < vectors; ++v) {
            const int64_t n = t->len[v] - t0 < VL ? t->len[v] - t0 : VL;
            if (n == VL && v + 1 < vectors && t->len[v + 1] - t0 >= VL) {
                tile_block_sums(t, v, v + 1, vs, t0, VL, head_dim);
                ++v;
            } else {
                tile_block_sums(t, v, -1, vs, t0, n, head_dim);
            }
        }
    }
}

static void attend_tile_dispatch(const Tile *t, int64_t rows, const Call *c, const int64_t *offsets,
                                 float *widened) {
#define TILE(HEAD_DIM, BF16)                                                                           \
    attend_tile(t, rows, c->key_cache, c->value_cache, offsets, HEAD_DIM, c->scale, c->softcap, c->sinks, widened, BF16)
    FOR_FORMAT_AND_HEAD_DIM(TILE, c->kv_format == KV_BF16, c->head_dim);
#undef TILE
}

/* Units begin .. end - 1, unit u = KV head u % num_kv_heads of tile u / num_kv_heads. */
static void attend_tile_units(void *context, int64_t begin, int64_t end) {
    const TileCall *tc = context;
    Call *c = tc->c;
    const int64_t group = c->num_heads / c->num_kv_heads, width = c->num_heads * c->head_dim;
    const int64_t row = c->num_kv_heads * c->head_dim;
    const int64_t most = TILE_ROWS * group; /* query heads a tile */
    float *scores = malloc(sizeof(float) * most * c->max_stride);
    int64_t *offsets = malloc(sizeof(int64_t) * c->max_stride), *lens = malloc(sizeof(int64_t) * most);
    const float **qs = malloc(sizeof(float *) * most);
    float **outs = malloc(sizeof(float *) * most);
    float *widened = c->kv_format == KV_BF16 ? malloc(sizeof(float) * VL * c->head_dim) : NULL;
    if (scores == NULL || offsets == NULL || lens == NULL || qs == NULL || outs == NULL ||
        (c->kv_format == KV_BF16 && widened == NULL)) {
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
    } else {
        int64_t offsets_of_tile = -1;
        for (int64_t unit = begin; unit < end; ++unit) {
            const int64_t tile = unit / c->num_kv_heads, first = tc->tile_first[tile];
            const int64_t rows = tc->tile_first[tile + 1] - first, last = first + rows - 1;
            if (offsets_of_tile != tile) { /* the tile's last row reads every block the others do */
                offsets_of(offsets, c->block_tables + last * c->block_table_stride, 0, c->seq_lens[last],
                           c->block_size, row);
                offsets_of_tile = tile;
            }
            const int64_t kv = unit % c->num_kv_heads;
            for (int64_t v = 0; v < rows * group; ++v) {
                const int64_t element = (first + v / group) * width + (kv * group + v % group) * c->head_dim;
                qs[v] = (const float *)c->q + element;
                outs[v] = (float *)c->out + element;
                lens[v] = c->seq_lens[first + v / group];
            }
            const Tile t = {qs, outs, lens, scores, group, kv, c->seq_lens[first], c->max_stride};
            attend_tile_dispatch(&t, rows, c, offsets, widened);
        }
    }
    free(scores);
    free(offsets);
    free(lens);
    free(qs);
    free(outs);
    free(widened);
}

/* The call in tiles where some row continues another's run (a prefill by rows): returns c->failed; -1
 * where no row does or the call is not one this path takes (the caller goes row by row). */
static int attend_runs(Call *c, int64_t num_seqs, int num_threads) {
    if (c->window > 0 || c->chunk > 0 || c->io_bf16 || (c->kv_format != KV_F32 && c->kv_format != KV_BF16) ||
        c->head_dim % VL != 0) /* a tail's scalar sums compiled to other roundings than the row path's */
        return -1;
    int64_t r = 0;
    while (r + 1 < num_seqs && !continues_run(c, r)) ++r;
    if (r + 1 >= num_seqs) return -1;
    int64_t *tile_first = malloc(sizeof(int64_t) * (num_seqs + 1));
    if (tile_first == NULL) return c->failed = 1;
    int64_t num_tiles = 0;
    for (int64_t first = 0; first < num_seqs; ++num_tiles) {
        tile_first[num_tiles] = first;
        int64_t rows = 1;
        while (rows < TILE_ROWS && first + rows < num_seqs && continues_run(c, first + rows - 1)) ++rows;
        first += rows;
    }
    tile_first[num_tiles] = num_seqs;
    const TileCall tc = {c, tile_first};
    const int64_t row = c->num_kv_heads * c->head_dim, units = num_tiles * c->num_kv_heads;
    const int64_t work = kv_bytes_read(c->seq_lens, num_seqs, 0, 0, row, c->kv_format) * (c->num_heads / c->num_kv_heads);
    const int threads = threads_for(work, units < num_threads ? (int)units : num_threads);
    pool_run(attend_tile_units, (void *)&tc, units, 1, threads);
    free(tile_first);
    return c->failed;
}

int paged_decode_attention(void *out, const void *q, const void *key_cache, const void *value_cache,
                           const int32_t *block_tables, int64_t block_table_stride, const int32_t *seq_lens,
                           int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                           int64_t block_size, float scale, int64_t max_seq_len, int64_t window, int64_t chunk,
                           float softcap, const float *sinks, int kv_format, float k_scale, float v_scale,
                           int io_bf16, int num_threads) {
    const int64_t row = num_kv_heads * head_dim;
    const int64_t max_stride = ((max_seq_len > 0 ? max_seq_len : 1) + VL - 1) / VL * VL;
    Call call = {out, q, key_cache, value_cache, block_tables, seq_lens, block_table_stride, num_heads,
                 num_kv_heads, head_dim, block_size, max_stride, window, chunk, scale, softcap, k_scale, v_scale,
                 kv_format, io_bf16, 0, sinks};
    const int by_tiles = attend_runs(&call, num_seqs, num_threads);
    if (by_tiles >= 0) return by_tiles;
    const int64_t work = kv_bytes_read(seq_lens, num_seqs, window, chunk, row, kv_format) * (num_heads / num_kv_heads);
    const int64_t units = num_seqs * num_kv_heads;
    const int split_threads = threads_for(work, num_threads);
    if (split_threads > 1 && units < 2 * split_threads && (kv_format == KV_F32 || kv_format == KV_BF16) &&
        longest_keys(seq_lens, num_seqs, window, chunk) >= SPLIT_MIN_TOKENS)
        return attend_split(&call, num_seqs, split_threads);
    const int threads = threads_for(work, units < num_threads ? (int)units : num_threads);
    /* Tasks of a few units each: scratch buffers are allocated once per task. */
    const int64_t grain = threads > 1 ? (units + 4 * threads - 1) / (4 * threads) : units;
    pool_run(attend_units, &call, units, grain, threads);
    return call.failed;
}
