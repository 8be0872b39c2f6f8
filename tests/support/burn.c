/* A small, known workload for the tests that record with perf: main -> rl_outer -> rl_middle ->
 * rl_leaf, repeated until the process has used the CPU time asked for (milliseconds, argv[1]). */
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) unsigned long rl_leaf(unsigned long n) {
    volatile unsigned long s = 0;
    for (unsigned long i = 0; i < n; i++) s += i * i;
    return s;
}

__attribute__((noinline)) unsigned long rl_middle(unsigned long n) { return rl_leaf(n) + 1; }

__attribute__((noinline)) unsigned long rl_outer(unsigned long n) { return rl_middle(n) + 1; }

int main(int argc, char **argv) {
    long ms = argc > 1 ? atol(argv[1]) : 300;
    unsigned long total = 0;
    while ((double)clock() * 1000.0 / CLOCKS_PER_SEC < (double)ms) total += rl_outer(100000);
    return total == 42;
}
