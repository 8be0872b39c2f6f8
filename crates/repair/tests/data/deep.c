/* A native workload for the no-false-positive test: the main thread recurses to depths that sweep, one by one,
 * 20..400 (well past perf's 127-frame cap), spinning at the bottom; every stack is whole.
 * Usage: deep SECONDS */
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline)) static void spin(unsigned n) {
    for (unsigned i = 0; i < n; i++) sink += i ^ (sink >> 3);
}

__attribute__((noinline)) static void down(int depth) {
    if (depth == 0) {
        spin(200000);
        return;
    }
    down(depth - 1);
    sink++; /* not a tail call */
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1.0;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (int round = 0;; round++) {
        down(20 + round % 381);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 > seconds) break;
    }
    return 0;
}
