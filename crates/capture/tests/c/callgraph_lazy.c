/* Ground-truth workload for ld.so's lazy-binding trampoline: main -> work -> a -> a library call
 * through the PLT. Run with LD_BIND_NOT=1, so ld.so never writes the resolved address back and
 * every call goes through `_dl_runtime_resolve_*` (whose CFI bases the frame on rbx) and
 * `_dl_fixup` again. Usage: LD_BIND_NOT=1 callgraph_lazy CPU_SECONDS. */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define FN __attribute__((noipa))

volatile unsigned long sink;

FN void a(void) {
    for (int i = 0; i < 64; i++)
        sink += (unsigned long)getpagesize();
}

FN void work(double limit) {
    struct timespec used;
    for (;;) {
        for (int k = 0; k < 100; k++)
            a();
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &used);
        if (used.tv_sec + used.tv_nsec / 1e9 >= limit)
            return;
    }
}

int main(int argc, char **argv) {
    if (!getenv("LD_BIND_NOT"))
        return 2;
    work(argc > 1 ? atof(argv[1]) : 5.0);
    return 0;
}
