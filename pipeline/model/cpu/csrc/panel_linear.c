/* y = x W^T (+ b) for a batch of rows (a decode step's sequences, up to PackedLinear.row_limit), W float32
 * packed in panels (CPU).
 *
 * The few-rows kernel multiplies each weight row into every input row with one dot product per
 * (row, column); past four rows its loads of x, not its FMAs, set the pace. Here W is repacked
 * once, at load, into panels of 32 output columns stored k-major: panel p holds W[32p .. 32p + 31]
 * as [in_features][32]. A tile of up to 8 rows x 32 columns keeps its 16 sums in registers; per k
 * it loads the panel's 32 weights once (two vectors) and broadcasts each row's x[k] into 2 FMAs:
 * 10 loads per 16 FMAs, so the FMAs set the pace. A panel (K x 128 bytes, 72-192 KiB for SmolLM2)
 * stays in L2 while the row tiles go over it, so W is read from memory once per call.
 * Kernel A/B against oneDNN's packed product, SmolLM2's 30 layers from memory, one thread, Zen 5:
 * 8 rows 15.0 vs 18.9 ms, 32 rows 35.2 vs 39.0 ms, 64 rows 61.7 vs 64.0 ms; against the few-rows
 * kernel, 2 threads: 1 row 12.2 vs 12.8 ms, 4 rows 12.4 vs 13.7 ms, 8 rows 12.2 vs 22.5 ms.
 *
 * Sums run in float32, one FMA chain per output, k in order, so each output's value does not depend
 * on how many rows or threads share the call, nor on the vector width: AVX-512 tiles (8 rows) and
 * AVX2 tiles (6 rows, each panel's two 16-column halves in turn: 16 registers hold 12 sums, 2 weight
 * vectors and a broadcast) give the same bits. Elsewhere panel_linear returns 1 and callers keep oneDNN.
 *
 * Packed layout, worked example (out_features 2, in_features 3, panel width shown as 4):
 * W = [[a0 a1 a2], [b0 b1 b2]] -> [a0 b0 0 0 | a1 b1 0 0 | a2 b2 0 0] (columns past out_features 0).
 *
 * x [M, I] and y [M, O] float32 or bfloat16 as io_bf16 says (bf16.h), gated as in input_rows.h;
 * bias [O] float32 or NULL.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "input_rows.h"
#include "threads.h"

#define PANEL 32 /* output columns per panel: two 16-lane vectors */

int64_t panel_linear_packed_size(int64_t out_features, int64_t in_features) {
    return (out_features + PANEL - 1) / PANEL * PANEL * in_features;
}

void pack_panels(float *panels, const float *weight, int64_t out_features, int64_t in_features) {
    const int64_t num_panels = (out_features + PANEL - 1) / PANEL;
    for (int64_t p = 0; p < num_panels; p++)
        for (int64_t k = 0; k < in_features; k++)
            for (int64_t c = 0; c < PANEL; c++) {
                const int64_t o = p * PANEL + c;
                panels[(p * in_features + k) * PANEL + c] = o < out_features ? weight[o * in_features + k] : 0.0f;
            }
}

/* ---- float32 weights that are bfloat16 values: panels of halves, widened in the tile -----------
 *
 * A float32 model whose weights came from a bfloat16 or GGUF checkpoint holds float32 values whose low
 * 16 bits are all zero. Their panels can keep the high halves only, and the tile widens them back
 * (a shift and a mask) into exactly the float32 values it multiplied before: the same products and
 * sums, bit for bit, from half the bytes. A decode step reads every weight once, so its few-row steps,
 * which wait on memory, read half as much.
 *
 * Packed layout: per k, 16 32-bit words; word c holds column c's half in its low 16 bits and column
 * c + 16's in its high 16, so `word << 16` is columns 0-15 and `word & 0xFFFF0000` columns 16-31.
 * Worked example (panel width shown as 2 + 2, one k): weights (1.0, 2.0, 3.0, 4.0) = 0x3F800000,
 * 0x40000000, 0x40400000, 0x40800000 -> words 0x40403F80, 0x40804000. */
int64_t panel_linear_wide_packed_size(int64_t out_features, int64_t in_features) {
    return (out_features + PANEL - 1) / PANEL * (PANEL / 2) * in_features;
}

/* Returns 1 when every weight was a bfloat16 value (the panels hold them all), else 0 (the panels are
 * then incomplete: the caller packs float32 panels instead). */
int pack_panels_wide(uint32_t *panels, const float *weight, int64_t out_features, int64_t in_features) {
    const int64_t num_panels = (out_features + PANEL - 1) / PANEL;
    uint32_t dropped = 0; /* the low halves' bits, all of them or'ed */
    /* Column by column, k innermost: each weight row is read in order (the 32 rows of a panel read a
     * float at a time, k outermost, took 1.5x as long: SmolLM2's 121 weights 0.155 against 0.103 s). */
    for (int64_t p = 0; p < num_panels; p++)
        for (int64_t c = 0; c < PANEL / 2; c++) {
            const int64_t low = p * PANEL + c, high = low + PANEL / 2;
            const float *low_row = low < out_features ? weight + low * in_features : NULL;
            const float *high_row = high < out_features ? weight + high * in_features : NULL;
            uint32_t *column = panels + p * in_features * (PANEL / 2) + c;
            for (int64_t k = 0; k < in_features; k++) {
                uint32_t low_bits = 0, high_bits = 0;
                if (low_row) memcpy(&low_bits, low_row + k, sizeof low_bits);
                if (high_row) memcpy(&high_bits, high_row + k, sizeof high_bits);
                dropped |= (low_bits | high_bits) & 0xFFFFu;
                column[k * (PANEL / 2)] = (low_bits >> 16) | (high_bits & 0xFFFF0000u);
            }
        }
    return dropped == 0;
}

/* ---- bfloat16 weights: panels of k pairs, products by VDPBF16PS (AVX512-BF16) --------------------
 *
 * The same panels of 32 output columns, holding bfloat16 weights in k pairs: for each pair
 * (2q, 2q + 1), column c's two weights sit side by side, so one 512-bit vector holds 16 columns'
 * pairs. x is rounded to bfloat16 (a bfloat16 model's activations already are) and each row's pair
 * broadcast; VDPBF16PS adds both exact products to the column's float32 sum, pair by pair in k
 * order, so an output still does not depend on the rows or threads sharing the call. Each
 * instruction does twice the multiply-adds of a float32 FMA, from half the weight bytes.
 *
 * Packed layout, worked example (out_features 2, in_features 3, panel width shown as 2):
 * W = [[a0 a1 a2], [b0 b1 b2]] -> [a0 a1 b0 b1 | a2 0 b2 0] (an odd in_features padded with 0).
 */
int64_t panel_linear_bf16_packed_size(int64_t out_features, int64_t in_features) {
    return (out_features + PANEL - 1) / PANEL * PANEL * ((in_features + 1) / 2 * 2);
}

void pack_panels_bf16(uint16_t *panels, const uint16_t *weight, int64_t out_features, int64_t in_features) {
    const int64_t num_panels = (out_features + PANEL - 1) / PANEL, num_pairs = (in_features + 1) / 2;
    for (int64_t p = 0; p < num_panels; p++)
        for (int64_t q = 0; q < num_pairs; q++)
            for (int64_t c = 0; c < PANEL; c++)
                for (int64_t j = 0; j < 2; j++) {
                    const int64_t o = p * PANEL + c, k = 2 * q + j;
                    panels[((p * num_pairs + q) * PANEL + c) * 2 + j] =
                        o < out_features && k < in_features ? weight[o * in_features + k] : 0;
                }
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>

/* A tile: R rows of x times one panel -> out [R][PANEL]. `depth`: the k steps (float32 panels:
 * in_features; bfloat16 panels: k pairs); x's rows are `depth` steps apart. A float32 or bfloat16 panel
 * holds 128 bytes (two cache lines) a step, a panel of halves 64; the tile prefetches the same lines of
 * `ahead` into L2 as it goes (run_panels says which panel). */
typedef void (*tile_fn)(float *out, const void *x, const void *panel, int64_t depth, const char *ahead);

#define PREFETCH_STEP(ahead, k)                                                                       \
    do {                                                                                              \
        _mm_prefetch((ahead) + (k) * 128, _MM_HINT_T1);                                               \
        _mm_prefetch((ahead) + (k) * 128 + 64, _MM_HINT_T1);                                          \
    } while (0)

#if defined(__AVX512F__)
#define TILE_ROWS 8 /* rows per tile: 16 accumulators */

/* Step k's 32 float32 weights as two vectors: read from a float32 panel, or widened from a panel of
 * halves (pack_panels_wide: `word << 16` is columns 0-15, `word & 0xFFFF0000` columns 16-31). */
static inline __attribute__((always_inline)) void float_weights(const void *panel, int64_t k, const char *ahead,
                                                                __m512 *w0, __m512 *w1) {
    PREFETCH_STEP(ahead, k);
    *w0 = _mm512_loadu_ps((const float *)panel + k * PANEL);
    *w1 = _mm512_loadu_ps((const float *)panel + k * PANEL + 16);
}

static inline __attribute__((always_inline)) void widened_weights(const void *panel, int64_t k, const char *ahead,
                                                                  __m512 *w0, __m512 *w1) {
    _mm_prefetch(ahead + k * 64, _MM_HINT_T1);
    const __m512i words = _mm512_loadu_si512((const uint32_t *)panel + k * (PANEL / 2));
    *w0 = _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
    *w1 = _mm512_castsi512_ps(_mm512_and_si512(words, _mm512_set1_epi32((int)0xFFFF0000u)));
}

/* NAME_R: R float32 rows of x times a panel whose step-k weights WEIGHTS gives. */
#define DEFINE_TILE(NAME, WEIGHTS, R)                                                                 \
    static void NAME##_##R(float *out, const void *x_, const void *panel, int64_t in_features,        \
                           const char *ahead) {                                                       \
        const float *x = x_;                                                                          \
        __m512 low[R], high[R];                                                                       \
        for (int r = 0; r < R; r++) low[r] = high[r] = _mm512_setzero_ps();                           \
        for (int64_t k = 0; k < in_features; k++) {                                                   \
            __m512 w0, w1;                                                                            \
            WEIGHTS(panel, k, ahead, &w0, &w1);                                                       \
            for (int r = 0; r < R; r++) {                                                             \
                const __m512 xr = _mm512_set1_ps(x[r * in_features + k]);                             \
                low[r] = _mm512_fmadd_ps(xr, w0, low[r]);                                             \
                high[r] = _mm512_fmadd_ps(xr, w1, high[r]);                                           \
            }                                                                                         \
        }                                                                                             \
        for (int r = 0; r < R; r++) {                                                                 \
            _mm512_storeu_ps(out + r * PANEL, low[r]);                                                \
            _mm512_storeu_ps(out + r * PANEL + 16, high[r]);                                          \
        }                                                                                             \
    }
#define DEFINE_TILES(NAME, WEIGHTS)                                                                   \
    DEFINE_TILE(NAME, WEIGHTS, 1) DEFINE_TILE(NAME, WEIGHTS, 2) DEFINE_TILE(NAME, WEIGHTS, 3)          \
    DEFINE_TILE(NAME, WEIGHTS, 4) DEFINE_TILE(NAME, WEIGHTS, 5) DEFINE_TILE(NAME, WEIGHTS, 6)          \
    DEFINE_TILE(NAME, WEIGHTS, 7) DEFINE_TILE(NAME, WEIGHTS, 8)                                        \
    static const tile_fn NAME##s[TILE_ROWS] = {NAME##_1, NAME##_2, NAME##_3, NAME##_4,                 \
                                               NAME##_5, NAME##_6, NAME##_7, NAME##_8};
#else /* AVX2: 8-lane vectors */
/* 6 rows a tile, 12 accumulators a half panel: 4-row tiles read each panel half again every 4 rows, and
 * took 359-366 against 250-259 ms for SmolLM2's 120 layers at 128 rows, float32 panels (Zen 3 VM,
 * 2 threads, two alternated runs each). */
#define TILE_ROWS 6

/* Step k's 16 float32 weights of the panel's columns 16 * half .. 16 * half + 15 as two vectors, read
 * or widened as above (a panel of halves: words 0-15 give columns 0-15 shifted, 16-31 masked). Each
 * half prefetches its own line of `ahead` (a panel of halves has one line a step: the first half's). */
static inline __attribute__((always_inline)) void float_weights(const void *panel, int64_t k, int half,
                                                                const char *ahead, __m256 *w0, __m256 *w1) {
    _mm_prefetch(ahead + k * 128 + 64 * half, _MM_HINT_T1);
    const float *at = (const float *)panel + k * PANEL + 16 * half;
    *w0 = _mm256_loadu_ps(at);
    *w1 = _mm256_loadu_ps(at + 8);
}

static inline __attribute__((always_inline)) void widened_weights(const void *panel, int64_t k, int half,
                                                                  const char *ahead, __m256 *w0, __m256 *w1) {
    if (half == 0) _mm_prefetch(ahead + k * 64, _MM_HINT_T1);
    const uint32_t *at = (const uint32_t *)panel + k * (PANEL / 2);
    const __m256i words0 = _mm256_loadu_si256((const __m256i *)at);
    const __m256i words1 = _mm256_loadu_si256((const __m256i *)(at + 8));
    if (half == 0) {
        *w0 = _mm256_castsi256_ps(_mm256_slli_epi32(words0, 16));
        *w1 = _mm256_castsi256_ps(_mm256_slli_epi32(words1, 16));
    } else {
        const __m256i high_halves = _mm256_set1_epi32((int)0xFFFF0000u);
        *w0 = _mm256_castsi256_ps(_mm256_and_si256(words0, high_halves));
        *w1 = _mm256_castsi256_ps(_mm256_and_si256(words1, high_halves));
    }
}

/* NAME_R: R float32 rows of x times a panel, one 16-column half at a time (a call's later tiles read
 * the panel again from L1 or L2). */
#define DEFINE_TILE(NAME, WEIGHTS, R)                                                                 \
    static void NAME##_##R(float *out, const void *x_, const void *panel, int64_t in_features,        \
                           const char *ahead) {                                                       \
        const float *x = x_;                                                                          \
        for (int half = 0; half < 2; half++) {                                                        \
            __m256 low[R], high[R];                                                                   \
            for (int r = 0; r < R; r++) low[r] = high[r] = _mm256_setzero_ps();                       \
            for (int64_t k = 0; k < in_features; k++) {                                               \
                __m256 w0, w1;                                                                        \
                WEIGHTS(panel, k, half, ahead, &w0, &w1);                                             \
                for (int r = 0; r < R; r++) {                                                         \
                    const __m256 xr = _mm256_broadcast_ss(x + r * in_features + k);                   \
                    low[r] = _mm256_fmadd_ps(xr, w0, low[r]);                                         \
                    high[r] = _mm256_fmadd_ps(xr, w1, high[r]);                                       \
                }                                                                                     \
            }                                                                                         \
            for (int r = 0; r < R; r++) {                                                             \
                _mm256_storeu_ps(out + r * PANEL + 16 * half, low[r]);                                \
                _mm256_storeu_ps(out + r * PANEL + 16 * half + 8, high[r]);                           \
            }                                                                                         \
        }                                                                                             \
    }
#define DEFINE_TILES(NAME, WEIGHTS)                                                                   \
    DEFINE_TILE(NAME, WEIGHTS, 1) DEFINE_TILE(NAME, WEIGHTS, 2) DEFINE_TILE(NAME, WEIGHTS, 3)          \
    DEFINE_TILE(NAME, WEIGHTS, 4) DEFINE_TILE(NAME, WEIGHTS, 5) DEFINE_TILE(NAME, WEIGHTS, 6)          \
    static const tile_fn NAME##s[TILE_ROWS] = {NAME##_1, NAME##_2, NAME##_3, NAME##_4, NAME##_5, NAME##_6};
#endif
DEFINE_TILES(tile, float_weights)
DEFINE_TILES(wide_tile, widened_weights)

int panel_linear_available(void) { return 1; }

/* One call's work, whichever panel type: tiles[R - 1] multiplies R rows. */
typedef struct {
    void *y;
    int io_bf16;
    const tile_fn *tiles;
    const char *x, *panels;                /* as bytes: row r at x + r * x_row_bytes, panel p likewise */
    int64_t x_row_bytes, panel_bytes, depth;
    const float *bias;
    int64_t rows, out_features;
} PanelJob;

static void run_panels(void *context, int64_t begin, int64_t end) {
    const PanelJob *j = context;
    float out[TILE_ROWS * PANEL];
    for (int64_t p = begin; p < end; p++) {
        const int64_t first = p * PANEL;
        const int64_t width = j->out_features - first < PANEL ? j->out_features - first : PANEL;
        const char *panel = j->panels + p * j->panel_bytes;
        /* The task's next panel is fetched while the second tile runs, so that the fetch overlaps
         * tiles whose panel is already in cache (one tile: while it runs); the last panel refetches
         * itself (cached: no traffic), as do the other tiles. */
        const char *next = p + 1 < end ? panel + j->panel_bytes : panel;
        const int64_t fetch_at = j->rows > TILE_ROWS ? TILE_ROWS : 0;
        for (int64_t m0 = 0; m0 < j->rows; m0 += TILE_ROWS) {
            const int64_t rows = j->rows - m0 < TILE_ROWS ? j->rows - m0 : TILE_ROWS;
            j->tiles[rows - 1](out, j->x + m0 * j->x_row_bytes, panel, j->depth, m0 == fetch_at ? next : panel);
            for (int64_t r = 0; r < rows; r++)
                store_outputs(j->y, j->io_bf16, (m0 + r) * j->out_features + first, out + r * PANEL,
                              j->bias ? j->bias + first : NULL, width);
        }
    }
}

/* The panels over the pool's threads, sized by the weight's bytes (each reads its panels once). */
static void run_panel_job(const PanelJob *job, int64_t weight_bytes, int num_threads) {
    const int64_t num_panels = (job->out_features + PANEL - 1) / PANEL;
    const int threads = threads_for(weight_bytes, num_threads);
    pool_run(run_panels, (void *)job, num_panels, columns_per_task(num_panels, threads, 1), threads);
}

/* Float32 rows times float32 panels (element_size 4: tiles) or panels of halves (2: wide_tiles). */
static int float_rows_times_panels(void *y, const void *x, const void *panels, int64_t element_size,
                                   const float *bias, int64_t rows, int64_t out_features, int64_t in_features,
                                   int io_bf16, int gated, int num_threads) {
    if (rows < 1) return 1;
    const int as_given = io_bf16 == IO_FLOAT32 && !gated; /* x's rows are already the inputs */
    float *x_f32 = as_given ? NULL : malloc(sizeof(float) * rows * in_features);
    if (!as_given && !x_f32) return 2;
    for (int64_t m = 0; !as_given && m < rows; m++) input_row(x_f32 + m * in_features, x, io_bf16, gated, in_features, m);
    const PanelJob job = {y, io_bf16, element_size == 4 ? tiles : wide_tiles,
                          as_given ? (const char *)x : (const char *)x_f32, (const char *)panels,
                          in_features * (int64_t)sizeof(float), in_features * PANEL * element_size,
                          in_features, bias, rows, out_features};
    run_panel_job(&job, out_features * in_features * element_size, num_threads);
    free(x_f32);
    return 0;
}

/* Returns 0; 1 without AVX-512 or AVX2 (the caller keeps its other path); 2 when out of memory. */
int panel_linear(void *y, const void *x, const float *panels, const float *bias, int64_t rows,
                 int64_t out_features, int64_t in_features, int io_bf16, int gated, int num_threads) {
    return float_rows_times_panels(y, x, panels, 4, bias, rows, out_features, in_features, io_bf16, gated, num_threads);
}

/* panel_linear over panels of halves (pack_panels_wide); the same returns. */
int panel_linear_wide(void *y, const void *x, const uint32_t *panels, const float *bias, int64_t rows,
                      int64_t out_features, int64_t in_features, int io_bf16, int gated, int num_threads) {
    return float_rows_times_panels(y, x, panels, 2, bias, rows, out_features, in_features, io_bf16, gated, num_threads);
}

#else

int panel_linear_available(void) { return 0; }

int panel_linear(void *y, const void *x, const float *panels, const float *bias, int64_t rows,
                 int64_t out_features, int64_t in_features, int io_bf16, int gated, int num_threads) {
    (void)y, (void)x, (void)panels, (void)bias, (void)rows, (void)out_features, (void)in_features, (void)io_bf16,
        (void)gated, (void)num_threads;
    return 1;
}

int panel_linear_wide(void *y, const void *x, const uint32_t *panels, const float *bias, int64_t rows,
                      int64_t out_features, int64_t in_features, int io_bf16, int gated, int num_threads) {
    (void)y, (void)x, (void)panels, (void)bias, (void)rows, (void)out_features, (void)in_features, (void)io_bf16,
        (void)gated, (void)num_threads;
    return 1;
}

#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)

/* R rows of x (bfloat16 pairs as 32-bit words, rows num_pairs apart) times one bfloat16 panel. */
#define DEFINE_PAIR_TILE(R)                                                                           \
    static void pair_tile_##R(float *out, const void *x_, const void *panel_, int64_t num_pairs,      \
                              const char *ahead) {                                                    \
        const uint32_t *x = x_;                                                                       \
        const uint16_t *panel = panel_;                                                               \
        __m512 low[R], high[R];                                                                       \
        for (int r = 0; r < R; r++) low[r] = high[r] = _mm512_setzero_ps();                           \
        for (int64_t q = 0; q < num_pairs; q++) {                                                     \
            PREFETCH_STEP(ahead, q);                                                                  \
            const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + q * 2 * PANEL);                  \
            const __m512bh w1 = (__m512bh)_mm512_loadu_si512(panel + q * 2 * PANEL + PANEL);          \
            for (int r = 0; r < R; r++) {                                                             \
                const __m512bh xr = (__m512bh)_mm512_set1_epi32((int)x[r * num_pairs + q]);           \
                low[r] = _mm512_dpbf16_ps(low[r], xr, w0);                                            \
                high[r] = _mm512_dpbf16_ps(high[r], xr, w1);                                          \
            }                                                                                         \
        }                                                                                             \
        for (int r = 0; r < R; r++) {                                                                 \
            _mm512_storeu_ps(out + r * PANEL, low[r]);                                                \
            _mm512_storeu_ps(out + r * PANEL + 16, high[r]);                                          \
        }                                                                                             \
    }
DEFINE_PAIR_TILE(1)
DEFINE_PAIR_TILE(2)
DEFINE_PAIR_TILE(3)
DEFINE_PAIR_TILE(4)
DEFINE_PAIR_TILE(5)
DEFINE_PAIR_TILE(6)
DEFINE_PAIR_TILE(7)
DEFINE_PAIR_TILE(8)

static const tile_fn PAIR_TILES[TILE_ROWS] = {pair_tile_1, pair_tile_2, pair_tile_3, pair_tile_4,
                                              pair_tile_5, pair_tile_6, pair_tile_7, pair_tile_8};

int panel_linear_bf16_available(void) { return 1; }

/* Returns 0; 1 without AVX512-BF16; 2 when out of memory. x and y as panel_linear's. */
int panel_linear_bf16(void *y, const void *x, const uint16_t *panels, const float *bias, int64_t rows,
                      int64_t out_features, int64_t in_features, int io_bf16, int gated, int num_threads) {
    if (rows < 1) return 1;
    const int64_t num_pairs = (in_features + 1) / 2;
    uint16_t *x_bf16 = calloc((size_t)(rows * num_pairs * 2), sizeof(uint16_t));
    float *row = malloc(sizeof(float) * in_features);
    if (!x_bf16 || !row) {
        free(x_bf16);
        free(row);
        return 2;
    }
    for (int64_t m = 0; m < rows; m++) {
        input_row(row, x, io_bf16, gated, in_features, m);
        bf16_row(x_bf16 + m * num_pairs * 2, row, in_features);
    }
    free(row);
    const PanelJob job = {y, io_bf16, PAIR_TILES, (const char *)x_bf16, (const char *)panels,
                          num_pairs * (int64_t)sizeof(uint32_t), num_pairs * 2 * PANEL * (int64_t)sizeof(uint16_t),
                          num_pairs, bias, rows, out_features};
    run_panel_job(&job, out_features * in_features * (int64_t)sizeof(uint16_t), num_threads);
    free(x_bf16);
    return 0;
}

#else

int panel_linear_bf16_available(void) { return 0; }

int panel_linear_bf16(void *y, const void *x, const uint16_t *panels, const float *bias, int64_t rows,
                      int64_t out_features, int64_t in_features, int io_bf16, int gated, int num_threads) {
    (void)y, (void)x, (void)panels, (void)bias, (void)rows, (void)out_features, (void)in_features, (void)io_bf16,
        (void)gated, (void)num_threads;
    return 1;
}

#endif
