/* Deep stacks that are rebuilt: the main thread and a second thread each recurse DEPTH levels with
 * 1 KiB of locals per frame, spin about a millisecond in the leaf, return all the way to their
 * loop and recurse again, for SECONDS. Each thread's stack is gone and rebuilt hundreds of times a
 * second, as a compiler's or a request handler's is. Usage: rebuild DEPTH SECONDS [CHILD_MS]
 * (the main thread needs `ulimit -s` above DEPTH KiB). With CHILD_MS, new processes instead: the
 * main thread forks a child after child, each doing the same on its main thread for CHILD_MS and
 * exiting, so that every child is sampled from its first instant, as a build's compilers are. */
#include <pthread.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

volatile unsigned long sink;
static int depth;
static double end;

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

__attribute__((noinline)) void cycle(void) {
    while (now() < end)
        sink += (unsigned long)recurse(depth);
}

__attribute__((noinline)) void *second(void *arg) {
    (void)arg;
    cycle();
    return NULL;
}

/* Forks a child after child until `until`; each runs `cycle` for `child_s` seconds. */
__attribute__((noinline)) static int children(double until, double child_s) {
    while (now() < until) {
        pid_t pid = fork();
        if (pid == 0) {
            end = now() + child_s;
            cycle();
            _exit(0);
        }
        if (pid < 0)
            return 1;
        waitpid(pid, NULL, 0);
    }
    return 0;
}

int main(int argc, char **argv) {
    depth = argc > 1 ? atoi(argv[1]) : 1000;
    end = now() + (argc > 2 ? atof(argv[2]) : 3.0);
    if (argc > 3)
        return children(end, atof(argv[3]) / 1000.0);
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, (size_t)(depth + 64) * 1100 + (1 << 20));
    pthread_t t;
    pthread_create(&t, &a, second, NULL);
    cycle();
    pthread_join(t, NULL);
    return 0;
}
