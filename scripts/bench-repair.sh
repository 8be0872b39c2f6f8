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
# shellcheck source=lib/measure.sh
source scripts/lib/measure.sh

sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(100 1024)
dir=${BENCH_DIR:-target/bench-repair}
mkdir -p "$dir"
require_gnu_time

cargo build --release -q -p rootline -p rootline-repair --example bench_repair
rootline=target/release/rootline
helper=target/release/examples/bench_repair


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
