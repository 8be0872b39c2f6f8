/* Ground truth for whole deep stacks: recurse DEPTH levels with 1 KiB of locals per frame, then
 * spin in a leaf for SECONDS so that nearly every sample sees the full depth.
 * Usage: deep DEPTH SECONDS main|thread
 * "main" recurses on the main thread (its stack limit raised to 64 MiB first), "thread" on a
 * second thread created with a 64 MiB stack while the main thread waits in pthread_join. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static int depth;
static double seconds;
volatile unsigned long sink;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void spin(void) {
    double end = now() + seconds;
    do {
        for (unsigned long i = 0; i < (1ul << 22); i++)
            sink += i;
    } while (now() < end);
}

__attribute__((noinline)) void recurse(int n) {
    volatile char pad[1024];
    pad[0] = (char)n;
    pad[sizeof pad - 1] = (char)n;
    if (n > 1)
        recurse(n - 1);
    else
        spin();
    sink += pad[0] + pad[sizeof pad - 1];
}

__attribute__((noinline)) void *worker(void *arg) {
    (void)arg;
    recurse(depth);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: deep DEPTH SECONDS main|thread\n");
        return 1;
    }
    depth = atoi(argv[1]);
    seconds = atof(argv[2]);
    const size_t stack = 64ul << 20;
    if (strcmp(argv[3], "main") == 0) {
        struct rlimit r = {stack, stack};
        getrlimit(RLIMIT_STACK, &r);
        if (r.rlim_cur != RLIM_INFINITY && r.rlim_cur < stack) {
            r.rlim_cur = r.rlim_max == RLIM_INFINITY || r.rlim_max > stack ? stack : r.rlim_max;
            if (setrlimit(RLIMIT_STACK, &r) != 0) {
                perror("setrlimit");
                return 1;
            }
        }
        worker(NULL);
        return 0;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, stack);
    pthread_t t;
    if (pthread_create(&t, &attr, worker, NULL) != 0) {
        perror("pthread_create");
        return 1;
    }
    pthread_join(t, NULL);
    return 0;
}
