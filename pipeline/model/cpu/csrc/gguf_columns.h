/* GGUF blocks held in column blocks with integer products (gguf_columns.c has the layout), as
 * gguf_linear.c calls them for the segments of a layer held that way. */
#ifndef AQUEDUCT_GGUF_COLUMNS_H
#define AQUEDUCT_GGUF_COLUMNS_H

#include <stdint.h>

#include "quantized_inputs.h"

typedef struct {
    int64_t type;            /* ggml's type id: Q5_0, Q8_0, Q4_K, Q5_K or Q6_K */
    const uint8_t *values;   /* [blocks, groups, 256 or 512] */
    const uint8_t *high;     /* [blocks, groups, 64 or 128], NULL for Q8_0 and Q4_K */
    const uint16_t *halves;  /* float16 scales */
    const uint8_t *bytes;    /* K-quants' 8-bit scales and mins, NULL for Q5_0 and Q8_0 */
    int64_t out_features;
} ColumnSegment;

/* 1 when `type` has a column-block layout. */
int gguf_columns_known(int64_t type);
/* 1 when this build multiplies column blocks with vectors (AVX-512); elsewhere it runs portable C,
 * correct but slower than the file-block kernel, so layers keep the file's rows there. */
int gguf_columns_fast(void);
/* 1 when the segment's type is known and in_features a whole number of its (super-)blocks. */
int gguf_columns_fits(const ColumnSegment *s, int64_t in_features);
/* x_q's sums over each 16 inputs, [rows, in_features / 16], or NULL when out of memory. */
int32_t *gguf_columns_x_sums(const QuantizedRows *x, int64_t rows, int64_t in_features);
/* y[:, y_offset : y_offset + out_features] (rows of y_stride) = x W^T + bias[y_offset ...]. */
void gguf_columns_linear(void *y, const QuantizedRows *x, const int32_t *x_sums, const ColumnSegment *s,
                         const float *bias, int64_t rows, int64_t in_features, int64_t y_stride, int64_t y_offset,
                         int io_bf16, int num_threads);
/* The segment's weight as float32 (or bfloat16) [out_features, in_features] at out; portable: with the
 * plain C code, not the vector one (the same values; for tests). */
void gguf_columns_dequantize(void *out, const ColumnSegment *s, int64_t in_features, int out_bf16, int portable,
                             int num_threads);
/* Row `row` of the segment as float32 into out [in_features] (an embedding's lookup). */
void gguf_columns_row(float *out, const ColumnSegment *s, int64_t in_features, int64_t row);

#endif
