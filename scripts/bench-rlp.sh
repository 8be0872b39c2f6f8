#!/usr/bin/env bash
# Benchmarks the native .rlp writer and reader: bytes per sample and samples/s for 1M samples at
# ~1 ms spacing over ~1k distinct stacks, written as 1k-sample chunks (a recorder's cadence) and in
# one call. See crates/profile/benches/rlp.rs.
#
# Usage: scripts/bench-rlp.sh
set -euo pipefail
cd "$(dirname "$0")/.."

cargo bench -q -p rootline-profile --bench rlp
