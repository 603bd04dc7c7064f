/* aq_silu_bf16[g] = silu(g) rounded to bfloat16, for every bfloat16 g (its bits), as input_rows.h's
 * gate_lanes computes it lane by lane; gate_lanes looks a bfloat16 gate up here where the CPU
 * gathers 16 lanes (input_rows.h says why). Filled when the library loads: 4,096 vectors, 94 us on a
 * 2-core Xeon VM.
 * Built, like the kernels that read it, without fused multiply-adds (the library's -ffp-contract=off),
 * so each entry is the value those kernels computed before the table.
 * Worked example: g = 0x3F80 (1.0) -> silu(1) = 1 / (1 + e^-1) = 0.7311 -> bfloat16 0x3F3B (0.7305). */
#include <stdint.h>
#include <string.h>

#include "input_rows.h"

uint16_t aq_silu_bf16[65536 + 1];

__attribute__((constructor)) static void fill_silu_table(void) {
    for (int32_t first = 0; first < 65536; first += ROW_LANES) {
        row_ilanes bits;
        for (int lane = 0; lane < ROW_LANES; ++lane) bits[lane] = (int32_t)((uint32_t)(first + lane) << 16);
        const row_hlanes halves = to_bf16_lanes(silu_lanes((row_lanes)bits));
        memcpy(aq_silu_bf16 + first, &halves, sizeof halves);
    }
}
