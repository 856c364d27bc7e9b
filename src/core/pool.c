/* A small thread pool: numbered tasks handed out by an atomic claim. The
 * caller's thread works too. Results never depend on which thread ran what,
 * because tasks write to their own slots and reductions happen afterwards
 * in task order.
 *
 * Waiting spins for a while before it sleeps. Waking a sleeping thread takes
 * a system call on each side and, on a virtual machine whose idle vCPU was
 * halted, far longer: with workers that slept at once, KIVI-2 attention over
 * 2048 tokens (one decode step, two runs, in cache) took as long on 2
 * threads of a KVM guest as on one (medians 0.79 and 0.78 ms); with the spin
 * 2 threads took 0.46-0.59 ms. Workers that keep polling for SPIN_SECONDS after a run,
 * and a caller that polls for their end, take the next run at once when
 * runs follow each other, as the layers of a decode step do; after a longer
 * pause they sleep.
 *
 * The caller waits for tasks, not for workers. A run ends when all its
 * tasks are done, whoever ran them; a worker that was not scheduled in the
 * meantime (another program on the same cores) joins late, finds nothing
 * left and goes back to waiting. Waiting for every worker to check in, as
 * this pool once did, made each run of such a step wait for the other
 * program's time slice: `generate` of the reference model on 2 threads of
 * a 2-core KVM guest, beside one busy process, ran at 5 tokens/s that way
 * and at 72-94 this way (~180-210 alone, either way). Tasks are claimed
 * with a compare-and-swap on one word holding the run's number and its
 * next task, so a late worker can never take a task of a later run.
 */
#include "vq_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define SPIN_SECONDS 2e-3

typedef void (*task_fn)(void *, int, int);

struct vq_pool {
    int n_threads;             /* including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    atomic_uint_fast64_t generation; /* the run's number, bumped for each run under mu */
    atomic_int stopping;
    /* The run in flight, written before generation is bumped. Atomic
     * because a late worker may read them while the caller writes the next
     * run's; it uses them only after its claim proved them current. */
    _Atomic(task_fn) fn;
    _Atomic(void *) ctx;
    atomic_int n_tasks;
    /* (run number mod 2^32) << 32 | the next task to hand out */
    atomic_uint_fast64_t claim;
    atomic_int tasks_done;
};

typedef struct {
    vq_pool *pool;
    int index;
} worker_arg;

static void cpu_relax(void) {
#if defined(__x86_64__)
    _mm_pause();
#endif
}

/* Runs tasks of run `run` until none is left to claim. fn, ctx and n_tasks
 * are read between loading the claim word and claiming: vq_pool_run closes
 * the old run's word before it writes the next run's fields, so a claim that
 * succeeds proves they were this run's when read. The thread that finishes
 * a run's last task wakes the caller if it sleeps (the caller finishing it
 * needs no wake-up). */
static void drain(vq_pool *p, uint32_t run, int thread) {
    for (;;) {
        uint_fast64_t v = atomic_load(&p->claim);
        if ((uint32_t)(v >> 32) != run) return;
        uint32_t t = (uint32_t)v;
        int n = atomic_load(&p->n_tasks);
        task_fn fn = atomic_load(&p->fn);
        void *ctx = atomic_load(&p->ctx);
        if (t >= (uint32_t)n) return;
        if (!atomic_compare_exchange_weak(&p->claim, &v, v + 1)) continue;
        fn(ctx, (int)t, thread);
        if (atomic_fetch_add(&p->tasks_done, 1) + 1 == n && thread != 0) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

/* Polls until generation differs from seen, stopping is set, or the spin
 * time is over; true if something happened. */
static bool spin_for_run(vq_pool *p, uint64_t seen) {
    double t0 = vq_time_now();
    for (int i = 1;; i++) {
        if (atomic_load(&p->generation) != seen || atomic_load(&p->stopping)) return true;
        cpu_relax();
        if (i % 256 == 0 && vq_time_now() - t0 > SPIN_SECONDS) return false;
    }
}

static void *worker_main(void *arg) {
    worker_arg *w = arg;
    vq_pool *p = w->pool;
    int index = w->index;
    free(w);
    uint64_t seen = 0;
    for (;;) {
        if (!spin_for_run(p, seen)) {
            pthread_mutex_lock(&p->mu);
            while (!atomic_load(&p->stopping) && atomic_load(&p->generation) == seen)
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stopping)) break;
        seen = atomic_load(&p->generation);
        drain(p, (uint32_t)seen, index);
    }
    return NULL;
}
vq_status vq_pool_create(int n_threads, vq_pool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 256)
        return vq_fail(VQ_ERR_ARG, "thread count %d is out of range [1, 256]", n_threads);
    vq_pool *p = calloc(1, sizeof *p);
    if (!p) return vq_fail(VQ_ERR_NOMEM, "out of memory creating a thread pool");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) {
            vq_pool_free(p);
            return vq_fail(VQ_ERR_NOMEM, "out of memory creating a thread pool");
        }
        for (int i = 1; i < n_threads; i++) {
            worker_arg *w = malloc(sizeof *w);
            int started = 0;
            if (w) {
                w->pool = p;
                w->index = i;
                started = pthread_create(&p->threads[i - 1], NULL, worker_main, w) == 0;
            }
            if (!started) {
                free(w);
                p->n_threads = i; /* free joins the ones that started */
                vq_pool_free(p);
                return vq_fail(VQ_ERR_NOMEM, "could not start thread %d of %d", i, n_threads);
            }
        }
    }
    *out = p;
    return VQ_OK;
}

void vq_pool_free(vq_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stopping, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p);
}

int vq_pool_threads(const vq_pool *p) { return p ? p->n_threads : 1; }

void vq_pool_run(vq_pool *p, int n_tasks, void (*fn)(void *, int, int), void *ctx) {
    if (n_tasks <= 0) return;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    uint32_t run = (uint32_t)atomic_load(&p->generation) + 1;
    /* Closed first: a worker still on the previous run can no longer claim
     * (the run number differs) while the fields change, nor can anyone
     * before the run opens (no task number is that high). */
    atomic_store(&p->claim, (uint_fast64_t)run << 32 | UINT32_MAX);
    atomic_store(&p->fn, fn);
    atomic_store(&p->ctx, ctx);
    atomic_store(&p->n_tasks, n_tasks);
    atomic_store(&p->tasks_done, 0);
    atomic_store(&p->claim, (uint_fast64_t)run << 32); /* open: task 0 next */
    /* the bump wakes the workers (spinning ones see it at once); under mu,
     * so a worker about to sleep sees it */
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->generation, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    drain(p, run, 0);
    double t0 = vq_time_now();
    for (int i = 1; atomic_load(&p->tasks_done) < n_tasks; i++) {
        cpu_relax();
        if (i % 256 == 0 && vq_time_now() - t0 > SPIN_SECONDS) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->tasks_done) < n_tasks) pthread_cond_wait(&p->done, &p->mu);
            pthread_mutex_unlock(&p->mu);
            break;
        }
    }
}
