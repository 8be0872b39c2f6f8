/* A busy loop under one large stack frame: big() holds KIB KiB of locals (more than a sample's
 * stack copy) and calls work(), which calls a() and b() (each spinning in leaf()) until SECONDS
 * have passed. Every stack is shallow but longer than the copy, and the frames just inside the
 * copy are re-entered thousands of times a second.
 * Usage: bigframe SECONDS (built with -DKIB=N) */
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

__attribute__((noinline)) void a(void) { leaf(200); }

__attribute__((noinline)) void b(void) { leaf(300); }

__attribute__((noinline)) void work(double seconds) {
    double end = now() + seconds;
    while (now() < end) {
        a();
        b();
    }
}

__attribute__((noinline)) void big(double seconds) {
    volatile char buf[KIB * 1024];
    buf[0] = 1;
    buf[sizeof buf - 1] = 2;
    work(seconds);
    sink += buf[0] + buf[sizeof buf - 1];
}

int main(int argc, char **argv) {
    big(argc > 1 ? atof(argv[1]) : 3.0);
    return 0;
}
