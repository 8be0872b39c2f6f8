#!/usr/bin/env bash
# Benchmarks `rootline repair`.
#
# Stage 1 (always): the repair step alone on a generated dotnet-trace-like profile (cut to EventPipe's
# 100 managed frames): samples/s, frames/s and peak RSS, from the rootline-repair bench example.
#
# Usage: scripts/bench-repair.sh [TICKS]   (TICKS: milliseconds of samples, 8 threads; default 100000)
set -euo pipefail
cd "$(dirname "$0")/.."

ticks="${1:-100000}"

cargo build --release -q -p rootline-repair --example bench_repair
echo "== repair step on a generated profile ($ticks ms x 8 threads)"
./target/release/examples/bench_repair "$ticks" 7
