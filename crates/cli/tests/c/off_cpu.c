/* Ground truth for off-CPU recording: the main thread spends half its wall time computing in
 * compute() and half blocked in wait_for_data(), first sleeping in nap(), then reading a pipe in
 * read_data() that a feeder thread fills slowly. ROUNDS rounds of HALF_MS + HALF_MS. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifndef ROUNDS
#define ROUNDS 12
#endif
#ifndef HALF_MS
#define HALF_MS 60
#endif

static int go_pipe[2], data_pipe[2];
volatile uint64_t sink;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* Spins until `ms` of wall time have passed. */
__attribute__((noinline)) void compute(long ms) {
    uint64_t end = now_ns() + (uint64_t)ms * 1000000u;
    uint64_t x = 1;
    while (now_ns() < end) {
        for (int i = 0; i < 1000; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    }
    sink += x;
}

__attribute__((noinline)) void nap(long ms) { sleep_ms(ms); }

__attribute__((noinline)) void read_data(void) {
    char c;
    if (write(go_pipe[1], "g", 1) != 1 || read(data_pipe[0], &c, 1) != 1) exit(2);
}

/* Blocked for `ms`: half asleep, half waiting for the feeder's byte. */
__attribute__((noinline)) void wait_for_data(long ms) {
    nap(ms / 2);
    read_data();
}

/* Waits for the main thread's go, then takes its time to write one byte. */
static void *feeder(void *arg) {
    long ms = (long)(intptr_t)arg;
    char c;
    while (read(go_pipe[0], &c, 1) == 1) {
        sleep_ms(ms);
        if (write(data_pipe[1], "d", 1) != 1) break;
    }
    return NULL;
}

int main(void) {
    if (pipe(go_pipe) || pipe(data_pipe)) return 1;
    pthread_t t;
    if (pthread_create(&t, NULL, feeder, (void *)(intptr_t)(HALF_MS / 2))) return 1;
    for (int round = 0; round < ROUNDS; round++) {
        compute(HALF_MS);
        wait_for_data(HALF_MS);
    }
    close(go_pipe[1]);
    pthread_join(t, NULL);
    return 0;
}
