#!/usr/bin/env bash
# What `rootline record --alloc` costs an allocation-heavy program: a C program makes N
# malloc/free pairs and fills each block (WORKLOAD=small: 16-256 B objects; WORKLOAD=large: one
# in 64 up to 64 KiB, left unfilled, so bytes come ten times faster) and times its own loop, run bare, under `rootline record` (CPU sampling only), under
# `rootline record --alloc` launched (preloaded sampler library) and under `--alloc -p` (uprobes
# on libc; the program waits for the recorder to attach before its loop). Each is run RUNS times;
# the median is reported with its ratio to the bare run.
# Both its wall-clock time and its thread's CPU time are shown: on a busy machine the recorder's
# reader competes for the CPU, which the wall-clock time shows and the CPU time does not.
# Usage: scripts/bench-alloc.sh [N] [ROOTLINE]   (default N=20000000, ROOTLINE=target/release/rootline;
# RUNS=5, WORKLOAD=small|large, ALLOC_RATE=bytes passes --alloc-rate, MODES="bare cpu_only launched by_pid"
# picks the runs; bare must be among them)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20000000}
workload=${WORKLOAD:-small}
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
static double clock_s(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}
static double now(void) { return clock_s(CLOCK_MONOTONIC); }
static double cpu(void) { return clock_s(CLOCK_THREAD_CPUTIME_ID); }
int main(int argc, char **argv) {
    long n = atol(argv[1]);
    int large = strcmp(argv[2], "large") == 0;
    if (argc > 3 && strcmp(argv[3], "wait") == 0) {
        char line[16];
        if (!fgets(line, sizeof line, stdin)) return 1;
    }
    unsigned long long s = 88172645463325252ull, bytes = 0;
    void *keep[256] = {0};
    double t0 = now(), c0 = cpu();
    for (long i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        int big = large && (s & 63) == 0;
        size_t size = big ? 16 + (s >> 8) % 65536 : 16 + (s >> 8) % 241;
        unsigned slot = (s >> 40) & 255;
        free(keep[slot]);
        keep[slot] = malloc(size);
        if (big)
            ((volatile char *)keep[slot])[0] = 1;
        else
            memset(keep[slot], 1, size);
        bytes += size;
    }
    double t = now() - t0, c = cpu() - c0;
    printf("%.6f %.6f %llu\n", t, c, bytes);
    return 0;
}
C
cc -O2 -o "$work/churn" "$work/churn.c"

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

bare() { "$work/churn" "$n" "$workload" | awk '{print $1, $2}'; }
cpu_only() { "$rootline" record -o "$work/cpu.rlp" -- "$work/churn" "$n" "$workload" 2>/dev/null | awk '{print $1, $2}'; }
launched() {
    "$rootline" record --alloc "${rate_args[@]}" -o "$work/alloc.rlp" -- "$work/churn" "$n" "$workload" \
        2>"$work/launched.err" | awk '{print $1, $2}'
}
by_pid() {
    local fifo="$work/go"
    rm -f "$fifo"; mkfifo "$fifo"
    "$work/churn" "$n" "$workload" wait < "$fifo" > "$work/p.out" &
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
    awk '{print $1, $2}' "$work/p.out"
}

declare -A walls cpus
# Runs interleave the modes, so a drift in the machine's speed (a virtual machine's neighbours)
# weighs on every mode alike.
modes=(${MODES:-bare cpu_only launched by_pid})
for _ in $(seq "$runs"); do
    for mode in "${modes[@]}"; do
        read -r wall cpu < <($mode)
        walls[$mode]+="$wall "
        cpus[$mode]+="$cpu "
    done
done
med() { echo "$1" | tr ' ' '\n' | grep . | median; }
base_wall=$(med "${walls[bare]}")
base_cpu=$(med "${cpus[bare]}")
echo "$n malloc/free pairs ($workload); median of $runs runs; the loop's wall-clock time and its thread's CPU time"
printf '%-34s %9s %7s %9s %7s\n' "run" "wall s" "ratio" "cpu s" "ratio"
for mode in "${modes[@]}"; do
    case $mode in
        bare) label="bare";;
        cpu_only) label="record (CPU only)";;
        launched) label="record --alloc -- cmd (preload)";;
        by_pid) label="record --alloc -p (uprobes+BPF)";;
    esac
    w=$(med "${walls[$mode]}")
    c=$(med "${cpus[$mode]}")
    printf '%-34s %9.4f %7.3f %9.4f %7.3f\n' "$label" "$w" "$(echo "$w / $base_wall" | bc -l)" \
        "$c" "$(echo "$c / $base_cpu" | bc -l)"
done
echo
grep -h "allocations:" "$work/launched.err" | sed 's/^/launched: /'
grep -h "allocations:\|lost\|note" "$work/p.err" | head -3 | sed 's/^/-p: /'
