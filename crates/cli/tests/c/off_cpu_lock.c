/* Ground truth for off-CPU recording of lock contention: a holder thread takes a mutex and
 * computes HALF_MS while holding it in hold_busy(), then HALF_MS without it in free_busy(). A waiter
 * thread computes in work() until the holder has taken the mutex again, then waits for it in
 * wait_for_lock() until the holder lets it go: about half its wall time in each. The waiter measures
 * its own wall time in each function and prints it at the end, `work_ns wait_ns`, as the truth.
 * ROUNDS rounds. A third thread, the spawner, waits in in_vfork() for children it vforks, each
 * sleeping HALF_MS / 2 before it exits: the kernel's uninterruptible wait, on demand. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef ROUNDS
#define ROUNDS 12
#endif
#ifndef HALF_MS
#define HALF_MS 60
#endif

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* How many times the holder has taken the mutex; the round the waiter contends in. */
static volatile int taken;
volatile uint64_t sink;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t churn(uint64_t x) {
    for (int i = 0; i < 1000; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x;
}

/* Computes until `end`. */
__attribute__((noinline)) void hold_busy(uint64_t end) {
    uint64_t x = 1;
    while (now_ns() < end) x = churn(x);
    sink += x;
}

__attribute__((noinline)) void free_busy(uint64_t end) {
    uint64_t x = 3;
    while (now_ns() < end) x = churn(x);
    sink += x;
}

static void *holder(void *arg) {
    (void)arg;
    uint64_t half = (uint64_t)HALF_MS * 1000000u, start = now_ns();
    for (int round = 1; round <= ROUNDS + 1; round++) {
        pthread_mutex_lock(&lock);
        __atomic_store_n(&taken, round, __ATOMIC_RELEASE);
        if (round > ROUNDS) {
            pthread_mutex_unlock(&lock);
            break;
        }
        hold_busy(start + (2 * (uint64_t)round - 1) * half);
        pthread_mutex_unlock(&lock);
        free_busy(start + 2 * (uint64_t)round * half);
    }
    return NULL;
}

/* Computes until the holder has taken the mutex for round `round`. */
__attribute__((noinline)) void work(int round) {
    uint64_t x = 5;
    while (__atomic_load_n(&taken, __ATOMIC_ACQUIRE) < round) x = churn(x);
    sink += x;
}

/* Blocks until the holder lets the mutex go. */
__attribute__((noinline)) void wait_for_lock(void) {
    pthread_mutex_lock(&lock);
    pthread_mutex_unlock(&lock);
}

static void *waiter(void *arg) {
    uint64_t *spent = arg;
    /* Round 1 starts when the holder first takes the mutex: wait for it, uncounted. */
    while (__atomic_load_n(&taken, __ATOMIC_ACQUIRE) < 1) {
    }
    for (int round = 1; round <= ROUNDS; round++) {
        uint64_t t0 = now_ns();
        if (round > 1) work(round);
        uint64_t t1 = now_ns();
        wait_for_lock();
        uint64_t t2 = now_ns();
        spent[0] += t1 - t0;
        spent[1] += t2 - t1;
    }
    return NULL;
}

/* vforks a child that sleeps `ms` and exits; the caller waits for it in the kernel meanwhile. */
__attribute__((noinline)) void in_vfork(long ms) {
    pid_t child = vfork();
    if (child == 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        _exit(0);
    }
    if (child > 0) waitpid(child, NULL, 0);
}

static void *spawner(void *arg) {
    (void)arg;
    for (int round = 0; round < ROUNDS; round++) in_vfork(HALF_MS / 2);
    return NULL;
}

int main(void) {
    uint64_t spent[2] = {0, 0};
    pthread_t h, w, s;
    if (pthread_create(&h, NULL, holder, NULL) || pthread_create(&w, NULL, waiter, spent) ||
        pthread_create(&s, NULL, spawner, NULL))
        return 1;
    pthread_join(w, NULL);
    pthread_join(h, NULL);
    pthread_join(s, NULL);
    printf("%llu %llu\n", (unsigned long long)spent[0], (unsigned long long)spent[1]);
    return 0;
}
