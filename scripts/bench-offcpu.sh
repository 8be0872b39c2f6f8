#!/usr/bin/env bash
# What a context switch costs with `rootline record --off-cpu`: a program makes N pipe ping-pongs
# (two threads pinned to one CPU, so every hand-over is a context switch) or N sched_yield
# hand-overs, timed alone, under `rootline record`, and under `rootline record --off-cpu` with every
# switch-out sampled and with the rate cap.
# Usage: scripts/bench-offcpu.sh [N] [ROOTLINE]   (default N=200000, ROOTLINE=target/release/rootline;
# RECORD_ARGS, e.g. "--stack-size 4096", is passed to both recordings)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200000}
rootline=${2:-${CARGO_TARGET_DIR:-target}/release/rootline}
[ -x "$rootline" ] || { echo "build it first: cargo build --release -p rootline" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/pingpong.c" <<'C'
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}
static long n;
static int yield_mode;
static int a[2], b[2];
static void *peer(void *arg) {
    (void)arg;
    char c;
    for (long i = 0; i < n; i++) {
        if (yield_mode) { sched_yield(); continue; }
        if (read(a[0], &c, 1) != 1 || write(b[1], &c, 1) != 1) exit(2);
    }
    return NULL;
}
int main(int argc, char **argv) {
    n = atol(argv[1]);
    yield_mode = argc > 2 && strcmp(argv[2], "yield") == 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    sched_setaffinity(0, sizeof set, &set);
    if (pipe(a) || pipe(b)) return 1;
    double start = now();
    pthread_t t;
    pthread_create(&t, NULL, peer, NULL);
    char c = 'x';
    for (long i = 0; i < n; i++) {
        if (yield_mode) { sched_yield(); continue; }
        if (write(a[1], &c, 1) != 1 || read(b[0], &c, 1) != 1) return 2;
    }
    pthread_join(t, NULL);
    printf("%.6f\n", now() - start);
    return 0;
}
C
cc -O2 -g -fno-omit-frame-pointer -pthread -o "$work/pingpong" "$work/pingpong.c"

# Best of 3 of the seconds the program's ping-pong loop takes (it prints them), so that the
# recorder's start and finish are not counted.
best() {
    local best=
    for _ in 1 2 3; do
        local t
        t=$("$@" 2>"$work/err")
        if [ -z "$best" ] || [ "$(echo "$t < $best" | bc -l)" = 1 ]; then best=$t; fi
    done
    echo "$best"
}

# The program's loop time under `record --off-cpu` with RATE as --off-cpu-max-rate (its summary
# is left in $work/err).
off_cpu() {
    best "$rootline" record ${RECORD_ARGS:-} --off-cpu --off-cpu-max-rate "$1" -o "$work/off.rlp" -- "$work/pingpong" "$n" "$2"
}

cap=${CAP:-1000}
printf '%-6s %9s %9s %9s %9s %9s %9s %9s %9s %11s %11s\n' mode alone record "all" ratio \
    "cap $cap" ratio switches sampled "µs/switch" "µs/switch"
printf '%-6s %9s %9s %9s %9s %9s %9s %9s %9s %11s %11s\n' "" "" "" "" "" "" "" "" "(capped)" "(all)" "(capped)"
for mode in pipe yield; do
    alone=$(best "$work/pingpong" "$n" "$mode")
    cpu=$(best "$rootline" record ${RECORD_ARGS:-} -o "$work/cpu.rlp" -- "$work/pingpong" "$n" "$mode")
    all=$(off_cpu 0 "$mode")
    capped=$(off_cpu "$cap" "$mode")
    # The capped run's counts.
    switches=$(sed -n 's/.*off-CPU: \([0-9]*\) switches.*/\1/p' "$work/err")
    sampled=$(sed -n 's/.*switches, \([0-9]*\) sampled.*/\1/p' "$work/err")
    per_all=$(echo "($all - $cpu) * 1000000 / ${switches:-1}" | bc -l)
    per_capped=$(echo "($capped - $cpu) * 1000000 / ${switches:-1}" | bc -l)
    printf '%-6s %8.3fs %8.3fs %8.3fs %8.2fx %8.3fs %8.2fx %9s %9s %11.2f %11.2f\n' "$mode" "$alone" \
        "$cpu" "$all" "$(echo "$all / $alone" | bc -l)" "$capped" "$(echo "$capped / $alone" | bc -l)" \
        "${switches:-?}" "${sampled:-?}" "$per_all" "$per_capped"
done
echo "(times: the program's own loop, best of 3; all: --off-cpu-max-rate 0, every switch-out"
echo " sampled; cap: --off-cpu-max-rate CAP (env CAP, default 1000); ratio: over alone;"
echo " µs/switch: what --off-cpu adds over a CPU-only recording, per switch-out)"
