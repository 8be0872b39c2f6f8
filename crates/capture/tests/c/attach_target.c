/* Target for rootline's attach test: two worker threads start at once, two more when the
 * process gets SIGUSR1 (after the profiler attached). Every worker spins for RUN_SECONDS and
 * records the longest pause between two of its loop iterations by its own clock; at exit each
 * prints "tid <tid> iterations <n> max_gap_us <us>". */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t spawn_late;
static double run_seconds = 4.0;
volatile unsigned long sink;

struct result { pid_t tid; unsigned long iterations; long max_gap_us; };
static struct result results[4];

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noipa)) static void spin(void) {
    for (int i = 0; i < 2000; i++)
        sink += i;
}

static void *worker(void *arg) {
    struct result *r = arg;
    r->tid = gettid();
    double start = now(), last = start, t;
    while ((t = now()) - start < run_seconds) {
        long gap = (long)((t - last) * 1e6);
        if (gap > r->max_gap_us)
            r->max_gap_us = gap;
        last = t;
        spin();
        r->iterations++;
    }
    return 0;
}

static void on_usr1(int sig) { (void)sig; spawn_late = 1; }

int main(int argc, char **argv) {
    if (argc > 1)
        run_seconds = atof(argv[1]);
    signal(SIGUSR1, on_usr1);
    pthread_t t[4];
    pthread_create(&t[0], 0, worker, &results[0]);
    pthread_create(&t[1], 0, worker, &results[1]);
    printf("ready\n");
    fflush(stdout);
    while (!spawn_late)
        usleep(1000);
    pthread_create(&t[2], 0, worker, &results[2]);
    pthread_create(&t[3], 0, worker, &results[3]);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], 0);
    for (int i = 0; i < 4; i++)
        printf("tid %d iterations %lu max_gap_us %ld\n", results[i].tid, results[i].iterations,
               results[i].max_gap_us);
    return 0;
}
