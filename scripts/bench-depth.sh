#!/usr/bin/env bash
# Depth benchmark: how often each profiler shows a deep stack whole, and rootline's CPU per sample.
#
# Workload: crates/capture/tests/c/deep.c (built -O2 with frame pointers and CFI), recursing DEPTH
# levels with 1 KiB of locals per frame on a second thread, then spinning in its leaf. Each
# profiler records it by PID for RUN_SECONDS at FREQ Hz. A stack is complete when it runs from the
# thread entry (clone3/_start) through exactly DEPTH `recurse` frames to `spin`; the fraction is
# over samples taken in `spin`.
#
# Rows: rootline (live-memory continuation above a watched stack slot, outer parts of deep stacks
# reused while the watch proves them unchanged; the first samples of a thread, queued before its
# watch was armed, end [truncated: live-unproven]), perf --call-graph fp (capped by
# kernel.perf_event_max_stack), perf --call-graph dwarf,65528 (64 KB of stack), samply if
# installed. rootline's CPU per sample is its own user+sys time over its samples (symbolization
# included); the last line compares depth 10,000 with the shallow run.
# SOAK_SECONDS=60 adds a long rootline run at depth 10,000 and reports its peak RSS.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
RUN_SECONDS="${RUN_SECONDS:-4}"
FREQ="${FREQ:-999}"
DEPTHS="${DEPTHS:-10 1000 10000}"
TMP="$(mktemp -d)"
trap 'if [ -n "${PID:-}" ]; then kill "$PID" 2>/dev/null || true; fi; rm -rf "$TMP"' EXIT

cd "$ROOT"
cargo build --quiet --release -p rootline-capture --example record_depth
RECORD="$ROOT/target/release/examples/record_depth"
cc -O2 -g -fno-omit-frame-pointer crates/capture/tests/c/deep.c -lpthread -o "$TMP/deep"

start() { "$TMP/deep" "$1" 3600 thread & PID=$!; sleep 0.5; }
stop() { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; PID=; }

# Fraction of complete stacks in `perf script` (or compatible) output.
complete_fraction() {
    python3 - "$1" "$2" <<'PY'
import sys
path, depth = sys.argv[1], int(sys.argv[2])
in_leaf = complete = 0
def judge(frames):
    global in_leaf, complete
    names = [f.split()[1].split("+")[0] if len(f.split()) > 1 else "" for f in frames]
    if "spin" not in names:
        return
    in_leaf += 1
    rooted = names and (names[-1] == "_start" or names[-1].endswith("clone3"))
    if rooted and names.count("recurse") == depth:
        complete += 1
frames = []
for line in open(path, errors="replace"):
    if line.startswith(("\t", " ")) and line.strip():
        frames.append(line.strip())
    else:
        if frames:
            judge(frames)
        frames = []
if frames:
    judge(frames)
print(f"{complete / max(in_leaf, 1):.4f} ({complete}/{in_leaf})")
PY
}

perf_row() { # depth label args...
    local depth="$1" label="$2"; shift 2
    if ! command -v perf >/dev/null; then echo "| $depth | $label | perf not installed | |"; return; fi
    start "$depth"
    perf record -q -F "$FREQ" "$@" -p "$PID" -o "$TMP/perf.data" -- sleep "$RUN_SECONDS" >/dev/null 2>&1 || true
    stop
    perf script -i "$TMP/perf.data" -F comm,tid,ip,sym 2>/dev/null > "$TMP/perf.txt" || true
    echo "| $depth | $label | $(complete_fraction "$TMP/perf.txt" "$depth") | |"
}

echo "kernel.perf_event_max_stack = $(cat /proc/sys/kernel/perf_event_max_stack) (perf fp stacks are cut there)"
echo
echo "| depth | profiler | complete stacks | rootline CPU per sample |"
echo "|---|---|---|---|"
declare -A CPU
for depth in $DEPTHS; do
    start "$depth"
    line="$("$RECORD" "$PID" "$RUN_SECONDS" "$depth" "$FREQ")"
    stop
    frac="$(sed -E 's/.*complete=([0-9.]+).*/\1/' <<<"$line")"
    n="$(sed -E 's/.*in_leaf=([0-9]+).*/\1/' <<<"$line")"
    cpu="$(sed -E 's/.*cpu_us_per_sample=([0-9.]+).*/\1/' <<<"$line")"
    CPU[$depth]="$cpu"
    echo "| $depth | rootline | $frac ($n samples) | ${cpu} µs |"
    echo "$line" >> "$TMP/rootline.txt"
    perf_row "$depth" "perf fp (default sysctl)" --call-graph fp
    perf_row "$depth" "perf dwarf (64 KB)" --call-graph dwarf,65528
    if command -v samply >/dev/null; then
        echo "| $depth | samply | installed but not scripted here | |"
    else
        echo "| $depth | samply | not installed | |"
    fi
done
echo
sed 's/^/rootline: /' "$TMP/rootline.txt"
first="${DEPTHS%% *}"
if [[ -n "${CPU[10000]:-}" && -n "${CPU[$first]:-}" ]]; then
    python3 -c "print(f'rootline CPU per sample, depth 10000 vs depth $first: {${CPU[10000]} / ${CPU[$first]}:.1f}x (target <= 4x)')"
fi
if [[ -n "${SOAK_SECONDS:-}" ]]; then
    start 10000
    echo "soak ${SOAK_SECONDS}s at depth 10000: $("$RECORD" "$PID" "$SOAK_SECONDS" 10000 "$FREQ")"
    stop
fi
