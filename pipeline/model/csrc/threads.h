/* How many threads a CPU kernel call should use.
 *
 * Waking a sleeping OpenMP thread is expensive under a hypervisor: with OMP_WAIT_POLICY=PASSIVE
 * (the default here: spinning threads starve other processes on a shared host) one parallel
 * region on a 2-core KVM box cost ~120 us more than the same call on one thread. A decode step
 * makes hundreds of kernel calls on small weights, so a call only goes parallel when its data is
 * large enough for the second thread to save more than the wake-up costs.
 * Worked example (AQ_PARALLEL_BYTES = 4 MiB, 2 threads): a 576 x 576 bfloat16 weight (648 KiB)
 * runs on one thread; the 49152 x 576 LM head (54 MiB) on two.
 */
#ifndef AQUEDUCT_THREADS_H
#define AQUEDUCT_THREADS_H

#include <stdint.h>

#ifndef AQ_PARALLEL_BYTES
#define AQ_PARALLEL_BYTES (4 << 20)
#endif

static inline int threads_for(int64_t bytes_read, int max_threads) {
    if (max_threads <= 1 || bytes_read < AQ_PARALLEL_BYTES) return 1;
    const int64_t useful = bytes_read / (AQ_PARALLEL_BYTES / 2);
    return useful < max_threads ? (int)useful : max_threads;
}

#endif
