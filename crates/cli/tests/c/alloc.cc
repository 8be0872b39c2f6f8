// Ground truth for `rootline record --alloc`: `path_a` allocates three quarters of the bytes and
// `path_b` one quarter, through malloc, calloc, realloc and C++ new, sizes from 16 B to 1 MiB.
// `path_b` runs on a second thread, started first, taking turns with the main thread. Then
// `path_m` maps anonymous memory with mmap (64 KiB to 4 MiB) and mallocs 1 MiB blocks, which glibc
// maps itself (its mmap threshold is fixed at 128 KiB here), and makes mappings that are no
// allocation: of a file, a reservation of address space (PROT_NONE), and (unless waiting) one
// that fails.
// Prints the bytes each path asked for. With the argument `wait` it first waits for a line on
// stdin (so a recorder can attach with -p). ROUNDS sets the number of path_a allocations,
// MAP_ROUNDS those of path_m.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <malloc.h>
#include <new>
#include <pthread.h>
#include <semaphore.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef ROUNDS
#define ROUNDS 20000
#endif
#ifndef MAP_ROUNDS
#define MAP_ROUNDS 400
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

// 64 KiB to 4 MiB - 1: a power of two from 64 KiB to 2 MiB, plus up to as much again.
static size_t pick_map_size()
{
    size_t base = size_t(64 * 1024) << (next_random() % 6);
    return base + next_random() % base;
}

// An anonymous mapping of `size` bytes: an allocation, [alloc: mmap].
__attribute__((noinline)) static size_t map_anonymous(size_t size)
{
    void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    touch(p);
    munmap(p, size);
    return size;
}

// A block glibc maps for malloc (above its mmap threshold): an allocation, [alloc: malloc] only.
__attribute__((noinline)) static size_t big_malloc()
{
    size_t size = 1 << 20;
    void *p = malloc(size);
    touch(p);
    free(p);
    return size;
}

// A mapping of a file (1 MiB): no allocation.
__attribute__((noinline)) static void map_file(int fd)
{
    void *p = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        perror("mmap of a file");
        exit(1);
    }
    touch(p);
    munmap(p, 1 << 20);
}

// A reservation of 64 MiB of address space, as runtimes reserve their heaps: no allocation.
__attribute__((noinline)) static void reserve()
{
    size_t size = 64 << 20;
    void *p = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap of PROT_NONE");
        exit(1);
    }
    munmap(p, size);
}

// An anonymous mapping that fails (neither private nor shared: EINVAL): no allocation.
__attribute__((noinline)) static void map_failing()
{
    if (mmap(nullptr, 1 << 20, PROT_READ, MAP_ANONYMOUS, -1, 0) != MAP_FAILED) {
        fprintf(stderr, "an invalid mmap succeeded\n");
        exit(1);
    }
}

static size_t bytes_m_mmap, bytes_m_malloc;

__attribute__((noinline)) static void path_m(unsigned n, bool failing)
{
    int fd = memfd_create("rootline-alloc-test", 0);
    if (fd < 0 || ftruncate(fd, 1 << 20) != 0) {
        perror("memfd");
        exit(1);
    }
    for (unsigned i = 0; i < n; i++) {
        bytes_m_mmap += map_anonymous(pick_map_size());
        bytes_m_malloc += big_malloc();
        map_file(fd);
        reserve();
        if (failing)
            map_failing();
        pace(i);
    }
    close(fd);
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
    // A fixed threshold: every malloc of 128 KiB or more is mapped (the default one rises to the
    // size of the first mapped block freed, and the 1 MiB blocks would come from the heap).
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    sem_init(&turn_a, 0, 0);
    sem_init(&turn_b, 0, 0);
    pthread_t thread;
    if (pthread_create(&thread, nullptr, second, nullptr) != 0) {
        perror("pthread_create");
        return 1;
    }
    bool waited = argc > 1 && strcmp(argv[1], "wait") == 0;
    if (waited) {
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
    // With -p a call is counted as it starts, before it could fail.
    path_m(MAP_ROUNDS, !waited);
    printf("path_a %zu\npath_b %zu\npath_m_mmap %zu\npath_m_malloc %zu\n", bytes_a, bytes_b,
           bytes_m_mmap, bytes_m_malloc);
    return 0;
}
