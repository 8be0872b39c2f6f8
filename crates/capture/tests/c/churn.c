/* Thread churn: keeps creating short-lived threads (8 at a time, each spinning briefly in a leaf)
 * for SECONDS of wall time, so that many samples catch a thread in its first instructions.
 * Usage: churn SECONDS */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void leaf(int n) {
    for (int i = 0; i < n; i++)
        sink += i;
}

__attribute__((noinline)) void *worker(void *arg) {
    (void)arg;
    leaf(20000);
    return NULL;
}

int main(int argc, char **argv) {
    double end = now() + (argc > 1 ? atof(argv[1]) : 3.0);
    while (now() < end) {
        pthread_t t[8];
        for (int i = 0; i < 8; i++)
            pthread_create(&t[i], NULL, worker, NULL);
        for (int i = 0; i < 8; i++)
            pthread_join(t[i], NULL);
    }
    return 0;
}
