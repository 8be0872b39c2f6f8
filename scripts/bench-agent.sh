#!/usr/bin/env bash
# Overhead of `rootline agent` on a busy host: CPU the agent uses, and how much slower a CPU-bound
# workload runs while the whole host is sampled at 99 Hz.
#
# Usage: scripts/bench-agent.sh [ROUNDS] [WORK]     (as root; defaults: 3 rounds, 400 M iterations)
#
# Each round runs one workload process per CPU (so every core is busy) without the agent, then
# again with the agent profiling the whole host and writing pprof files every 2 s (after a 5 s
# warm-up in which the sampler reads the maps and symbols of the host's processes). It prints the
# workload's wall time in both cases and the agent's CPU time (utime + stime from /proc) as a share
# of one core. The machine is shared, so look at the spread of the rounds, not a single number.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
work=${2:-400000000}
cpus=$(nproc)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cargo build --release -q -p rootline
bin=target/release/rootline

cat >"$tmp/work.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
/* A CPU-bound workload with a few levels of calls, so sampled stacks have some depth. */
__attribute__((noinline)) static unsigned long leaf(unsigned long x) { return x * 2654435761u ^ (x >> 7); }
__attribute__((noinline)) static unsigned long mid(unsigned long x) { return leaf(x) + leaf(x + 1); }
__attribute__((noinline)) static unsigned long top(unsigned long n) {
    unsigned long acc = 0;
    for (unsigned long i = 0; i < n; i++) acc += mid(i);
    return acc;
}
int main(int argc, char **argv) {
    unsigned long n = argc > 1 ? strtoul(argv[1], 0, 10) : 100000000ul;
    printf("%lu\n", top(n));
    return 0;
}
C
gcc -O2 -fno-omit-frame-pointer -o "$tmp/work" "$tmp/work.c"

cat >"$tmp/agent.toml" <<TOML
export_interval = "2s"
[exporters.pprof]
directory = "$tmp/pprof"
max_bytes = "64MiB"
TOML

# Wall time (seconds) of one workload per CPU, all at once.
run_workload() {
    local start end
    start=$(date +%s.%N)
    for _ in $(seq "$cpus"); do "$tmp/work" "$work" >/dev/null & done
    wait
    end=$(date +%s.%N)
    echo "$end - $start" | bc -l
}

# "tid name ticks" for every thread of process $1.
thread_ticks() {
    for t in /proc/"$1"/task/*; do
        echo "${t##*/} $(tr ' ' '_' <"$t/comm") $(awk '{print $14 + $15}' "$t/stat")"
    done
}

ticks=$(getconf CLK_TCK)
printf '%-6s %14s %14s %12s %14s\n' round base_wall_s agent_wall_s slowdown_% agent_cpu_%core
for r in $(seq "$rounds"); do
    base=$(run_workload)
    "$bin" agent --config "$tmp/agent.toml" --log-format json 2>"$tmp/agent.log" &
    agent=$!
    sleep 5   # warm-up: the sampler loads and symbolizes the binaries of the host first
    read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$agent/stat")
    threads0=$(thread_ticks "$agent")
    t0=$(date +%s.%N)
    with=$(run_workload)
    read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$agent/stat")
    threads1=$(thread_ticks "$agent")
    t1=$(date +%s.%N)
    kill -TERM "$agent"
    wait "$agent"
    cpu=$(echo "(($u1 + $s1) - ($u0 + $s0)) / $ticks / ($t1 - $t0) * 100" | bc -l)
    slow=$(echo "($with - $base) / $base * 100" | bc -l)
    printf '%-6s %14.2f %14.2f %12.2f %14.3f\n' "$r" "$base" "$with" "$slow" "$cpu"
    # Per thread: rootline-reader is rootline-capture's sampler; rootline-captur(e) and
    # rootline-export are the agent's own pipeline.
    join <(sort <<<"$threads0") <(sort <<<"$threads1") |
        awk -v ticks="$ticks" -v secs="$(echo "$t1 - $t0" | bc -l)" \
            '{ cpu[$2] += ($5 - $3) / ticks / secs * 100 }
             END { for (n in cpu) printf "         thread %-18s %7.3f %%core\n", n, cpu[n] }'
done
echo "last status line:"
grep 'status:' "$tmp/agent.log" | tail -1
