/* Outer frames that change under an unchanged inner stack: main alternates every PHASE_MS
 * milliseconds between outer_a and outer_b, which have the same frame layout and both recurse
 * DEPTH levels (1 KiB of locals per frame) into the same `recurse`, ending in spin_a or spin_b.
 * Deep in the recursion the stack pointer, frame pointer and return addresses are identical in
 * both phases; only the outermost frames (outer_a or outer_b) and the leaf differ. A profiler
 * that reuses outer frames without proof shows spin_a under outer_b or the reverse.
 * Usage: alternate DEPTH SECONDS PHASE_MS */
#include <stdlib.h>
#include <time.h>

typedef void (*leaf_fn)(double);
static int depth;
volatile unsigned long sink;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void spin_a(double until) {
    do {
        for (unsigned long i = 0; i < (1ul << 16); i++)
            sink += i;
    } while (now() < until);
}

__attribute__((noinline)) void spin_b(double until) {
    do {
        for (unsigned long i = 0; i < (1ul << 16); i++)
            sink += i ^ 1;
    } while (now() < until);
}

__attribute__((noinline)) void recurse(int n, leaf_fn leaf, double until) {
    volatile char pad[1024];
    pad[0] = (char)n;
    pad[sizeof pad - 1] = (char)n;
    if (n > 1)
        recurse(n - 1, leaf, until);
    else
        leaf(until);
    sink += pad[0] + pad[sizeof pad - 1];
}

__attribute__((noinline)) void outer_a(double until) {
    recurse(depth, spin_a, until);
    sink += 1;
}

__attribute__((noinline)) void outer_b(double until) {
    recurse(depth, spin_b, until);
    sink += 2;
}

int main(int argc, char **argv) {
    depth = argc > 1 ? atoi(argv[1]) : 1000;
    double end = now() + (argc > 2 ? atof(argv[2]) : 3.0);
    double phase = (argc > 3 ? atof(argv[3]) : 20.0) / 1000.0;
    while (now() < end) {
        outer_a(now() + phase);
        outer_b(now() + phase);
    }
    return 0;
}
