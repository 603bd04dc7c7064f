/* y = x W^T (+ b) for bfloat16 rows with W in int4_linear.c's column blocks, on AMX (Intel's tile
 * unit): the 4-bit weights are widened to bfloat16 in cache and multiplied by TDPBF16PS, so a many-row
 * product reads 4-bit bytes and multiplies at AMX speed.
 *
 * Why: from ~24 rows the integer kernel is bound by its VPDPWSSD rate (int4_linear.c), and a bfloat16
 * copy of the weights (bf16_copies.py) by memory, 2 bytes a weight each decode step; this reads ~0.6.
 *
 * Each task takes blocks of 16 output columns. For block b it writes the block's weights, every group
 * of 32 inputs, as bfloat16 B tiles (the panel: groups x 16 rows x 64 bytes; w = q d + m in float32,
 * multiplied then added, rounded to nearest even: Int4Linear.dequantized()'s values), for a run of
 * blocks whose panels fit L2, then runs every 32-row pass of x over those panels: two C tiles of 16
 * rows x 16 columns, float32, each summing A (16 rows x 32 inputs of x, bfloat16, read in place)
 * times B over the groups in order.
 * The B tile's layout is the column blocks' own: TDPBF16PS wants row r of B to hold, per column c,
 * the weights of inputs 2 r and 2 r + 1; chunk i's low nibbles hold exactly that for inputs 2 i,
 * 2 i + 1 (lane 2 c + h), its high nibbles for 2 i + 16, 2 i + 17, so chunk i widens into B rows i
 * and i + 8 with no shuffle. Worked example: column 3's weights 4, 5 of group 0 (chunk 2's bytes 6, 7,
 * low halves) land in B row 2, bfloat16 elements 6 and 7.
 * A row's result depends on its own x row and the weights only (the tile sums in a fixed order), so
 * it is the same whatever other rows share the call.
 *
 * x [M, I] bfloat16, y [M, O] bfloat16, bias [O] float32 or NULL.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "column_blocks.h"
#include "threads.h"

#define GROUP_INPUTS 32
#define PASS_ROWS 32 /* two tiles of 16 rows */

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

typedef struct {
    uint16_t *y;
    const uint16_t *x;
    const uint8_t *chunks;
    const uint16_t *scales; /* [blocks, groups, 2, 16] float16 d, m */
    const float *bias;
    int64_t rows, out_features, in_features;
} Problem;

/* Tiles 0, 1: C of rows 0-15 and 16-31 of a pass; 2, 3: their A; 4: B. */
static void configure(int64_t first_rows, int64_t second_rows) {
    TileConfig config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    const int64_t rows[5] = {first_rows, second_rows, first_rows, second_rows, 16};
    for (int t = 0; t < 5; t++) {
        config.rows[t] = (uint8_t)(rows[t] > 0 ? rows[t] : 1);
        config.colsb[t] = 64;
    }
    _tile_loadconfig(&config);
}

/* Block b's weights as bfloat16 B tiles, one per group of 32 inputs (header comment). */
static void write_panel(const Problem *p, int64_t b, uint16_t *panel) {
    const int64_t groups = p->in_features / GROUP_INPUTS;
    const __m512i low_nibble = _mm512_set1_epi16(0x0F);
    const __m512i first_half = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i second_half = _mm512_add_epi32(first_half, _mm512_set1_epi32(8));
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *chunks = p->chunks + (b * groups + g) * 256;
        const uint16_t *halves = p->scales + (b * groups + g) * 2 * BLOCK;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)halves));
        const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(halves + BLOCK)));
        /* lane 2 c + h of a half: column c's d and m (columns 0-7, then 8-15) */
        const __m512 d0 = _mm512_permutexvar_ps(first_half, d), d1 = _mm512_permutexvar_ps(second_half, d);
        const __m512 m0 = _mm512_permutexvar_ps(first_half, m), m1 = _mm512_permutexvar_ps(second_half, m);
        uint16_t *tile = panel + g * 16 * 32;
        for (int i = 0; i < 8; i++) {
            const __m512i wide = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(chunks + 32 * i)));
            const __m512i parts[2] = {_mm512_and_si512(wide, low_nibble), _mm512_srli_epi16(wide, 4)};
            for (int part = 0; part < 2; part++) {
                const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(parts[part])));
                const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(parts[part], 1)));
                const __m512 w0 = _mm512_add_ps(_mm512_mul_ps(q0, d0), m0);
                const __m512 w1 = _mm512_add_ps(_mm512_mul_ps(q1, d1), m1);
                _mm512_storeu_si512(tile + (i + 8 * part) * 32, (__m512i)_mm512_cvtne2ps_pbh(w1, w0));
            }
        }
    }
}

/* Row r's 16 sums plus the bias, rounded to bfloat16, into y (the last block's padding dropped). */
static inline void store_row(const Problem *p, int64_t row, int64_t column0, __mmask16 columns, const float *sums,
                             __m512 bias) {
    const __m512 out = _mm512_add_ps(_mm512_loadu_ps(sums), bias);
    _mm256_mask_storeu_epi16(p->y + row * p->out_features + column0, columns, (__m256i)_mm512_cvtneps_pbh(out));
}

/* Rows first .. first + count - 1 (count <= 32) of block b, over its panel; the tiles are configured
 * for `count` rows (configured: the count they were last configured for on this thread). */
static void run_pass(const Problem *p, int64_t b, const uint16_t *panel, int64_t first, int64_t count,
                     int64_t *configured) {
    const int64_t groups = p->in_features / GROUP_INPUTS, upper = count > 16 ? count - 16 : 0;
    const int64_t stride = p->in_features * 2;
    if (*configured != count) {
        configure(count < 16 ? count : 16, upper);
        *configured = count;
    }
    _tile_zero(0);
    if (upper) _tile_zero(1);
    for (int64_t g = 0; g < groups; g++) {
        _tile_loadd(4, panel + g * 16 * 32, 64);
        _tile_loadd(2, p->x + first * p->in_features + g * GROUP_INPUTS, stride);
        _tile_dpbf16ps(0, 2, 4);
        if (upper) {
            _tile_loadd(3, p->x + (first + 16) * p->in_features + g * GROUP_INPUTS, stride);
            _tile_dpbf16ps(1, 3, 4);
        }
    }
    float sums[PASS_ROWS][BLOCK];
    _tile_stored(0, sums[0], 64);
    if (upper) _tile_stored(1, sums[16], 64);
    const int64_t column0 = b * BLOCK, columns = p->out_features - column0 < BLOCK ? p->out_features - column0 : BLOCK;
    const __mmask16 mask = (__mmask16)((1u << columns) - 1);
    const __m512 bias = p->bias ? _mm512_maskz_loadu_ps(mask, p->bias + column0) : _mm512_setzero_ps();
    for (int64_t r = 0; r < count; r++) store_row(p, first + r, column0, mask, sums[r], bias);
}

/* A task's blocks in runs whose panels fit PANEL_BUDGET (L2): each run's panels are written once,
 * then every 32-row pass of x (in L1) goes over all of them, so x is read once per run, not per block. */
#define PANEL_BUDGET (1 << 20)

static void run_blocks(void *context, int64_t begin, int64_t end) {
    const Problem *p = (const Problem *)context;
    const int64_t panel_elements = p->in_features / GROUP_INPUTS * 16 * 32; /* bfloat16s per block */
    int64_t run = PANEL_BUDGET / (panel_elements * 2);
    run = run < 1 ? 1 : run < end - begin ? run : end - begin;
    uint16_t *panels = aligned_alloc(64, (size_t)(run * panel_elements * 2));
    if (!panels) abort(); /* at most PANEL_BUDGET: failing here is the process running out of memory */
    int64_t configured = -1;
    for (int64_t b0 = begin; b0 < end; b0 += run) {
        const int64_t b1 = b0 + run < end ? b0 + run : end;
        for (int64_t b = b0; b < b1; b++) write_panel(p, b, panels + (b - b0) * panel_elements);
        for (int64_t first = 0; first < p->rows; first += PASS_ROWS) {
            const int64_t count = p->rows - first < PASS_ROWS ? p->rows - first : PASS_ROWS;
            for (int64_t b = b0; b < b1; b++)
                run_pass(p, b, panels + (b - b0) * panel_elements, first, count, &configured);
        }
    }
    _tile_release();
    free(panels);
}

/* Whether this process may use AMX tiles (Linux asks each process to request them once). */
static int amx_permitted(void) {
    static int state; /* 0 not asked yet, 1 yes, -1 no */
    if (state == 0) state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
    return state == 1;
}

int int4_amx_available(void) { return amx_permitted(); }

/* Returns 0; 1 when in_features is not a multiple of 32; 3 when AMX is not available (the caller
 * multiplies another way). */
int int4_amx_linear(uint16_t *y, const uint16_t *x, const uint8_t *chunks, const uint16_t *scales, const float *bias,
                    int64_t rows, int64_t out_features, int64_t in_features, int num_threads) {
    if (in_features % GROUP_INPUTS) return 1;
    if (!amx_permitted()) return 3;
    Problem p = {y, x, chunks, scales, bias, rows, out_features, in_features};
    const int64_t blocks = blocks_of(out_features);
    /* threads.h's units: the weight's bytes as bfloat16, the panel written once per block */
    const int threads = threads_for(out_features * in_features * 2, num_threads);
    pool_run(run_blocks, &p, blocks, columns_per_task(blocks, threads, BLOCKS_PER_TASK), threads);
    return 0;
}

#else
int int4_amx_available(void) { return 0; }

int int4_amx_linear(uint16_t *y, const uint16_t *x, const uint8_t *chunks, const uint16_t *scales, const float *bias,
                    int64_t rows, int64_t out_features, int64_t in_features, int num_threads) {
    (void)y, (void)x, (void)chunks, (void)scales, (void)bias, (void)rows, (void)out_features, (void)in_features,
        (void)num_threads;
    return 3;
}
#endif
