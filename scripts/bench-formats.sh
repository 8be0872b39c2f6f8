#!/usr/bin/env bash
# Benchmarks the Chromium trace-event JSON reader and writer on generated dotnet-trace style traces
# (4 threads, 1 ms samples, ~100-deep stacks) of 100 MB and 1 GB: MB/s for reading and writing
# (wall clock and CPU time) and the reader's peak RSS from /usr/bin/time -v.
#
# A second 1 GB trace cycles through a fixed pool of 500 stacks per thread, to show that memory
# follows distinct stacks and samples, not file size.
#
# Usage: scripts/bench-formats.sh [SIZES_MB...]   (default: 100 1024)
# The traces go to $BENCH_DIR (default: target/bench-formats) and are kept for reruns.
set -euo pipefail
cd "$(dirname "$0")/.."

sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(100 1024)
dir=${BENCH_DIR:-target/bench-formats}
mkdir -p "$dir"
if [ ! -x /usr/bin/time ]; then
    echo "bench-formats: /usr/bin/time is needed (apt-get install -y time)" >&2
    exit 1
fi

cargo build --release -q -p rootline-formats --example chromium_bench
bin=target/release/examples/chromium_bench

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
    cat "$log.out" >&2
    awk -v b="$bytes" -v w="$wall" -v u="$user" -v s="$sys" -v r="$rss" 'BEGIN {
        printf "%.0f MB/s wall, %.0f MB/s cpu (user+sys %.2f s), peak RSS %.0f MiB\n",
            b / 1e6 / w, b / 1e6 / (u + s), u + s, r / 1024 }'
    rm -f "$log" "$log.out"
}

echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for mb in "${sizes[@]}"; do
    trace="$dir/dotnet-style-${mb}MB.json"
    if [ ! -s "$trace" ]; then
        echo "generating $trace" >&2
        "$bin" generate "$trace" "$mb" >&2
    fi
    bytes=$(stat -c %s "$trace")
    echo "== ${mb} MB trace ($bytes bytes)"
    echo "read:  $(measure "$bytes" "$bin" read "$trace")"
    # The write run reads first; the printed write MB/s is the writer alone.
    out="$dir/rewrite-${mb}MB.json"
    "$bin" write "$trace" "$out"
    rm -f "$out"
done

pooled="$dir/dotnet-style-1024MB-pool500.json"
if [ ! -s "$pooled" ]; then
    echo "generating $pooled" >&2
    "$bin" generate "$pooled" 1024 500 >&2
fi
bytes=$(stat -c %s "$pooled")
echo "== 1024 MB trace, 500 distinct stacks per thread ($bytes bytes)"
echo "read:  $(measure "$bytes" "$bin" read "$pooled")"
