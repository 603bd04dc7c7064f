/* A small thread pool for the decode kernels: workers that stay awake through a step, sleep between
 * steps, and are never waited for unless they took work.
 *
 * Why not OpenMP: a decode step makes ~150 parallel calls of 50-300 us each with Python between
 * them. With libgomp's passive wait every call woke a sleeping thread, ~120 us under KVM (a
 * halted vCPU needs an interrupt from the host), as long as the work itself; with active waiting
 * a busy host was a disaster (a region ends only when every thread reaches its barrier, so one
 * descheduled thread stalled the step: median steps 90-400 ms spinning vs 38-69 passive with one
 * other busy process, bfloat16 SmolLM2).
 *
 * Here a call is split into tasks that threads claim from a shared cursor. The caller claims too
 * and waits only for tasks others claimed and have not finished; a worker that is asleep or
 * descheduled simply claims nothing. After its last task a worker polls for AQ_POOL_SPIN_US (a
 * step's calls arrive well within that), then sleeps on a futex until the next call. It polls with
 * sched_yield, not a pause loop: on an idle core that returns at once, and on a core another
 * process wants it hands the core over (SmolLM2 bfloat16 decode on a 2-core KVM box with one other
 * busy process: median step 42-83 ms yielding vs 107-120 ms pausing; alone about the same).
 *
 * The cursor packs the call's generation with the next task index (generation << 32 | index), so a
 * worker that read an older call's description can never claim a task of a newer one: its
 * compare-and-swap fails once the generation moved on.
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "threads.h"

#ifndef AQ_POOL_SPIN_US
#define AQ_POOL_SPIN_US 2000
#endif
#define MAX_WORKERS 63

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

typedef struct {
    pool_task task;
    void *context;
    int64_t total, grain;
} Call;

static Call current;                   /* the call being run; written by the caller only */
static uint64_t cursor;                /* generation << 32 | next task index */
static int64_t finished;               /* tasks of the current call that are done */
static uint32_t generation;            /* the futex word: bumped once per call */
static int32_t sleepers;               /* workers in futex_wait */
static int workers_started;
static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int is_worker;         /* a task calling pool_run again runs it inline */

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* Claims and runs tasks of call `gen` until none are left; returns how many this thread ran. */
static int64_t run_tasks(uint32_t gen, const Call *call) {
    int64_t ran = 0;
    uint64_t seen = __atomic_load_n(&cursor, __ATOMIC_ACQUIRE);
    for (;;) {
        if ((uint32_t)(seen >> 32) != gen) return ran;
        const int64_t index = (int64_t)(seen & 0xFFFFFFFFu);
        if (index * call->grain >= call->total) return ran;
        if (!__atomic_compare_exchange_n(&cursor, &seen, seen + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            continue; /* `seen` now holds the cursor's current value */
        const int64_t begin = index * call->grain;
        const int64_t end = begin + call->grain < call->total ? begin + call->grain : call->total;
        call->task(call->context, begin, end);
        __atomic_add_fetch(&finished, end - begin, __ATOMIC_ACQ_REL);
        ran++;
        seen = __atomic_load_n(&cursor, __ATOMIC_ACQUIRE);
    }
}

static void *worker_main(void *unused) {
    (void)unused;
    is_worker = 1;
    uint32_t last = __atomic_load_n(&generation, __ATOMIC_ACQUIRE);
    for (;;) {
        double idle_since = now_us();
        uint32_t gen;
        while ((gen = __atomic_load_n(&generation, __ATOMIC_ACQUIRE)) == last) {
            sched_yield(); /* returns at once on an idle core; on a busy one, lets the other process run */
            if (now_us() - idle_since < AQ_POOL_SPIN_US) continue;
            __atomic_add_fetch(&sleepers, 1, __ATOMIC_SEQ_CST);
            syscall(SYS_futex, &generation, FUTEX_WAIT_PRIVATE, last, NULL, NULL, 0);
            __atomic_sub_fetch(&sleepers, 1, __ATOMIC_ACQ_REL);
            idle_since = now_us();
        }
        last = gen;
        /* The description is the call `gen`'s unless that call is over, and then no claim succeeds. */
        Call call;
        call.task = __atomic_load_n(&current.task, __ATOMIC_ACQUIRE);
        call.context = __atomic_load_n(&current.context, __ATOMIC_ACQUIRE);
        call.total = __atomic_load_n(&current.total, __ATOMIC_ACQUIRE);
        call.grain = __atomic_load_n(&current.grain, __ATOMIC_ACQUIRE);
        if (call.grain > 0) run_tasks(gen, &call);
    }
    return NULL;
}

static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER; /* one call at a time */
static pthread_once_t fork_handler_once = PTHREAD_ONCE_INIT;

/* A forked child has none of the parent's workers: it starts its own on its first parallel call. */
static void forget_workers_in_child(void) {
    workers_started = 0;
    sleepers = 0;
    pthread_mutex_init(&start_lock, NULL);
    pthread_mutex_init(&call_lock, NULL);
}

static void register_fork_handler(void) { pthread_atfork(NULL, NULL, forget_workers_in_child); }

/* Starts workers up to `wanted` (never stops them: they sleep when idle). Returns how many run. */
static int ensure_workers(int wanted) {
    if (wanted > MAX_WORKERS) wanted = MAX_WORKERS;
    if (__atomic_load_n(&workers_started, __ATOMIC_ACQUIRE) >= wanted) return wanted;
    pthread_once(&fork_handler_once, register_fork_handler);
    pthread_mutex_lock(&start_lock);
    while (workers_started < wanted) {
        pthread_t thread;
        if (pthread_create(&thread, NULL, worker_main, NULL) != 0) break;
        pthread_detach(thread);
        __atomic_add_fetch(&workers_started, 1, __ATOMIC_ACQ_REL);
    }
    const int started = workers_started;
    pthread_mutex_unlock(&start_lock);
    return started < wanted ? started : wanted;
}

void pool_run(pool_task task, void *context, int64_t total, int64_t grain, int threads) {
    if (total <= 0) return;
    if (grain < 1) grain = 1;
    if (threads <= 1 || total <= grain || is_worker || ensure_workers(threads - 1) < 1) {
        task(context, 0, total);
        return;
    }
    pthread_mutex_lock(&call_lock);
    /* The cursor moves to the new generation before the description changes: a worker still holding
     * the last call's generation may have read a mix of the old and new fields (say the new task with
     * the old context, or the new total), and must not be able to claim anything with it. While the
     * cursor held the old generation (every task claimed), a larger new total used to reopen it. */
    const uint32_t gen = __atomic_load_n(&generation, __ATOMIC_ACQUIRE) + 1;
    __atomic_store_n(&cursor, (uint64_t)gen << 32, __ATOMIC_SEQ_CST);
    __atomic_store_n(&finished, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&current.task, task, __ATOMIC_RELEASE);
    __atomic_store_n(&current.context, context, __ATOMIC_RELEASE);
    __atomic_store_n(&current.total, total, __ATOMIC_RELEASE);
    __atomic_store_n(&current.grain, grain, __ATOMIC_RELEASE);
    /* Then the generation: a worker that sees it reads this call's description whole, and its tasks open. */
    __atomic_store_n(&generation, gen, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&sleepers, __ATOMIC_SEQ_CST) > 0)
        syscall(SYS_futex, &generation, FUTEX_WAKE_PRIVATE, MAX_WORKERS, NULL, NULL, 0);
    const Call call = {task, context, total, grain};
    run_tasks(gen, &call);
    /* Only tasks another thread claimed are left; yield so a preempted claimer on this core can finish. */
    for (int spins = 0; __atomic_load_n(&finished, __ATOMIC_ACQUIRE) < total; spins++) {
        if (spins < 4096)
            CPU_RELAX();
        else
            sched_yield();
    }
    pthread_mutex_unlock(&call_lock);
}
