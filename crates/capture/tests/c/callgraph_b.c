/* The tail-calling half of the ground-truth workload (see callgraph_main.c). */
#define FN __attribute__((noipa))

extern volatile unsigned long sink;

FN void leaf_tail(int n) {
    for (int i = 0; i < n; i++)
        sink ^= i;
}

FN void b(int n) {
    leaf_tail(n);
}
