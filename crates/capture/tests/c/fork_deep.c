/* New processes with deep stacks from their first instant: the parent forks a child every few
 * tens of milliseconds; the child recurses DEPTH levels with 1 KiB of locals per frame, spins about
 * a millisecond in the leaf, returns and recurses again for CHILD_MS, and exits. Each child is
 * sampled before the profiler has read its fork record, as a build's compilers are.
 * Usage: fork_deep DEPTH SECONDS CHILD_MS */
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

volatile unsigned long sink;
static int depth;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void spin(void) {
    for (int i = 0; i < 300000; i++)
        sink += i;
}

__attribute__((noinline)) int recurse(int n) {
    volatile char pad[1024];
    pad[0] = (char)n;
    pad[1023] = 1;
    if (n == 0) {
        spin();
        return pad[1023];
    }
    return recurse(n - 1) + pad[0] + pad[1023];
}

__attribute__((noinline)) void child(double until) {
    while (now() < until)
        sink += (unsigned long)recurse(depth);
}

int main(int argc, char **argv) {
    depth = argc > 1 ? atoi(argv[1]) : 300;
    double end = now() + (argc > 2 ? atof(argv[2]) : 3.0);
    double child_s = (argc > 3 ? atof(argv[3]) : 30.0) / 1000.0;
    while (now() < end) {
        pid_t pid = fork();
        if (pid == 0) {
            child(now() + child_s);
            _exit(0);
        }
        if (pid < 0)
            return 1;
        waitpid(pid, NULL, 0);
    }
    return 0;
}
