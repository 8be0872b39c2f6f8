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
# shellcheck source=lib/measure.sh
source scripts/lib/measure.sh

sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(100 1024)
dir=${BENCH_DIR:-target/bench-formats}
mkdir -p "$dir"
require_gnu_time

cargo build --release -q -p rootline-formats --example chromium_bench
bin=target/release/examples/chromium_bench


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
