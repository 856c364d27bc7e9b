/* A small thread pool: numbered tasks handed out by an atomic counter. The
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
 */
#include "vq_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define SPIN_SECONDS 2e-3

struct vq_pool {
    int n_threads;             /* including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    atomic_uint_fast64_t generation; /* bumped for each run, under mu */
    atomic_int stopping;
    /* the job in flight, written before generation is bumped */
    void (*fn)(void *, int, int);
    void *ctx;
    int n_tasks;
    atomic_int next_task;
    atomic_int workers_busy;
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

static void drain(vq_pool *p, int thread) {
    for (;;) {
        int t = atomic_fetch_add(&p->next_task, 1);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, t, thread);
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
        drain(p, index);
        if (atomic_fetch_sub(&p->workers_busy, 1) == 1) {
            /* the last one out: wake the caller if it went to sleep */
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
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
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store(&p->next_task, 0);
    atomic_store(&p->workers_busy, p->n_threads - 1);
    /* the bump publishes the job to spinning workers (sequentially
     * consistent atomics); under mu, so a worker about to sleep sees it */
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->generation, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    drain(p, 0);
    double t0 = vq_time_now();
    for (int i = 1; atomic_load(&p->workers_busy) > 0; i++) {
        cpu_relax();
        if (i % 256 == 0 && vq_time_now() - t0 > SPIN_SECONDS) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->workers_busy) > 0) pthread_cond_wait(&p->done, &p->mu);
            pthread_mutex_unlock(&p->mu);
            break;
        }
    }
}
