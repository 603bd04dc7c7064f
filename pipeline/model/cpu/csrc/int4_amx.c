/* y = x W^T (+ b) for bfloat16 rows with W in int4_linear.c's column blocks, on AMX (Intel's tile
 * unit): the 4-bit weights are widened to bfloat16 in cache and multiplied by TDPBF16PS, so a many-row
 * product reads 4-bit bytes and multiplies at AMX speed.
 *
 * Why: from ~24 rows the integer kernel is bound by its VPDPWSSD rate (int4_linear.c), and a bfloat16
 * copy of the weights (bf16_copies.py) by memory, 2 bytes a weight each decode step; this reads ~0.6.
 *
 * Each task takes blocks of 16 output columns. For block b it writes the block's weights, every group
 * of 32 inputs, as bfloat16 B tiles (the panel: groups x 16 rows x 64 bytes; w = q d + m in float32,
 * rounded to nearest even: Int4Linear.dequantized()'s values), for a run of blocks whose panels fit
 * L2, then runs every 32-row pass of x over those panels, two blocks at a time: four C tiles of 16
 * rows x 16 columns, float32, each summing A (16 rows x 32 inputs of x, bfloat16, read in place)
 * times B over the groups in order.
 * SmolLM2's 120 4-bit layers at 32 rows (2 threads, a 2-core Xeon VM with AMX, Python calls included):
 * 11.9 ms with one block a pass, 10.0 ms with two.
 * The B tile's layout is the column blocks' own: TDPBF16PS wants row r of B to hold, per column c,
 * the weights of inputs 2 r and 2 r + 1; chunk i's low nibbles hold exactly that for inputs 2 i,
 * 2 i + 1 (lane 2 c + h), its high nibbles for 2 i + 16, 2 i + 17, so chunk i widens into B rows i
 * and i + 8 with no shuffle. Worked example: column 3's weights 4, 5 of group 0 (chunk 2's bytes 6, 7,
 * low halves) land in B row 2, bfloat16 elements 6 and 7.
 * A row's result depends on its own x row and the weights only (the tile sums in a fixed order), so
 * it is the same whatever other rows share the call.
 *
 * gated: x is a SiLU-gated MLP's [gate | up], [M, 2 I], and the input silu(gate) * up, rounded as
 * input_rows.h rounds it for every native kernel (so a down projection gates alike on every path); the
 * gated rows are written once per call into a bfloat16 buffer the tiles then read.
 *
 * x [M, I] bfloat16, y [M, O] bfloat16, bias [O] float32 or NULL.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "column_blocks.h"
#include "input_rows.h"
#include "threads.h"

#define GROUP_INPUTS 32
#define PASS_ROWS 32 /* two tiles of 16 rows */
/* write_panel asks for the 4-bit bytes this many bytes (8 groups of 256) ahead of the group it widens,
 * and for that group's scales: the hardware prefetchers alone left it waiting on each group's first line. */
#define CHUNK_AHEAD 2048

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

/* Tiles 0, 1: C of rows 0-15 of a pass for blocks b and b + 1; 2, 3: C of rows 16-31; 4, 5: A of
 * rows 0-15 and 16-31; 6, 7: B of blocks b and b + 1. */
static void configure(int64_t first_rows, int64_t second_rows) {
    TileConfig config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    const int64_t rows[8] = {first_rows, first_rows, second_rows, second_rows, first_rows, second_rows, 16, 16};
    for (int t = 0; t < 8; t++) {
        config.rows[t] = (uint8_t)(rows[t] > 0 ? rows[t] : 1);
        config.colsb[t] = 64;
    }
    _tile_loadconfig(&config);
}

/* Block b's weights as bfloat16 B tiles, one per group of 32 inputs (header comment). Per 16 bytes of
 * a chunk (8 columns' 32 weights): the bytes widened to 32-bit lanes, and each nibble's value looked
 * up as a float by VPERMPS, which reads only an index's low 4 bits (the high nibble after a shift):
 * two shuffles and a shift where widening through 16-bit lanes and converting took seven operations
 * (no change in the kernel's time measured: the passes' pairing below gave its gain).
 * q d + m as one FMA is the multiply-then-add's value: q d (4 bits times float16's 11) is exact.
 * Worked example: byte 0x5A -> low nibble 10 -> 10.0f, high nibble 5 -> 5.0f.
 * Each group first asks for the bytes and scales of the group CHUNK_AHEAD bytes ahead (past the
 * weights' end a prefetch is harmless: it never faults). SmolLM2's 120 4-bit layers at 32 rows, from
 * memory (2 threads, a 2-core Xeon VM with AMX, three alternated runs): 8.1-8.4 ms against 9.4-9.9
 * without; perf had put ~45% of write_panel's samples on instructions waiting for a group's bytes. */
static void write_panel(const Problem *p, int64_t b, uint16_t *panel) {
    const int64_t groups = p->in_features / GROUP_INPUTS;
    const __m512 nibble_values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i first_half = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i second_half = _mm512_add_epi32(first_half, _mm512_set1_epi32(8));
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *chunks = p->chunks + (b * groups + g) * 256;
        const uint16_t *halves = p->scales + (b * groups + g) * 2 * BLOCK;
        for (int line = 0; line < 256; line += 64) __builtin_prefetch(chunks + CHUNK_AHEAD + line, 0, 3);
        __builtin_prefetch(halves + CHUNK_AHEAD / 256 * 2 * BLOCK, 0, 3); /* the same group's scales (64 bytes) */
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)halves));
        const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(halves + BLOCK)));
        /* lane 2 c + h of a half: column c's d and m (columns 0-7, then 8-15) */
        const __m512 ds[2] = {_mm512_permutexvar_ps(first_half, d), _mm512_permutexvar_ps(second_half, d)};
        const __m512 ms[2] = {_mm512_permutexvar_ps(first_half, m), _mm512_permutexvar_ps(second_half, m)};
        uint16_t *tile = panel + g * 16 * 32;
        for (int i = 0; i < 8; i++) {
            __m512 low[2], high[2];
            for (int half = 0; half < 2; half++) {
                const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(chunks + 32 * i + 16 * half)));
                const __m512 q_low = _mm512_permutexvar_ps(bytes, nibble_values);
                const __m512 q_high = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), nibble_values);
                low[half] = _mm512_fmadd_ps(q_low, ds[half], ms[half]);
                high[half] = _mm512_fmadd_ps(q_high, ds[half], ms[half]);
            }
            _mm512_storeu_si512(tile + i * 32, (__m512i)_mm512_cvtne2ps_pbh(low[1], low[0]));
            _mm512_storeu_si512(tile + (i + 8) * 32, (__m512i)_mm512_cvtne2ps_pbh(high[1], high[0]));
        }
    }
}

/* Row r's 16 sums plus the bias, rounded to bfloat16, into y (the last block's padding dropped). */
static inline void store_row(const Problem *p, int64_t row, int64_t column0, __mmask16 columns, const float *sums,
                             __m512 bias) {
    const __m512 out = _mm512_add_ps(_mm512_loadu_ps(sums), bias);
    _mm256_mask_storeu_epi16(p->y + row * p->out_features + column0, columns, (__m256i)_mm512_cvtneps_pbh(out));
}

/* A pass's sums, stored from its C tiles, whose rows go out to y (bias added, rounded) a few at each
 * group of the next pass's multiplies (run_pass), while the tile unit works. Written out straight after
 * the tile stores, as they were, the rows took over a quarter of the kernel's time (SmolLM2's 120 4-bit
 * layers at 2,048 rows, 2 threads, a 2-core Xeon VM with AMX: 140-147 ms with the rows left unwritten,
 * 198-211 ms writing them; 172-175 ms written this way). The values are the same; only the moment
 * they are stored moves. */
typedef struct {
    float sums[2][PASS_ROWS][BLOCK]; /* [block of the pair][row][column] */
    int64_t b, first, count, done;   /* done: rows already in y */
    int pair;
} Pending;

/* Rows done .. end - 1 of `pending` into y. */
static void flush_rows(const Problem *p, Pending *pending, int64_t end) {
    end = end < pending->count ? end : pending->count;
    for (int k = 0; k <= pending->pair; k++) {
        const int64_t column0 = (pending->b + k) * BLOCK;
        const int64_t columns = p->out_features - column0 < BLOCK ? p->out_features - column0 : BLOCK;
        const __mmask16 mask = (__mmask16)((1u << columns) - 1);
        const __m512 bias = p->bias ? _mm512_maskz_loadu_ps(mask, p->bias + column0) : _mm512_setzero_ps();
        for (int64_t r = pending->done; r < end; r++)
            store_row(p, pending->first + r, column0, mask, pending->sums[k][r], bias);
    }
    pending->done = end > pending->done ? end : pending->done;
}

/* The next pass's rows of x, asked into L2 while this pass's block pairs run (run_pass): pair j of a run's
 * `pairs` takes its j-th share of their cache lines, `per_group` lines at each group. The passes of a
 * prefill read x from memory (2,048 rows of SmolLM2 are 2.4-6.3 MB), and perf had put a third of
 * run_pass's samples on the multiplies after its A tile loads. SmolLM2's 120 4-bit layers at 2,048 rows
 * (2 threads, a 2-core Xeon VM with AMX, three alternated runs): 197 ms against 206-217 without. */
typedef struct {
    const char *lines;
    int64_t per_group; /* 0: nothing to ask for */
} RowsAhead;

static RowsAhead rows_ahead(const Problem *p, int64_t next, int64_t pair_index, int64_t pairs) {
    const RowsAhead none = {NULL, 0};
    if (next >= p->rows) return none;
    const int64_t count = p->rows - next < PASS_ROWS ? p->rows - next : PASS_ROWS;
    const int64_t lines = (count * p->in_features * 2 + 63) / 64, share = (lines + pairs - 1) / pairs;
    const int64_t groups = p->in_features / GROUP_INPUTS;
    if (pair_index * share >= lines) return none; /* the last share may reach past x: a prefetch never faults */
    return (RowsAhead){(const char *)(p->x + next * p->in_features) + pair_index * share * 64,
                       (share + groups - 1) / groups};
}

/* Rows first .. first + count - 1 (count <= 32) of blocks b and, with pair, b + 1 (whose panel follows
 * b's), over their panels; the tiles are configured for `count` rows (configured: the count they were
 * last configured for on this thread). Two blocks a pass: each A tile serves both, and the four C tiles'
 * sums are independent chains of TDPBF16PS (one block's two chains waited on each other's latency:
 * perf put half of this function's samples on the instruction after the multiply). Each C tile still
 * sums its block's groups in order, so the result is the one-block pass's, bit for bit.
 * ahead: the next pass's rows of x to ask for (rows_ahead); previous: the pass before, whose rows this
 * one writes out (NULL: none); own: where this pass's sums wait for the next pass (or the task's end). */
static void run_pass(const Problem *p, int64_t b, int pair, const uint16_t *panel, int64_t panel_elements,
                     int64_t first, int64_t count, int64_t *configured, RowsAhead ahead, Pending *previous,
                     Pending *own) {
    const int64_t groups = p->in_features / GROUP_INPUTS, upper = count > 16 ? count - 16 : 0;
    const int64_t stride = p->in_features * 2;
    if (*configured != count) {
        configure(count < 16 ? count : 16, upper);
        *configured = count;
    }
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const uint16_t *x = p->x + first * p->in_features;
    /* the previous pass's rows, a few at each group, all of them by the loop's middle (over every group:
     * no faster) */
    const int64_t half = groups / 2 > 0 ? groups / 2 : 1;
    const int64_t rows_per_group = previous ? (previous->count + half - 1) / half : 0;
    for (int64_t g = 0; g < groups; g++) {
        if (previous && previous->done < previous->count) flush_rows(p, previous, (g + 1) * rows_per_group);
        for (int64_t line = g * ahead.per_group; line < (g + 1) * ahead.per_group; line++)
            _mm_prefetch(ahead.lines + line * 64, _MM_HINT_T1);
        _tile_loadd(6, panel + g * 16 * 32, 64);
        _tile_loadd(4, x + g * GROUP_INPUTS, stride);
        _tile_dpbf16ps(0, 4, 6);
        if (pair) {
            _tile_loadd(7, panel + panel_elements + g * 16 * 32, 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (upper) {
            _tile_loadd(5, x + 16 * p->in_features + g * GROUP_INPUTS, stride);
            _tile_dpbf16ps(2, 5, 6);
            if (pair) _tile_dpbf16ps(3, 5, 7);
        }
    }
    if (previous) flush_rows(p, previous, previous->count);
    _tile_stored(0, own->sums[0][0], 64);
    _tile_stored(1, own->sums[1][0], 64);
    _tile_stored(2, own->sums[0][16], 64);
    _tile_stored(3, own->sums[1][16], 64);
    own->b = b, own->first = first, own->count = count, own->done = 0, own->pair = pair;
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
    int64_t configured = -1, passes = 0;
    Pending *pending = malloc(2 * sizeof(Pending)); /* the previous pass's, and this one's */
    if (!pending) abort();
    for (int64_t b0 = begin; b0 < end; b0 += run) {
        const int64_t b1 = b0 + run < end ? b0 + run : end;
        for (int64_t b = b0; b < b1; b++) write_panel(p, b, panels + (b - b0) * panel_elements);
        for (int64_t first = 0; first < p->rows; first += PASS_ROWS) {
            const int64_t count = p->rows - first < PASS_ROWS ? p->rows - first : PASS_ROWS;
            for (int64_t b = b0; b < b1; b += 2, passes++)
                run_pass(p, b, b + 1 < b1, panels + (b - b0) * panel_elements, panel_elements, first, count,
                         &configured, rows_ahead(p, first + PASS_ROWS, (b - b0) / 2, (b1 - b0 + 1) / 2),
                         passes ? &pending[(passes - 1) % 2] : NULL, &pending[passes % 2]);
        }
    }
    if (passes) flush_rows(p, &pending[(passes - 1) % 2], PASS_ROWS);
    _tile_release();
    free(pending);
    free(panels);
}

/* Whether this process may use AMX tiles (Linux asks each process to request them once). */
static int amx_permitted(void) {
    static int state; /* 0 not asked yet, 1 yes, -1 no */
    if (state == 0) state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
    return state == 1;
}

int int4_amx_available(void) { return amx_permitted(); }

typedef struct {
    uint16_t *gated;
    const uint16_t *x;
    int64_t in_features;
    int failed;
} Gating;

static void gate_rows(void *context, int64_t begin, int64_t end) {
    Gating *g = (Gating *)context;
    float *row = malloc((size_t)g->in_features * sizeof *row);
    if (!row) {
        __atomic_store_n(&g->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t m = begin; m < end; m++) {
        input_row(row, g->x, 1, 1, g->in_features, m);
        bf16_row(g->gated + m * g->in_features, row, g->in_features);
    }
    free(row);
}

/* threads.h's units for one gated input: its SiLU (a table lookup with AVX-512, else an exponential
 * and a quotient) and two roundings cost about what reading 16 bytes does, so a decode step's 32 rows
 * of SmolLM2 (49K inputs) split between two threads. Counted as the 4 bytes each reads (the earlier
 * units), those rows ran on one thread: SmolLM2's 30 gated down projections at 32 rows (2 threads, a
 * 2-core Xeon VM with AMX, best of 20, three alternated runs) took 3.26-3.60 ms so, against 2.65-2.79 ms
 * split; with the SiLU table 2.33-2.39 against 2.01-2.20 ms. */
#define GATING_UNITS 16

/* x's rows [M, 2 I] gated into [M, I] bfloat16 (header comment), or NULL when out of memory. A
 * prefill's 2,048 rows are SmolLM2's 3.1M exponentials a layer: split between the threads. */
static uint16_t *gated_rows(const uint16_t *x, int64_t rows, int64_t in_features, int num_threads) {
    Gating g = {malloc((size_t)(rows * in_features) * sizeof *g.gated), x, in_features, 0};
    if (!g.gated) return NULL;
    const int threads = threads_for(rows * in_features * GATING_UNITS, num_threads);
    pool_run(gate_rows, &g, rows, (rows + threads - 1) / threads, threads);
    if (g.failed) {
        free(g.gated);
        return NULL;
    }
    return g.gated;
}

/* Returns 0; 1 when in_features is not a multiple of 32; 2 when out of memory; 3 when AMX is not
 * available (the caller multiplies another way). */
int int4_amx_linear(uint16_t *y, const uint16_t *x, const uint8_t *chunks, const uint16_t *scales, const float *bias,
                    int64_t rows, int64_t out_features, int64_t in_features, int gated, int num_threads) {
    if (in_features % GROUP_INPUTS) return 1;
    if (!amx_permitted()) return 3;
    uint16_t *gated_x = gated ? gated_rows(x, rows, in_features, num_threads) : NULL;
    if (gated && !gated_x) return 2;
    Problem p = {y, gated ? gated_x : x, chunks, scales, bias, rows, out_features, in_features};
    const int64_t blocks = blocks_of(out_features);
    /* threads.h's units: the weight's bytes as bfloat16, the panel written once per block */
    const int threads = threads_for(out_features * in_features * 2, num_threads);
    pool_run(run_blocks, &p, blocks, columns_per_task(blocks, threads, BLOCKS_PER_TASK), threads);
    free(gated_x);
    return 0;
}

#else
int int4_amx_available(void) { return 0; }

int int4_amx_linear(uint16_t *y, const uint16_t *x, const uint8_t *chunks, const uint16_t *scales, const float *bias,
                    int64_t rows, int64_t out_features, int64_t in_features, int gated, int num_threads) {
    (void)y, (void)x, (void)chunks, (void)scales, (void)bias, (void)rows, (void)out_features, (void)in_features,
        (void)gated, (void)num_threads;
    return 3;
}
#endif
