/* Ground-truth workload for rootline's unwinding tests: a known call graph
 *   main -> work -> a -> leaf          worker -> work -> a -> leaf
 *   main -> work -> b -> leaf_tail     worker -> work -> b -> leaf_tail
 * (b tail-calls leaf_tail when sibling calls are optimised, making work -> leaf_tail real).
 * Usage: callgraph CPU_SECONDS WORKERS [ITERATIONS]. A watcher thread stops every worker once the
 * process has used CPU_SECONDS of CPU time; with ITERATIONS > 0 each thread instead does that many
 * loop iterations (fixed work, for benchmarks) and the process prints its CPU time at exit. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define FN __attribute__((noipa))

volatile int stop;
volatile unsigned long sink;
static long iterations;

FN void b(int n);

FN void leaf(int n) {
    for (int i = 0; i < n; i++)
        sink += i;
}

FN void a(int n) {
    leaf(n);
    sink++;
}

FN void work(void) {
    for (long i = 0; !stop && (iterations == 0 || i < iterations); i++) {
        a(40);
        b(40);
    }
}

FN void *worker(void *arg) {
    (void)arg;
    work();
    return 0;
}

FN void *watcher(void *arg) {
    double limit = *(double *)arg;
    struct timespec pause = {0, 20 * 1000 * 1000}, used;
    for (;;) {
        nanosleep(&pause, 0);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &used);
        if (used.tv_sec + used.tv_nsec / 1e9 >= limit) {
            stop = 1;
            return 0;
        }
    }
}

int main(int argc, char **argv) {
    double limit = argc > 1 ? atof(argv[1]) : 5.0;
    int workers = argc > 2 ? atoi(argv[2]) : 1;
    iterations = argc > 3 ? atol(argv[3]) : 0;
    pthread_t watch, threads[64];
    if (workers > 64)
        workers = 64;
    if (iterations == 0)
        pthread_create(&watch, 0, watcher, &limit);
    for (int i = 0; i < workers; i++)
        pthread_create(&threads[i], 0, worker, 0);
    work();
    for (int i = 0; i < workers; i++)
        pthread_join(threads[i], 0);
    if (iterations == 0) {
        pthread_join(watch, 0);
    } else {
        struct timespec used;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &used);
        printf("cpu_seconds %.6f\n", used.tv_sec + used.tv_nsec / 1e9);
    }
    return 0;
}
