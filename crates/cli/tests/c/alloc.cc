// Ground truth for `rootline record --alloc`: `path_a` allocates three quarters of the bytes and
// `path_b` one quarter, through malloc, calloc, realloc and C++ new, sizes from 16 B to 1 MiB.
// `path_b` runs on a second thread, started first, taking turns with the main thread.
// Prints the bytes each path asked for. With the argument `wait` it first waits for a line on
// stdin (so a recorder can attach with -p). ROUNDS sets the number of path_a allocations.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>
#include <pthread.h>
#include <semaphore.h>

#ifndef ROUNDS
#define ROUNDS 20000
#endif

static unsigned long long state = 88172645463325252ull;

static unsigned long long next_random()
{
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

// 16 B to 1 MiB - 1: a power of two from 16 to 512 KiB, plus up to as much again.
static size_t pick_size()
{
    size_t base = size_t(16) << (next_random() % 16);
    return base + next_random() % base;
}

// A pause every 64 allocations, so that the recorder's reader keeps up with the samples (a
// third of these large allocations is sampled).
static void pace(unsigned i)
{
    if (i % 64 == 63) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, nullptr);
    }
}

__attribute__((noinline)) static void touch(void *p)
{
    static_cast<volatile char *>(p)[0] = 1;
}

// Allocates `size` bytes one of four ways; returns the bytes asked for.
__attribute__((noinline)) static size_t allocate(size_t size, unsigned how)
{
    switch (how % 4) {
    case 0: {
        void *p = malloc(size);
        touch(p);
        free(p);
        return size;
    }
    case 1: {
        size_t n = size / 8 + 1;
        void *p = calloc(n, 8);
        touch(p);
        free(p);
        return n * 8;
    }
    case 2: {
        void *p = malloc(16);
        touch(p);
        p = realloc(p, size);
        touch(p);
        free(p);
        return 16 + size;
    }
    default: {
        char *p = new char[size];
        touch(p);
        delete[] p;
        return size;
    }
    }
}

static size_t bytes_a, bytes_b;

__attribute__((noinline)) static void path_a(unsigned n)
{
    for (unsigned i = 0; i < n; i++)
    {
        bytes_a += allocate(pick_size(), i);
        pace(i);
    }
}

// Allocates until this path has a third of path_a's bytes: a quarter of the whole.
__attribute__((noinline)) static void path_b()
{
    for (unsigned i = 0; bytes_b * 3 < bytes_a; i++)
    {
        bytes_b += allocate(pick_size(), i);
        pace(i);
    }
}

static sem_t turn_b, turn_a;

// The second thread: path_b each time the main thread hands over.
static void *second(void *)
{
    for (unsigned round = 0; round < 10; round++) {
        sem_wait(&turn_b);
        path_b();
        sem_post(&turn_a);
    }
    return nullptr;
}

int main(int argc, char **argv)
{
    sem_init(&turn_a, 0, 0);
    sem_init(&turn_b, 0, 0);
    pthread_t thread;
    if (pthread_create(&thread, nullptr, second, nullptr) != 0) {
        perror("pthread_create");
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "wait") == 0) {
        char line[16];
        if (!fgets(line, sizeof line, stdin))
            return 1;
    }
    for (unsigned round = 0; round < 10; round++) {
        path_a(ROUNDS / 10);
        sem_post(&turn_b);
        sem_wait(&turn_a);
    }
    pthread_join(thread, nullptr);
    printf("path_a %zu\npath_b %zu\n", bytes_a, bytes_b);
    return 0;
}
