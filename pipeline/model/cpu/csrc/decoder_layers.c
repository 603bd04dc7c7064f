/* Every decoder layer of a decode step in one call (CPU), for Llama-form layers:
 *     hidden += o_proj(attention(rope(qkv_proj(input_norm(hidden)))))
 *     hidden += down_proj(silu(gate) * up),  [gate | up] = gate_up_proj(post_norm(hidden))
 *
 * Each stage is the kernel the per-op path calls (rms_norm.c, int4_linear.c, int4_amx.c, int8_linear.c,
 * gguf_linear.c, few_rows_linear.c, rope_kv_write.c, paged_decode_attention.c) on the same inputs in the same
 * order, and the residual adds round as torch's do (the float sum, rounded to bfloat16 to nearest
 * even), so the hidden states are bit for bit those of the per-op path. What goes is the Python
 * between the kernels: a SmolLM2 step made ~240 kernel calls through ctypes, each with its module
 * call, output allocation and views, a few microseconds apiece.
 *
 * Decode only: one query token per sequence, every row a real token with a cache slot (the
 * caller checks). hidden [rows, hidden_size] in the model's dtype (float32, or bfloat16 with
 * io_bf16), updated in place; each layer's K/V cache has that dtype too.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "input_rows.h"

enum { LINEAR_INT4 = 0, LINEAR_INT8 = 1, LINEAR_FLOAT = 2, LINEAR_GGUF = 3 };
enum { WIDE_PANELS = 2 };

typedef struct {
    int64_t kind;        /* LINEAR_* */
    int64_t weight_bf16; /* LINEAR_FLOAT: bfloat16 weight (else float32); with panels, WIDE_PANELS: float32
                          * values held as bfloat16 halves (panel_linear.c's pack_panels_wide) */
    const void *values;  /* int4: column blocks (int4_linear.c); int8: values; float: the weight;
                          * gguf: the segments (gguf_linear.c) */
    const void *scales;  /* int4: block scales and offsets; int8: per-row scales; float: unused */
    const float *bias;   /* [out_features] float32 or NULL */
    int64_t out_features, in_features;
    const void *panels;  /* LINEAR_FLOAT: the weight in panel_linear.c's layout (float32, or bfloat16
                          * pairs when weight_bf16; values unused), or NULL */
    const void *copy_panels;  /* a quantized layer's bfloat16 copy as bfloat16 panels (bf16_copies.py), taking
                               * copy_from_rows rows and more, or NULL */
    const float *copy_bias;   /* the copy's bias (rounded to bfloat16, as float32) or NULL */
    int64_t copy_from_rows;
    int64_t amx_from_rows;    /* LINEAR_INT4 with bfloat16 rows: this many rows and more on AMX tiles
                               * (int4_amx.c), as the per-op path multiplies them; 0 = never */
} Linear;

typedef struct {
    const void *input_norm, *post_norm; /* [hidden_size] weights in the model's dtype */
    float input_eps, post_eps;
    Linear qkv, o, gate_up, down;
    void *key_cache, *value_cache; /* [slots, num_kv_heads * head_dim] each */
    int64_t window;                /* sliding window; 0 = full attention */
} Layer;

typedef struct {
    int64_t rows, hidden_size, num_heads, num_kv_heads, head_dim, block_size;
    const void *cos, *sin; /* [rows, head_dim / 2] in the model's dtype */
    const int64_t *slots;  /* [rows] cache slot of each token */
    const int32_t *block_tables;
    int64_t block_table_stride;
    const int32_t *seq_lens;
    int64_t max_seq_len;
    float scale, softcap;
    int64_t io_bf16, threads;
} Step;

/* The kernels this file chains (their own files document them). */
void rms_norm(void *y, const void *x, const void *w, int64_t rows, int64_t dim, float eps, int bf16, int num_threads);
int quantized_linear_int4(void *y, const void *x, const uint8_t *column_blocks, const uint16_t *block_scales,
                          const float *bias, int64_t rows, int64_t out_features, int64_t in_features, int io_bf16,
                          int gated, int num_threads);
int quantized_linear_int8(void *y, const void *x, const int8_t *values, const float *scales, const float *bias,
                          int64_t rows, int64_t out_features, int64_t in_features, int io_bf16, int gated,
                          int num_threads);
int gguf_linear(void *y, const void *x, const void *segments, const float *bias, int64_t rows, int64_t in_features,
                int io_bf16, int gated, int num_threads);
int few_rows_linear(void *y, const void *x, const void *weight, const float *bias, int64_t rows,
                    int64_t out_features, int64_t in_features, int bf16, int io_bf16, int gated, int num_threads);
int int4_amx_linear(uint16_t *y, const uint16_t *x, const uint8_t *chunks, const uint16_t *scales, const float *bias,
                    int64_t rows, int64_t out_features, int64_t in_features, int gated, int num_threads);
int panel_linear(void *y, const void *x, const float *panels, const float *bias, int64_t rows,
                 int64_t out_features, int64_t in_features, int io_bf16, int gated, int num_threads);
int panel_linear_bf16(void *y, const void *x, const uint16_t *panels, const float *bias, int64_t rows,
                      int64_t out_features, int64_t in_features, int io_bf16, int gated, int num_threads);
int panel_linear_wide(void *y, const void *x, const uint32_t *panels, const float *bias, int64_t rows,
                      int64_t out_features, int64_t in_features, int io_bf16, int gated, int num_threads);
void rope_kv_write(void *qkv, const void *cos, const void *sin, void *key_cache, void *value_cache,
                   const int64_t *slots, int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads,
                   int64_t head_dim, int64_t elem_size, int num_threads);
int paged_decode_attention(void *out, const void *q, const void *key_cache, const void *value_cache,
                           const int32_t *block_tables, int64_t block_table_stride, const int32_t *seq_lens,
                           int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                           int64_t block_size, float scale, int64_t max_seq_len, int64_t window, int64_t chunk,
                           float softcap, const float *sinks, int kv_format, float k_scale, float v_scale,
                           int io_bf16, int num_threads);

/* y = x W^T + b; gated: x is [rows, 2 in_features], [gate | up], and the input silu(gate) * up.
 * Returns the kernel's code: 0, 1 (shape it does not take), 2 (out of memory), 3 (no AMX: the caller
 * sets amx_from_rows only where the process has it). */
static int linear(const Linear *l, void *y, const void *x, int gated, const Step *s) {
    const int io_bf16 = (int)s->io_bf16, threads = (int)s->threads;
    if (l->copy_panels && s->rows >= l->copy_from_rows)
        return panel_linear_bf16(y, x, (const uint16_t *)l->copy_panels, l->copy_bias, s->rows, l->out_features,
                                 l->in_features, io_bf16, gated, threads);
    if (l->kind == LINEAR_INT4 && l->amx_from_rows && s->rows >= l->amx_from_rows && io_bf16)
        return int4_amx_linear(y, x, l->values, l->scales, l->bias, s->rows, l->out_features, l->in_features, gated,
                               threads);
    switch (l->kind) {
    case LINEAR_INT4:
        return quantized_linear_int4(y, x, l->values, l->scales, l->bias, s->rows, l->out_features, l->in_features,
                                     io_bf16, gated, threads);
    case LINEAR_INT8:
        return quantized_linear_int8(y, x, l->values, l->scales, l->bias, s->rows, l->out_features, l->in_features,
                                     io_bf16, gated, threads);
    case LINEAR_GGUF:
        return gguf_linear(y, x, l->values, l->bias, s->rows, l->in_features, io_bf16, gated, threads);
    case LINEAR_FLOAT:
        if (l->panels && l->weight_bf16 == WIDE_PANELS)
            return panel_linear_wide(y, x, (const uint32_t *)l->panels, l->bias, s->rows, l->out_features,
                                     l->in_features, io_bf16, gated, threads);
        if (l->panels && l->weight_bf16)
            return panel_linear_bf16(y, x, (const uint16_t *)l->panels, l->bias, s->rows, l->out_features,
                                     l->in_features, io_bf16, gated, threads);
        if (l->panels)
            return panel_linear(y, x, (const float *)l->panels, l->bias, s->rows, l->out_features, l->in_features, io_bf16, gated,
                                threads);
        return few_rows_linear(y, x, l->values, l->bias, s->rows, l->out_features, l->in_features,
                               (int)l->weight_bf16, io_bf16, gated, threads);
    default:
        return 1;
    }
}

/* hidden += delta, count elements; bfloat16: the float sum rounded to nearest even, as torch (a vector
 * at a time, input_rows.h's rounding). */
static void add_residual(void *hidden, const void *delta, int64_t count, int io_bf16) {
    if (io_bf16) {
        uint16_t *h = hidden;
        const uint16_t *d = delta;
        int64_t i = 0;
        for (; i + ROW_LANES <= count; i += ROW_LANES) {
            const row_hlanes halves = to_bf16_lanes(row_lanes_at(h, 1, i) + row_lanes_at(d, 1, i));
            memcpy(h + i, &halves, sizeof halves);
        }
        for (; i < count; i++) h[i] = float_to_bf16(bf16_to_float(h[i]) + bf16_to_float(d[i]));
    } else {
        float *h = hidden;
        const float *d = delta;
        for (int64_t i = 0; i < count; i++) h[i] += d[i];
    }
}

typedef struct {
    char *normed, *qkv, *q, *attention, *delta, *gate_up;
} Scratch;

static int run_layer(void *hidden, const Layer *l, const Step *s, const Scratch *b) {
    const int io_bf16 = (int)s->io_bf16, threads = (int)s->threads;
    const int64_t rows = s->rows, elem = io_bf16 ? 2 : 4, q_size = s->num_heads * s->head_dim;
    const int64_t qkv_size = l->qkv.out_features;
    int failed;
    rms_norm(b->normed, hidden, l->input_norm, rows, s->hidden_size, l->input_eps, io_bf16, threads);
    if ((failed = linear(&l->qkv, b->qkv, b->normed, 0, s))) return failed;
    rope_kv_write(b->qkv, s->cos, s->sin, l->key_cache, l->value_cache, s->slots, rows, s->num_heads,
                  s->num_kv_heads, s->head_dim, elem, threads);
    /* The attention kernel reads q as [rows, num_heads, head_dim]: the q part of each qkv row. */
    const char *q = b->qkv;
    if (rows > 1) {
        for (int64_t t = 0; t < rows; t++)
            memcpy(b->q + t * q_size * elem, b->qkv + t * qkv_size * elem, q_size * elem);
        q = b->q;
    }
    if (paged_decode_attention(b->attention, q, l->key_cache, l->value_cache, s->block_tables,
                               s->block_table_stride, s->seq_lens, rows, s->num_heads, s->num_kv_heads, s->head_dim,
                               s->block_size, s->scale, s->max_seq_len, l->window, 0, s->softcap, NULL,
                               io_bf16 ? 3 : 0,
                               1.0f, 1.0f, io_bf16, threads))
        return 2;
    if ((failed = linear(&l->o, b->delta, b->attention, 0, s))) return failed;
    add_residual(hidden, b->delta, rows * s->hidden_size, io_bf16);
    rms_norm(b->normed, hidden, l->post_norm, rows, s->hidden_size, l->post_eps, io_bf16, threads);
    if ((failed = linear(&l->gate_up, b->gate_up, b->normed, 0, s))) return failed;
    if ((failed = linear(&l->down, b->delta, b->gate_up, 1, s))) return failed;
    add_residual(hidden, b->delta, rows * s->hidden_size, io_bf16);
    return 0;
}

/* Runs layers[0 .. num_layers - 1] over hidden. Returns 0; 1 when a linear layer refused its shape
 * (the caller then takes the per-op path: nothing was written before the first layer's qkv_proj,
 * but a later refusal leaves hidden and the caches part-way, so the caller checks shapes first);
 * 2 when out of memory. */
int decoder_layers(void *hidden, const Layer *layers, int64_t num_layers, const Step *s) {
    const int64_t elem = s->io_bf16 ? 2 : 4, rows = s->rows;
    int64_t widest_qkv = 0, widest_gate_up = 0;
    for (int64_t i = 0; i < num_layers; i++) {
        if (layers[i].qkv.out_features > widest_qkv) widest_qkv = layers[i].qkv.out_features;
        if (layers[i].gate_up.out_features > widest_gate_up) widest_gate_up = layers[i].gate_up.out_features;
    }
    const int64_t q_size = s->num_heads * s->head_dim;
    const int64_t sizes[6] = {s->hidden_size, widest_qkv, q_size, q_size, s->hidden_size, widest_gate_up};
    int64_t total = 0;
    for (int i = 0; i < 6; i++) total += sizes[i];
    char *arena = malloc((size_t)(total * rows * elem));
    if (!arena) return 2;
    char *parts[6];
    int64_t offset = 0;
    for (int i = 0; i < 6; i++) {
        parts[i] = arena + offset;
        offset += sizes[i] * rows * elem;
    }
    const Scratch scratch = {parts[0], parts[1], parts[2], parts[3], parts[4], parts[5]};
    int failed = 0;
    for (int64_t i = 0; i < num_layers && !failed; i++) failed = run_layer(hidden, &layers[i], s, &scratch);
    free(arena);
    return failed;
}
