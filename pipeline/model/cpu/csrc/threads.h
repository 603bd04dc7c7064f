/* How many threads a CPU kernel call should use, and the pool that runs them (thread_pool.c).
 *
 * Even with the pool's workers awake, splitting a call costs a few microseconds of handing out
 * tasks and waiting for the last one, and a worker asleep between steps takes ~100 us to wake under
 * a hypervisor. So a call goes parallel only when its data is large enough to repay that.
 * Worked example (AQ_PARALLEL_BYTES = 256 KiB, 2 threads): a 576 x 576 bfloat16 weight (648 KiB)
 * runs on two threads; a 64 x 576 one (72 KiB) on one.
 */
#ifndef AQUEDUCT_THREADS_H
#define AQUEDUCT_THREADS_H

#include <stdint.h>

#ifndef AQ_PARALLEL_BYTES
#define AQ_PARALLEL_BYTES (256 << 10)
#endif

static inline int threads_for(int64_t bytes_read, int max_threads) {
    if (max_threads <= 1 || bytes_read < AQ_PARALLEL_BYTES) return 1;
    const int64_t useful = bytes_read / (AQ_PARALLEL_BYTES / 2);
    return useful < max_threads ? (int)useful : max_threads;
}

/* How many of a weight's output columns one task takes: at least `minimum`, and otherwise the
 * columns split into TASKS_PER_THREAD runs per thread. Each thread then streams long runs of
 * consecutive weight rows, which the hardware prefetchers follow; tasks of 32 columns handed out in
 * turn left each thread runs of ~9 KiB and halved the read rate (C harness, SmolLM2's 30 4-bit layers
 * from memory, 2 threads, Zen 4: 6.6 ms with 32 columns a task, 3.4-3.7 ms with one or two runs per
 * thread). Two per thread, not one, so that a thread the host holds off the CPU delays the call by at
 * most about half its share.
 * Worked example (2 threads): 3072 columns -> 768 a task; 576 -> 144. */
#define TASKS_PER_THREAD 2

static inline int64_t columns_per_task(int64_t total, int threads, int64_t minimum) {
    const int64_t runs = (int64_t)(threads > 1 ? threads : 1) * TASKS_PER_THREAD;
    const int64_t spread = (total + runs - 1) / runs;
    return spread > minimum ? spread : minimum;
}

/* Runs task(context, begin, end) over [0, total) in pieces of `grain` on the caller's thread and the
 * pool's workers (started up to `threads` - 1; a process asks for the same count throughout, its
 * compute threads); returns when all are done. threads <= 1 runs inline. */
typedef void (*pool_task)(void *context, int64_t begin, int64_t end);
void pool_run(pool_task task, void *context, int64_t total, int64_t grain, int threads);

#endif
