/* Stress harness for csrc/thread_pool.c (tests/pipeline/model/cpu/test_thread_pool.py builds and runs it).
 *
 * Consecutive calls alternate a 4-task and a 64-task call, each with its own task function and context,
 * and count how often every index ran. A worker that lags one call behind must never claim a task with
 * a description mixed from two calls: each index runs exactly once and only with its own context. The
 * pool before the fix (the cursor moved only after the description was rewritten) failed this within
 * 300,000 calls on every run on a 2-core box; it is a use-after-free in the kernels. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "threads.h"

typedef struct {
    int64_t token, total;
    int64_t *hits;
} Context;

static int64_t foreign_tasks; /* a task that saw another call's context or ran past its total */

static void count(Context *context, int64_t token, int64_t begin, int64_t end) {
    if (context->token != token || end > context->total) __atomic_add_fetch(&foreign_tasks, 1, __ATOMIC_RELAXED);
    for (int64_t i = begin; i < end && i < context->total; i++) __atomic_add_fetch(&context->hits[i], 1, __ATOMIC_RELAXED);
}

static void small_task(void *context, int64_t begin, int64_t end) { count(context, 0xA, begin, end); }
static void large_task(void *context, int64_t begin, int64_t end) { count(context, 0xB, begin, end); }

int main(int argc, char **argv) {
    const long calls = argc > 1 ? atol(argv[1]) : 300000;
    int64_t small_hits[4], large_hits[64];
    long miscounted = 0;
    for (long n = 0; n < calls; n++) {
        const int small = n % 2 == 0;
        Context context = {small ? 0xA : 0xB, small ? 4 : 64, small ? small_hits : large_hits};
        for (int64_t i = 0; i < context.total; i++) context.hits[i] = 0;
        pool_run(small ? small_task : large_task, &context, context.total, 1, 3);
        for (int64_t i = 0; i < context.total; i++) miscounted += context.hits[i] != 1;
        context.token = -1; /* a task still running after pool_run returned would see this */
    }
    printf("calls=%ld foreign_tasks=%ld miscounted=%ld\n", calls, (long)foreign_tasks, miscounted);
    return foreign_tasks || miscounted;
}
