#!/usr/bin/env bash
# Benchmarks `rootline repair`.
#
# 1. End to end: generated dotnet-trace-style Chromium files (8 threads, 1 ms samples, deep async
#    .NET stacks cut to EventPipe's 100 managed frames) of 100 MB and 1 GB are repaired with the
#    release `rootline repair IN -o OUT`; prints MB/s (wall clock and CPU time) and peak RSS, next
#    to `rootline convert` of the same file (read + write without repair) for comparison.
# 2. The repair step alone on a generated profile: samples/s and frames/s.
#
# Usage: scripts/bench-repair.sh [SIZES_MB...]   (default: 100 1024)
# Files go to $BENCH_DIR (default: target/bench-repair) and are kept for reruns.
set -euo pipefail
cd "$(dirname "$0")/.."

sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(100 1024)
dir=${BENCH_DIR:-target/bench-repair}
mkdir -p "$dir"
if [ ! -x /usr/bin/time ]; then
    echo "bench-repair: /usr/bin/time is needed (apt-get install -y time)" >&2
    exit 1
fi

cargo build --release -q -p rootline -p rootline-repair --example bench_repair
rootline=target/release/rootline
helper=target/release/examples/bench_repair

# Prints "MB/s wall, MB/s cpu, peak RSS MiB" for a command given the bytes it processes.
measure() {
    local bytes=$1
    shift
    local log
    log=$(mktemp)
    /usr/bin/time -v "$@" >"$log.out" 2>"$log"
    local wall user sys rss
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {n=split($2,a,":"); s=0; for(i=1;i<=n;i++) s=s*60+a[i]; print s}' "$log")
    user=$(awk -F': ' '/User time/ {print $2}' "$log")
    sys=$(awk -F': ' '/System time/ {print $2}' "$log")
    rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
    grep '^rootline:' "$log" >&2 || true
    awk -v b="$bytes" -v w="$wall" -v u="$user" -v s="$sys" -v r="$rss" 'BEGIN {
        printf "%.0f MB/s wall (%.2f s), %.0f MB/s cpu (user+sys %.2f s), peak RSS %.0f MiB\n",
            b / 1e6 / w, w, b / 1e6 / (u + s), u + s, r / 1024 }'
    rm -f "$log" "$log.out"
}

echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for mb in "${sizes[@]}"; do
    trace="$dir/dotnet-cut-${mb}MB.json"
    if [ ! -s "$trace" ]; then
        echo "generating $trace" >&2
        "$helper" chromium "$trace" "$mb" >&2
    fi
    bytes=$(stat -c %s "$trace")
    echo "== ${mb} MB dotnet-trace-style Chromium trace ($bytes bytes)"
    echo "repair:  $(measure "$bytes" "$rootline" repair "$trace" -o "$dir/repaired.json")"
    echo "convert: $(measure "$bytes" "$rootline" convert "$trace" -o "$dir/converted.json")"
    rm -f "$dir/repaired.json" "$dir/converted.json"
done

echo "== repair step alone on a generated profile (20000 ms x 8 threads)"
"$helper" 20000 7
