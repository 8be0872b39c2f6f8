#!/usr/bin/env bash
# What `rootline record --alloc` costs an allocation-heavy program: a C program makes N
# malloc/free pairs (sizes mostly 16-256 B, one in 64 up to 64 KiB, as a typical heap mix) and
# times its own loop, run bare, under `rootline record` (CPU sampling only), under
# `rootline record --alloc` launched (preloaded sampler library) and under `--alloc -p` (uprobes
# on libc; the program waits for the recorder to attach before its loop). Each is run RUNS times;
# the median is reported with its ratio to the bare run.
# Usage: scripts/bench-alloc.sh [N] [ROOTLINE]   (default N=20000000, ROOTLINE=target/release/rootline;
# RUNS=5, ALLOC_RATE=bytes passes --alloc-rate)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20000000}
rootline=${2:-${CARGO_TARGET_DIR:-target}/release/rootline}
runs=${RUNS:-5}
[ -x "$rootline" ] || { echo "build it first: cargo build --release -p rootline" >&2; exit 1; }
rate_args=()
[ -n "${ALLOC_RATE:-}" ] && rate_args=(--alloc-rate "$ALLOC_RATE")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/churn.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}
int main(int argc, char **argv) {
    long n = atol(argv[1]);
    if (argc > 2 && strcmp(argv[2], "wait") == 0) {
        char line[16];
        if (!fgets(line, sizeof line, stdin)) return 1;
    }
    unsigned long long s = 88172645463325252ull, bytes = 0;
    void *keep[256] = {0};
    double t0 = now();
    for (long i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        size_t size = (s & 63) == 0 ? 16 + (s >> 8) % 65536 : 16 + (s >> 8) % 241;
        unsigned slot = (s >> 40) & 255;
        free(keep[slot]);
        keep[slot] = malloc(size);
        ((volatile char *)keep[slot])[0] = 1;
        bytes += size;
    }
    double t = now() - t0;
    printf("%.6f %llu\n", t, bytes);
    return 0;
}
C
cc -O2 -o "$work/churn" "$work/churn.c"

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

bare() { "$work/churn" "$n" | awk '{print $1}'; }
cpu_only() { "$rootline" record -o "$work/cpu.rlp" -- "$work/churn" "$n" 2>/dev/null | awk '{print $1}'; }
launched() {
    "$rootline" record --alloc "${rate_args[@]}" -o "$work/alloc.rlp" -- "$work/churn" "$n" \
        2>"$work/launched.err" | awk '{print $1}'
}
by_pid() {
    local fifo="$work/go"
    rm -f "$fifo"; mkfifo "$fifo"
    "$work/churn" "$n" wait < "$fifo" > "$work/p.out" &
    local pid=$!
    exec 9> "$fifo"
    "$rootline" record --alloc "${rate_args[@]}" -o "$work/p.rlp" -p "$pid" 2>"$work/p.err" &
    local rec=$!
    # Start the loop once the recorder's perf events stop growing in number.
    local last=-1 count stable=0
    while [ $stable -lt 5 ]; do
        sleep 0.2
        count=$(ls -l /proc/$rec/fd 2>/dev/null | grep -c perf_event || true)
        if [ "$count" = "$last" ] && [ "$count" -gt 0 ]; then stable=$((stable + 1)); else stable=0; fi
        last=$count
    done
    echo go >&9
    exec 9>&-
    wait "$pid"
    wait "$rec"
    awk '{print $1}' "$work/p.out"
}

declare -A times
for mode in bare cpu_only launched by_pid; do
    for _ in $(seq "$runs"); do
        times[$mode]+="$($mode) "
    done
done
base=$(echo "${times[bare]}" | tr ' ' '\n' | grep . | median)
printf '%-34s %10s %8s\n' "run ($n malloc/free pairs)" "seconds" "ratio"
for mode in bare cpu_only launched by_pid; do
    m=$(echo "${times[$mode]}" | tr ' ' '\n' | grep . | median)
    label=$mode
    case $mode in
        bare) label="bare";;
        cpu_only) label="record (CPU only)";;
        launched) label="record --alloc -- cmd (preload)";;
        by_pid) label="record --alloc -p (uprobes)";;
    esac
    printf '%-34s %10.4f %8.3f\n' "$label" "$m" "$(echo "$m / $base" | bc -l)"
done
echo
grep -h "allocations:" "$work/launched.err" | sed 's/^/launched: /'
grep -h "allocations:\|lost" "$work/p.err" | head -2 | sed 's/^/-p: /'
