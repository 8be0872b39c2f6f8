/* Workload for unwinding through signal frames: main -> work -> leaf, interrupted every 2 ms of
 * CPU time by SIGPROF, whose handler (handler -> in_handler) spins for a while. Samples in the
 * handler must run on through the kernel's signal frame (glibc's __restore_rt, whose CFI reads the
 * interrupted registers from the signal context) into the interrupted function and on to main.
 * Usage: signal_handler CPU_SECONDS. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#define FN __attribute__((noipa))

volatile unsigned long sink;

FN void in_handler(void) {
    for (int i = 0; i < 1000000; i++)
        sink += i;
}

FN void handler(int sig) {
    (void)sig;
    in_handler();
    sink++; /* no tail call: handler keeps its frame */
}

FN void leaf(void) {
    for (int i = 0; i < 1000; i++)
        sink ^= i;
}

FN void work(double limit) {
    struct timespec used;
    for (;;) {
        for (int k = 0; k < 1000; k++)
            leaf();
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &used);
        if (used.tv_sec + used.tv_nsec / 1e9 >= limit)
            return;
    }
}

int main(int argc, char **argv) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigaction(SIGPROF, &sa, 0);
    struct itimerval every = {{0, 2000}, {0, 2000}};
    setitimer(ITIMER_PROF, &every, 0);
    work(argc > 1 ? atof(argv[1]) : 2.0);
    return 0;
}
