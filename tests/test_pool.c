/* The thread pool: every task of every run runs exactly once, before
 * vq_pool_run returns, on a thread index in [0, threads) that no other
 * thread uses at the same time; with more threads than cores and some slow
 * tasks, so that workers join runs late (the case where a late worker must
 * not take a task of a later run: an earlier version of the pool let one
 * run a task of the next run with that run's fields, found here as a task
 * run twice). */
#include "check.h"
#include "veloxquant.h"

#include <stdatomic.h>
#include <string.h>
#include <time.h>

#define MAX_TASKS 64
#define MAX_THREADS 8

typedef struct {
    int run, threads;
    atomic_int count[MAX_TASKS];    /* runs of each task in this run */
    atomic_int owner[MAX_THREADS];  /* 1 while a thread index is in use */
    atomic_int bad_thread, overlap;
} job;

static void task(void *ctx, int t, int thread) {
    job *j = ctx;
    if (thread < 0 || thread >= j->threads) {
        atomic_store(&j->bad_thread, 1);
        return;
    }
    if (atomic_exchange(&j->owner[thread], 1)) atomic_store(&j->overlap, 1);
    atomic_fetch_add(&j->count[t], 1);
    if ((t + j->run) % 7 == 0) { /* a slow task now and then: others finish first */
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    atomic_store(&j->owner[thread], 0);
}

int main(void) {
    int threads[] = {2, 3, 4, 8};
    static job j;
    for (int ti = 0; ti < 4; ti++) {
        vq_pool *p;
        CHECK(vq_pool_create(threads[ti], &p) == VQ_OK, "create %d threads", threads[ti]);
        CHECK(vq_pool_threads(p) == threads[ti], "%d threads reported", vq_pool_threads(p));
        int wrong = 0;
        for (int run = 0; run < 1000; run++) {
            int n = 1 + (run * 37) % MAX_TASKS;
            memset(&j, 0, sizeof j);
            j.run = run;
            j.threads = threads[ti];
            vq_pool_run(p, n, task, &j);
            for (int t = 0; t < MAX_TASKS; t++) wrong += atomic_load(&j.count[t]) != (t < n ? 1 : 0);
            wrong += atomic_load(&j.bad_thread) + atomic_load(&j.overlap);
            if (run % 250 == 0) { /* a pause: workers fall asleep, then must wake for the next run */
                struct timespec ts = {0, 3000000};
                nanosleep(&ts, NULL);
            }
        }
        CHECK(wrong == 0, "%d threads: %d wrong task counts, thread indices or overlaps", threads[ti], wrong);
        vq_pool_free(p);
    }
    return check_done();
}
