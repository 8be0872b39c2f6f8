/* Many context switches: two threads hand a byte back and forth over two pipes ROUNDS times. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#ifndef ROUNDS
#define ROUNDS 20000
#endif

static int a[2], b[2];

static void *peer(void *arg) {
    (void)arg;
    char c;
    for (long i = 0; i < ROUNDS; i++)
        if (read(a[0], &c, 1) != 1 || write(b[1], &c, 1) != 1) exit(2);
    return NULL;
}

int main(void) {
    if (pipe(a) || pipe(b)) return 1;
    pthread_t t;
    if (pthread_create(&t, NULL, peer, NULL)) return 1;
    char c = 'x';
    for (long i = 0; i < ROUNDS; i++)
        if (write(a[1], &c, 1) != 1 || read(b[0], &c, 1) != 1) return 2;
    pthread_join(t, NULL);
    return 0;
}
