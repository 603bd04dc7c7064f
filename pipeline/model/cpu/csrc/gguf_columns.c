/* GGUF's Q5_0, Q8_0, Q4_K, Q5_K and Q6_K weights in blocks of 16 output columns with integer
 * products, as the 4-bit kernel holds Q4_0/Q4_1 (int4_linear.c says why columns side by side):
 * each weight's integer q and its block's scales are the file's, only their order in memory changes.
 *
 * Layout of one block of 16 columns and one group of 32 inputs (gguf_columns.py writes it; padding
 * columns hold zeros):
 *   values: 4-bit types (all but Q8_0) 256 bytes, eight chunks of 32: chunk i's byte 2 c + h holds
 *     the low 4 bits of column c's q[2 i + h] in its low half and of q[2 i + h + 16] in its high
 *     half, as int4_linear.c. Q8_0: 512 bytes, sixteen chunks: chunk i's byte 2 c + h = q[2 i + h].
 *   high: the bits above the fourth, per chunk one little-endian uint32 mask per bit and half:
 *     bit 2 c + h of mask (half, bit) is bit 4 + bit of q[2 i + h + 16 half]. Q5_0 and Q5_K: 8 bytes
 *     a chunk (half 0, half 1); Q6_K: 16 (bit 4 of half 0, of half 1, bit 5 of half 0, of half 1).
 *     Worked example: q[3] = 21 of column 5 is 0b10101: chunk 1's byte 11 has low nibble 5, and bit
 *     11 of chunk 1's first mask is set.
 *   scales, float16 `halves` and 8-bit `bytes`:
 *     Q5_0, Q8_0: halves [groups, 16] d;                         w = d (q - 16) or q d
 *     Q4_K, Q5_K: halves [supers, 2, 16] (d, dmin) per 256 inputs, bytes [groups, 2, 16] unsigned
 *                 (sc, m):                                        w = (d sc) q - dmin m
 *     Q6_K:       halves [supers, 16] d, bytes [groups, 2, 16] signed sc of the group's two
 *                 sub-blocks of 16 inputs:                       w = (d sc) (q - 32)
 *
 * The products: each group of 32 inputs of x is quantized to int16 with one scale (quantized_inputs.h);
 * lane c sums column c's q times x_q for inputs 0-15 (`low`) and 16-31 (`high`) of the group in 32-bit
 * integers, exactly. The offsets (q - 16, q - 32) come off as integers too: 16 times the group's sum
 * of x_q (Q5_0), 32 times each half's (Q6_K). Per group, per column, in float32: Q5_0/Q8_0 acc += float(low + high) * (d * xs); Q4_K/Q5_K
 * acc += float(low + high) * (d sc * xs) then acc -= dmin m * sum(x); Q6_K acc += float(low) * (d sc0 *
 * xs) then acc += float(high) * (d sc1 * xs), each a fused multiply-add. Integer sums are exact in any
 * order and the float steps are the same for every row count and path (AVX-512, portable C), so a
 * row's result is bit for bit the same whatever else shares the call.
 *
 * Dequantized (many rows multiply faster by the plain matrix), each weight is the float32 value gguf-py
 * gives, by gguf_blocks.h's operations.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "column_blocks.h"
#include "gguf_columns.h"
#include "threads.h"

enum { Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };
#define SUPER 256 /* inputs per K-quant super-block */

int gguf_columns_known(int64_t type) {
    return type == Q5_0 || type == Q8_0 || type == Q4_K || type == Q5_K || type == Q6_K;
}

static int value_bytes(int type) { return type == Q8_0 ? 512 : 256; }
static int high_bytes(int type) { return type == Q6_K ? 128 : type == Q5_0 || type == Q5_K ? 64 : 0; }
static int group_inputs(int type) { return type == Q4_K || type == Q5_K || type == Q6_K ? SUPER : GROUP; }

typedef struct {
    void *y;
    const QuantizedRows *x;
    const int32_t *x_sums; /* [rows, groups, 2]: the group's x_q summed over inputs 0-15 and 16-31 */
    const ColumnSegment *s;
    const float *bias; /* the layer's, indexed from y_offset */
    int64_t rows, in_features, y_stride, y_offset;
    int io_bf16;
} Problem;

static void store_block(const Problem *p, int64_t m, int64_t b, const float *sums) {
    const int64_t first = b * BLOCK, count = p->s->out_features - first < BLOCK ? p->s->out_features - first : BLOCK;
    for (int64_t c = 0; c < count; c++) {
        const int64_t column = p->y_offset + first + c;
        store_output(p->y, p->io_bf16, m * p->y_stride + column, sums[c] + (p->bias ? p->bias[column] : 0.0f));
    }
}

/* The value of column c's q[2 i + h + 16 half] in block b, group g (portable: one weight at a time). */
static int q_value(const ColumnSegment *s, int64_t groups, int64_t b, int64_t g, int i, int c, int h, int half) {
    const int64_t at = b * groups + g;
    if (s->type == Q8_0) return (int8_t)s->values[at * 512 + 32 * (i + 8 * half) + 2 * c + h];
    const uint8_t byte = s->values[at * 256 + 32 * i + 2 * c + h];
    int q = half ? byte >> 4 : byte & 0x0F;
    const int bits = high_bytes(s->type) / 64;
    for (int bit = 0; bit < bits; bit++) {
        uint32_t mask;
        memcpy(&mask, s->high + at * high_bytes(s->type) + 4 * (i * 2 * bits + 2 * bit + half), sizeof mask);
        q |= (int)((mask >> (2 * c + h)) & 1) << (4 + bit);
    }
    return q;
}

/* Group g's per-column float scales: d (or d sc) for each half, and (K-quants) the min dmin m. */
typedef struct {
    float d[2][BLOCK], min[BLOCK];
} GroupScales;

static void group_scales(const ColumnSegment *s, int64_t in_features, int64_t b, int64_t g, GroupScales *out) {
    const int64_t groups = in_features / GROUP, supers = in_features / SUPER, super = g / (SUPER / GROUP);
    for (int c = 0; c < BLOCK; c++) {
        out->min[c] = 0.0f;
        if (s->type == Q5_0 || s->type == Q8_0) {
            out->d[0][c] = out->d[1][c] = half_to_float(s->halves[(b * groups + g) * BLOCK + c]);
        } else if (s->type == Q6_K) {
            const float d = half_to_float(s->halves[(b * supers + super) * BLOCK + c]);
            const int8_t *sc = (const int8_t *)s->bytes + (b * groups + g) * 2 * BLOCK;
            out->d[0][c] = d * (float)sc[c];
            out->d[1][c] = d * (float)sc[BLOCK + c];
        } else {
            const uint16_t *halves = s->halves + (b * supers + super) * 2 * BLOCK;
            const uint8_t *bytes = s->bytes + (b * groups + g) * 2 * BLOCK;
            out->d[0][c] = out->d[1][c] = half_to_float(halves[c]) * (float)bytes[c];
            out->min[c] = half_to_float(halves[BLOCK + c]) * (float)bytes[BLOCK + c];
        }
    }
}

/* Integer offset subtracted from q: Q5_0's 16, Q6_K's 32 (the others keep q, or a float min). */
static int q_offset(int type) { return type == Q5_0 ? 16 : type == Q6_K ? 32 : 0; }

typedef void (*block_fn)(const Problem *, int64_t, int64_t);

#if defined(COLUMN_BLOCKS_AVX512)

static inline __m512i masked_bits(__m512i v, const uint8_t *masks, int index, int value) {
    uint32_t bits;
    memcpy(&bits, masks + 4 * index, sizeof bits);
    return _mm512_mask_add_epi16(v, (__mmask32)bits, v, _mm512_set1_epi16((short)value));
}

/* group_scales' values for 16 columns at once, by the same float32 products. */
static inline __attribute__((always_inline)) void vector_scales(const ColumnSegment *s, int64_t in_features,
                                                                int64_t b, int64_t g, const int TYPE, __m512 *d0,
                                                                __m512 *d1, __m512 *mins) {
    const int64_t groups = in_features / GROUP, supers = in_features / SUPER, super = g / (SUPER / GROUP);
    *mins = _mm512_setzero_ps();
    if (TYPE == Q5_0 || TYPE == Q8_0) {
        *d0 = *d1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s->halves + (b * groups + g) * BLOCK)));
        return;
    }
    const uint8_t *bytes = s->bytes + (b * groups + g) * 2 * BLOCK;
    const __m128i first = _mm_loadu_si128((const __m128i *)bytes), second = _mm_loadu_si128((const __m128i *)(bytes + BLOCK));
    if (TYPE == Q6_K) {
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s->halves + (b * supers + super) * BLOCK)));
        *d0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(first)));
        *d1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(second)));
        return;
    }
    const uint16_t *halves = s->halves + (b * supers + super) * 2 * BLOCK;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)halves));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(halves + BLOCK)));
    *d0 = *d1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(first)));
    *mins = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(second)));
}

/* Rows first .. first + M - 1 of block b; TYPE and M are constants where this is inlined. */
static inline __attribute__((always_inline)) void columns_block(const Problem *p, int64_t first, int64_t b,
                                                                const int M, const int TYPE) {
    const ColumnSegment *s = p->s;
    const int64_t groups = p->in_features / GROUP, vbytes = value_bytes(TYPE), hbytes = high_bytes(TYPE);
    const int bits = hbytes / 64, chains = M <= 2 ? 2 : 1;
    const __m512i low_mask = _mm512_set1_epi16(0x0F);
    __m512 acc[M];
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *values = s->values + (b * groups + g) * vbytes;
        const uint8_t *high = hbytes ? s->high + (b * groups + g) * hbytes : NULL;
        __m512i dot[M][2][2]; /* [row][half][chain] */
        for (int m = 0; m < M; m++)
            for (int h = 0; h < 2; h++) dot[m][h][0] = dot[m][h][1] = _mm512_setzero_si512();
        if (TYPE == Q8_0) {
            for (int i = 0; i < 16; i++) {
                const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(values + 32 * i)));
                for (int m = 0; m < M; m++) {
                    const int16_t *xq = p->x->x_q + ((first + m) * groups + g) * GROUP;
                    __m512i *d = &dot[m][i / 8][i % chains];
                    *d = pair_dot(*d, w, _mm512_set1_epi32(x_pair(xq, 2 * i)));
                }
            }
        } else {
            for (int i = 0; i < 8; i++) {
                const __m512i wide = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(values + 32 * i)));
                __m512i low = _mm512_and_si512(wide, low_mask), hi = _mm512_srli_epi16(wide, 4);
                for (int bit = 0; bit < bits; bit++) {
                    low = masked_bits(low, high, i * 2 * bits + 2 * bit, 16 << bit);
                    hi = masked_bits(hi, high, i * 2 * bits + 2 * bit + 1, 16 << bit);
                }
                for (int m = 0; m < M; m++) {
                    const int16_t *xq = p->x->x_q + ((first + m) * groups + g) * GROUP;
                    __m512i *d0 = &dot[m][0][i % chains], *d1 = &dot[m][1][i % chains];
                    *d0 = pair_dot(*d0, low, _mm512_set1_epi32(x_pair(xq, 2 * i)));
                    *d1 = pair_dot(*d1, hi, _mm512_set1_epi32(x_pair(xq, 2 * i + 16)));
                }
            }
        }
        __m512 d0, d1, mins;
        vector_scales(s, p->in_features, b, g, TYPE, &d0, &d1, &mins);
        for (int m = 0; m < M; m++) {
            const int64_t at = (first + m) * groups + g;
            const __m512 xs = _mm512_set1_ps(p->x->scales[at]);
            __m512i low = _mm512_add_epi32(dot[m][0][0], dot[m][0][1]), hi = _mm512_add_epi32(dot[m][1][0], dot[m][1][1]);
            if (TYPE == Q6_K) {
                low = _mm512_sub_epi32(low, _mm512_set1_epi32(32 * p->x_sums[2 * at]));
                hi = _mm512_sub_epi32(hi, _mm512_set1_epi32(32 * p->x_sums[2 * at + 1]));
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(low), _mm512_mul_ps(d0, xs), acc[m]);
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_mul_ps(d1, xs), acc[m]);
                continue;
            }
            __m512i total = _mm512_add_epi32(low, hi);
            if (TYPE == Q5_0)
                total = _mm512_sub_epi32(total, _mm512_set1_epi32(16 * (p->x_sums[2 * at] + p->x_sums[2 * at + 1])));
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_mul_ps(d0, xs), acc[m]);
            if (TYPE == Q4_K || TYPE == Q5_K)
                acc[m] = _mm512_fnmadd_ps(mins, _mm512_set1_ps(p->x->sums[at]), acc[m]);
        }
    }
    for (int m = 0; m < M; m++) {
        float sums[BLOCK];
        _mm512_storeu_ps(sums, acc[m]);
        store_block(p, first + m, b, sums);
    }
}

#define DEFINE_TYPE_BLOCKS(NAME, TYPE)                                                                 \
    static void NAME##_1(const Problem *p, int64_t f, int64_t b) { columns_block(p, f, b, 1, TYPE); } \
    static void NAME##_2(const Problem *p, int64_t f, int64_t b) { columns_block(p, f, b, 2, TYPE); } \
    static void NAME##_3(const Problem *p, int64_t f, int64_t b) { columns_block(p, f, b, 3, TYPE); } \
    static void NAME##_4(const Problem *p, int64_t f, int64_t b) { columns_block(p, f, b, 4, TYPE); } \
    static void NAME##_5(const Problem *p, int64_t f, int64_t b) { columns_block(p, f, b, 5, TYPE); } \
    static void NAME##_6(const Problem *p, int64_t f, int64_t b) { columns_block(p, f, b, 6, TYPE); } \
    static void NAME##_7(const Problem *p, int64_t f, int64_t b) { columns_block(p, f, b, 7, TYPE); } \
    static void NAME##_8(const Problem *p, int64_t f, int64_t b) { columns_block(p, f, b, 8, TYPE); } \
    static const block_fn NAME[ROWS_PER_PASS] = {NAME##_1, NAME##_2, NAME##_3, NAME##_4,               \
                                                 NAME##_5, NAME##_6, NAME##_7, NAME##_8};

DEFINE_TYPE_BLOCKS(Q5_0_BLOCKS, Q5_0)
DEFINE_TYPE_BLOCKS(Q8_0_BLOCKS, Q8_0)
DEFINE_TYPE_BLOCKS(Q4_K_BLOCKS, Q4_K)
DEFINE_TYPE_BLOCKS(Q5_K_BLOCKS, Q5_K)
DEFINE_TYPE_BLOCKS(Q6_K_BLOCKS, Q6_K)
#define ROWS_AT_ONCE ROWS_PER_PASS

static const block_fn *blocks_for(int type) {
    switch (type) {
    case Q5_0: return Q5_0_BLOCKS;
    case Q8_0: return Q8_0_BLOCKS;
    case Q4_K: return Q4_K_BLOCKS;
    case Q5_K: return Q5_K_BLOCKS;
    default: return Q6_K_BLOCKS;
    }
}

#else /* portable (also where only AVX2 is: gguf_columns_fast says so and layers keep the file's rows) */

/* One row of block b: the same integer sums and float steps as the vector path, one lane at a time. */
static void portable_block(const Problem *p, int64_t m, int64_t b) {
    const ColumnSegment *s = p->s;
    const int64_t groups = p->in_features / GROUP;
    const int offset = q_offset((int)s->type);
    float sums[BLOCK] = {0};
    for (int64_t g = 0; g < groups; g++) {
        const int64_t at = m * groups + g;
        const int16_t *xq = p->x->x_q + at * GROUP;
        const float xs = p->x->scales[at];
        GroupScales k;
        group_scales(s, p->in_features, b, g, &k);
        for (int c = 0; c < BLOCK; c++) {
            int32_t dot[2] = {0, 0};
            for (int half = 0; half < 2; half++)
                for (int i = 0; i < 8; i++)
                    for (int h = 0; h < 2; h++)
                        dot[half] += q_value(s, groups, b, g, i, c, h, half) * xq[2 * i + h + 16 * half];
            if (s->type == Q6_K) {
                sums[c] = fmaf((float)(dot[0] - offset * p->x_sums[2 * at]), k.d[0][c] * xs, sums[c]);
                sums[c] = fmaf((float)(dot[1] - offset * p->x_sums[2 * at + 1]), k.d[1][c] * xs, sums[c]);
                continue;
            }
            const int32_t total = dot[0] + dot[1] - offset * (p->x_sums[2 * at] + p->x_sums[2 * at + 1]);
            sums[c] = fmaf((float)total, k.d[0][c] * xs, sums[c]);
            if (s->type == Q4_K || s->type == Q5_K) sums[c] = fmaf(-k.min[c], p->x->sums[at], sums[c]);
        }
    }
    store_block(p, m, b, sums);
}
static const block_fn PORTABLE[1] = {portable_block};
#define ROWS_AT_ONCE 1
static const block_fn *blocks_for(int type) {
    (void)type;
    return PORTABLE;
}
#endif

int gguf_columns_fast(void) {
#if defined(COLUMN_BLOCKS_AVX512)
    return 1;
#else
    return 0;
#endif
}

static void run_blocks(void *context, int64_t begin, int64_t end) {
    const Problem *p = (const Problem *)context;
    const block_fn *functions = blocks_for((int)p->s->type);
    const int64_t full_passes = p->rows / ROWS_AT_ONCE, rest = p->rows % ROWS_AT_ONCE;
    for (int64_t b = begin; b < end; b++) {
        for (int64_t pass = 0; pass < full_passes; pass++) functions[ROWS_AT_ONCE - 1](p, pass * ROWS_AT_ONCE, b);
        if (rest) functions[rest - 1](p, full_passes * ROWS_AT_ONCE, b);
    }
}

int32_t *gguf_columns_x_sums(const QuantizedRows *x, int64_t rows, int64_t in_features) {
    const int64_t halves = rows * in_features / 16;
    int32_t *sums = malloc(sizeof(int32_t) * (halves > 0 ? halves : 1));
    if (!sums) return NULL;
    for (int64_t h = 0; h < halves; h++) {
        int32_t total = 0;
        for (int j = 0; j < 16; j++) total += x->x_q[16 * h + j];
        sums[h] = total;
    }
    return sums;
}

int gguf_columns_fits(const ColumnSegment *s, int64_t in_features) {
    return gguf_columns_known(s->type) && in_features % group_inputs((int)s->type) == 0;
}

void gguf_columns_linear(void *y, const QuantizedRows *x, const int32_t *x_sums, const ColumnSegment *s,
                         const float *bias, int64_t rows, int64_t in_features, int64_t y_stride, int64_t y_offset,
                         int io_bf16, int num_threads) {
    Problem p = {y, x, x_sums, s, bias, rows, in_features, y_stride, y_offset, io_bf16};
    const int64_t blocks = blocks_of(s->out_features), passes = (rows + ROWS_AT_ONCE - 1) / ROWS_AT_ONCE;
    const int threads = threads_for(s->out_features * in_features * 2 * passes, num_threads);
    pool_run(run_blocks, &p, blocks, columns_per_task(blocks, threads, BLOCKS_PER_TASK), threads);
}

/* Dequantized: rows [0, out_features) of the segment into out [out_features, in_features]. */
typedef struct {
    void *out;
    const ColumnSegment *s;
    int64_t in_features;
    int out_bf16, portable;
} Dequantize;

/* gguf_blocks.h's value for one weight, from its q and its group's scales. */
static float weight_value(int type, int q, float d, float min) {
    switch (type) {
    case Q5_0: return d * (float)(q - 16);
    case Q8_0: return (float)q * d;
    case Q6_K: return d * (float)(q - 32);
    default: return d * (float)q - min; /* Q4_K, Q5_K */
    }
}

/* Block b, group g's q as [column][input], the layout's bytes read once (whole chunks and masks, not
 * weight by weight as q_value does). */
static void unpack_group(const ColumnSegment *s, int64_t groups, int64_t b, int64_t g, int8_t q[BLOCK][GROUP]) {
    const int64_t at = b * groups + g;
    if (s->type == Q8_0) {
        const int8_t *values = (const int8_t *)s->values + at * 512;
        for (int i = 0; i < 16; i++)
            for (int c = 0; c < BLOCK; c++)
                for (int h = 0; h < 2; h++) q[c][2 * i + h] = values[32 * i + 2 * c + h];
        return;
    }
    const uint8_t *values = s->values + at * 256;
    for (int i = 0; i < 8; i++)
        for (int c = 0; c < BLOCK; c++)
            for (int h = 0; h < 2; h++) {
                const uint8_t byte = values[32 * i + 2 * c + h];
                q[c][2 * i + h] = (int8_t)(byte & 0x0F);
                q[c][2 * i + h + 16] = (int8_t)(byte >> 4);
            }
    const int bits = high_bytes((int)s->type) / 64;
    const uint8_t *high = bits ? s->high + at * high_bytes((int)s->type) : NULL;
    for (int i = 0; i < 8 && bits; i++)
        for (int bit = 0; bit < bits; bit++)
            for (int half = 0; half < 2; half++) {
                uint32_t mask;
                memcpy(&mask, high + 4 * (i * 2 * bits + 2 * bit + half), sizeof mask);
                for (int c = 0; c < BLOCK; c++)
                    for (int h = 0; h < 2; h++)
                        q[c][2 * i + h + 16 * half] |= (int8_t)(((mask >> (2 * c + h)) & 1) << (4 + bit));
            }
}

#if defined(COLUMN_BLOCKS_AVX512)
/* 16 weights (one column, one half group) of floats into out as float32 or bfloat16 (bf16.h's rounding). */
static inline void store_weights(void *out, int64_t at, __m512 w, int out_bf16) {
    if (!out_bf16) {
        _mm512_storeu_ps((float *)out + at, w);
        return;
    }
    const __m512i bits = _mm512_castps_si512(w);
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF),
                                                _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1)))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)),
                                                  _mm512_set1_epi32(0x7F800000));
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
    _mm256_storeu_si256((__m256i *)((uint16_t *)out + at), _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet)));
}

/* As dequantize_blocks below, the AVX-512 way: a group's chunks widened as the kernel widens them
 * (lane 2 c + h of chunk i's vector = column c's q[2 i + h (+ 16)]), stored, and gathered back a column
 * at a time (8 pairs of 16 bits, 16 weights); then weight_value's float operations on 16 at once. */
static void dequantize_blocks_vector(const Dequantize *c, int64_t begin, int64_t end) {
    const ColumnSegment *s = c->s;
    const int type = (int)s->type, offset = q_offset(type);
    const int64_t groups = c->in_features / GROUP, hbytes = high_bytes(type);
    const int bits = (int)(hbytes / 64);
    const __m256i chunk_stride = _mm256_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112); /* uint32s between chunks */
    for (int64_t b = begin; b < end; b++)
        for (int64_t g = 0; g < groups; g++) {
            uint32_t lanes[2][8][BLOCK]; /* [half][chunk][column]: a column's pair of 16-bit q */
            if (type == Q8_0) {
                const uint8_t *values = s->values + (b * groups + g) * 512;
                for (int i = 0; i < 16; i++)
                    _mm512_storeu_si512(lanes[i / 8][i % 8],
                                        _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(values + 32 * i))));
            } else {
                const uint8_t *values = s->values + (b * groups + g) * 256;
                const uint8_t *high = hbytes ? s->high + (b * groups + g) * hbytes : NULL;
                for (int i = 0; i < 8; i++) {
                    const __m512i wide = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(values + 32 * i)));
                    __m512i low = _mm512_and_si512(wide, _mm512_set1_epi16(0x0F)), hi = _mm512_srli_epi16(wide, 4);
                    for (int bit = 0; bit < bits; bit++) {
                        low = masked_bits(low, high, i * 2 * bits + 2 * bit, 16 << bit);
                        hi = masked_bits(hi, high, i * 2 * bits + 2 * bit + 1, 16 << bit);
                    }
                    _mm512_storeu_si512(lanes[0][i], low);
                    _mm512_storeu_si512(lanes[1][i], hi);
                }
            }
            __m512 d0, d1, mins;
            vector_scales(s, c->in_features, b, g, type, &d0, &d1, &mins);
            float d[2][BLOCK], min[BLOCK];
            _mm512_storeu_ps(d[0], d0);
            _mm512_storeu_ps(d[1], d1);
            _mm512_storeu_ps(min, mins);
            for (int column = 0; column < BLOCK && b * BLOCK + column < s->out_features; column++)
                for (int half = 0; half < 2; half++) {
                    const __m256i pairs = _mm256_i32gather_epi32((const int *)&lanes[half][0][column], chunk_stride, 4);
                    __m512i q = _mm512_cvtepi16_epi32(pairs);
                    if (offset) q = _mm512_sub_epi32(q, _mm512_set1_epi32(offset));
                    const __m512 qf = _mm512_cvtepi32_ps(q), scale = _mm512_set1_ps(d[half][column]);
                    __m512 w;
                    if (type == Q8_0)
                        w = _mm512_mul_ps(qf, scale);
                    else if (type == Q4_K || type == Q5_K)
                        w = _mm512_sub_ps(_mm512_mul_ps(scale, qf), _mm512_set1_ps(min[column]));
                    else
                        w = _mm512_mul_ps(scale, qf);
                    store_weights(c->out, (b * BLOCK + column) * c->in_features + g * GROUP + 16 * half, w, c->out_bf16);
                }
        }
}
#endif

static void dequantize_blocks(void *context, int64_t begin, int64_t end) {
    const Dequantize *c = (const Dequantize *)context;
#if defined(COLUMN_BLOCKS_AVX512)
    if (!c->portable) {
        dequantize_blocks_vector(c, begin, end);
        return;
    }
#endif
    const int64_t groups = c->in_features / GROUP;
    const int type = (int)c->s->type;
    for (int64_t b = begin; b < end; b++)
        for (int64_t g = 0; g < groups; g++) {
            GroupScales k;
            int8_t q[BLOCK][GROUP];
            group_scales(c->s, c->in_features, b, g, &k);
            unpack_group(c->s, groups, b, g, q);
            for (int column = 0; column < BLOCK && b * BLOCK + column < c->s->out_features; column++) {
                float w[GROUP];
                for (int j = 0; j < GROUP; j++) w[j] = weight_value(type, q[column][j], k.d[j / 16][column], k.min[column]);
                const int64_t at = (b * BLOCK + column) * c->in_features + g * GROUP;
                if (c->out_bf16)
                    for (int j = 0; j < GROUP; j++) ((uint16_t *)c->out)[at + j] = float_to_bf16(w[j]);
                else
                    memcpy((float *)c->out + at, w, sizeof w);
            }
        }
}

void gguf_columns_dequantize(void *out, const ColumnSegment *s, int64_t in_features, int out_bf16, int portable,
                             int num_threads) {
    Dequantize context = {out, s, in_features, out_bf16, portable};
    const int64_t blocks = blocks_of(s->out_features);
    const int threads = threads_for(s->out_features * in_features * 2, num_threads);
    pool_run(dequantize_blocks, &context, blocks, columns_per_task(blocks, threads, BLOCKS_PER_TASK), threads);
}

/* Row `row` of the segment (column `row` of its blocks) as float32 into out [in_features]: an
 * embedding's lookup, a few rows a step, so one weight at a time. */
void gguf_columns_row(float *out, const ColumnSegment *s, int64_t in_features, int64_t row) {
    const int64_t groups = in_features / GROUP, b = row / BLOCK;
    const int column = (int)(row % BLOCK), type = (int)s->type;
    for (int64_t g = 0; g < groups; g++) {
        GroupScales k;
        group_scales(s, in_features, b, g, &k);
        for (int half = 0; half < 2; half++)
            for (int i = 0; i < 8; i++)
                for (int h = 0; h < 2; h++)
                    out[g * GROUP + 16 * half + 2 * i + h] =
                        weight_value(type, q_value(s, groups, b, g, i, column, h, half), k.d[half][column], k.min[column]);
    }
}
