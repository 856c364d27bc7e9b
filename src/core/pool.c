/* A small thread pool: numbered tasks handed out by an atomic counter. The
 * caller's thread works too. Results never depend on which thread ran what,
 * because tasks write to their own slots and reductions happen afterwards
 * in task order. */
#include "vq_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct vq_pool {
    int n_threads;             /* including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    uint64_t generation;       /* bumped for each run */
    int stopping;
    /* the job in flight */
    void (*fn)(void *, int, int);
    void *ctx;
    int n_tasks;
    atomic_int next_task;
    int workers_busy;
};

typedef struct {
    vq_pool *pool;
    int index;
} worker_arg;

static void drain(vq_pool *p, int thread) {
    for (;;) {
        int t = atomic_fetch_add(&p->next_task, 1);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, t, thread);
    }
}

static void *worker_main(void *arg) {
    worker_arg *w = arg;
    vq_pool *p = w->pool;
    int index = w->index;
    free(w);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stopping && p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
        if (p->stopping) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        drain(p, index);
        pthread_mutex_lock(&p->mu);
        if (--p->workers_busy == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
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
    p->stopping = 1;
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
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store(&p->next_task, 0);
    p->workers_busy = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    drain(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->workers_busy > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
