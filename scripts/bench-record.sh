#!/usr/bin/env bash
# Side-by-side benchmark of `rootline record` against `perf record --call-graph fp`,
# `perf record --call-graph dwarf` (and `samply record` when installed), at 999 Hz, on the
# ground-truth C workload of crates/capture/tests/c (known call graph, fixed work).
#
# Prints, per profiler and build: samples, wrong-caller rate (samples with an impossible caller
# edge or whose program frames do not hang off main/start_thread), bytes on disk per sample,
# target slowdown (the target's own CPU time with / without the profiler, median of RUNS), the
# profiler's CPU per sample while recording (median of RUNS; this includes fixed start-up costs
# such as loading debug info), its marginal CPU per sample (the extra profiler CPU of a run with
# 4x the work, divided by its extra samples: the steady-state cost), and post-processing CPU per
# sample (perf script / rootline convert to collapsed stacks). samply saves its profile
# unsymbolicated: its samples are counted from the saved profile, its callers are not checked (n/a).
#
# Usage: scripts/bench-record.sh [ITERATIONS] [RUNS]     (root or perf_event_paranoid <= 1)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
iterations=${1:-20000000}
runs=${2:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cargo build --release -q -p rootline
rootline="$root/target/release/rootline"
src="$root/crates/capture/tests/c"
cc -O2 -fno-optimize-sibling-calls -g -o "$work/cg-o2-cfi" "$src/callgraph_main.c" "$src/callgraph_b.c" -lpthread
cc -O0 -fno-omit-frame-pointer -g -o "$work/cg-o0-fp" "$src/callgraph_main.c" "$src/callgraph_b.c" -lpthread

tools=(rootline perf-fp perf-dwarf)
command -v samply >/dev/null && tools+=(samply)

# run TOOL BUILD OUT: runs the workload under TOOL, prints "target_cpu profiler_cpu samples bytes post_cpu"
run() {
    local tool=$1 bin=$2 out=$3
    python3 - "$tool" "$bin" "$out" "$rootline" "${4:-$iterations}" <<'PY'
import os, resource, subprocess, sys, time
tool, binary, out, rootline, iterations = sys.argv[1:6]
cmd = [binary, "0", "1", iterations]
if tool == "rootline":
    prof = [rootline, "record", "-F", "999", "-o", out + ".rlp", "--"] + cmd
elif tool == "perf-fp":
    prof = ["perf", "record", "-q", "-F", "999", "-e", "cpu-clock", "--call-graph", "fp", "-o", out + ".data", "--"] + cmd
elif tool == "perf-dwarf":
    prof = ["perf", "record", "-q", "-F", "999", "-e", "cpu-clock", "--call-graph", "dwarf", "-o", out + ".data", "--"] + cmd
elif tool == "samply":
    prof = ["samply", "record", "--save-only", "-r", "999", "-o", out + ".json.gz", "--"] + cmd
else:
    prof = cmd
before = resource.getrusage(resource.RUSAGE_CHILDREN)
p = subprocess.run(prof, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True)
after = resource.getrusage(resource.RUSAGE_CHILDREN)
total = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
target = float([l.split()[1] for l in p.stdout.splitlines() if l.startswith("cpu_seconds")][0])
# Collapse to "root;...;leaf count" for the checker, timing the post-processing.
post_before = resource.getrusage(resource.RUSAGE_CHILDREN)
folded = out + ".folded"
size = 0
if tool == "rootline":
    size = os.path.getsize(out + ".rlp")
    subprocess.run([rootline, "convert", out + ".rlp", "-o", folded], check=True, stderr=subprocess.DEVNULL)
elif tool.startswith("perf"):
    size = os.path.getsize(out + ".data")
    script = subprocess.run(["perf", "script", "-i", out + ".data", "-F", "tid,ip,sym"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True).stdout
    stacks, frames = {}, []
    def flush():
        if frames:
            key = ";".join(reversed(frames))
            stacks[key] = stacks.get(key, 0) + 1
    for line in script.splitlines():
        if not line.strip():
            flush(); frames = []; continue
        parts = line.split()
        if len(parts) == 1 and parts[0].isdigit():
            continue
        if len(parts) >= 2 and not line.startswith((" ", "\t")):
            continue
        frames.append(parts[1] if len(parts) > 1 else "[unknown]")
    flush()
    with open(folded, "w") as f:
        for k, v in stacks.items():
            f.write(f"x;{k} {v}\n")
elif tool == "samply":
    # samply saves its profile unsymbolicated: its samples are counted, its callers not checked.
    size = os.path.getsize(out + ".json.gz")
    open(folded, "w").close()
post_after = resource.getrusage(resource.RUSAGE_CHILDREN)
post = (post_after.ru_utime - post_before.ru_utime) + (post_after.ru_stime - post_before.ru_stime)
samples = 0
if tool == "samply":
    import gzip, json
    with gzip.open(out + ".json.gz") as f:
        profile = json.load(f)
    samples = sum(t["samples"]["length"] for t in profile["threads"] if t.get("name") != "samply")
with open(folded) as f:
    for line in f:
        samples += int(line.rsplit(" ", 1)[1])
print(target, max(total - target, 0.0), samples, size, post)
PY
}

# check FOLDED: prints the number of samples with a wrong caller
check() {
    python3 - "$1" <<'PY'
import sys
allowed = {("main","work"),("worker","work"),("work","a"),("work","b"),("a","leaf"),("b","leaf_tail")}
program = {"main","work","worker","a","b","leaf","leaf_tail"}
entry_parent = {"main": "__libc_start_call_main", "worker": "start_thread"}
wrong = 0
for line in open(sys.argv[1]):
    stack, n = line.rsplit(" ", 1)
    frames = stack.split(";")[1:]
    idx = [i for i, f in enumerate(frames) if f in program]
    if not idx:
        continue
    first = idx[0]
    ok = frames[first] in entry_parent and first > 0 and frames[first - 1] == entry_parent[frames[first]]
    ok = ok and all(j == i + 1 for i, j in zip(idx, idx[1:]))
    ok = ok and all((frames[i], frames[i + 1]) in allowed for i in idx[:-1])
    if not ok:
        wrong += int(n)
print(wrong)
PY
}

median() { python3 -c 'import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }

printf '%-10s %-10s %8s %12s %10s %10s %14s %14s %14s\n' build profiler samples wrong-caller bytes/smp slowdown rec-cpu/smp marginal/smp post-cpu/smp
for build in cg-o2-cfi cg-o0-fp; do
    bases=()
    for r in $(seq "$runs"); do
        bases+=("$("$work/$build" 0 1 "$iterations" | awk '/cpu_seconds/ {print $2}')")
    done
    base=$(median "${bases[@]}")
    for tool in "${tools[@]}"; do
        targets=(); profs=(); posts=(); samples=0; bytes=0; wrong=0
        for r in $(seq "$runs"); do
            read -r t p s b post < <(run "$tool" "$work/$build" "$work/$build-$tool-$r")
            targets+=("$t"); profs+=("$(python3 -c "print($p / max($s, 1) * 1e6)")")
            posts+=("$(python3 -c "print($post / max($s, 1) * 1e6)")")
            samples=$((samples + s)); bytes=$((bytes + b))
            wrong=$((wrong + $(check "$work/$build-$tool-$r.folded")))
        done
        t=$(median "${targets[@]}")
        # Marginal cost: a run with 4x the work against the last run above.
        read -r _ p4 s4 _ _ < <(run "$tool" "$work/$build" "$work/$build-$tool-long" $((iterations * 4)))
        marginal=$(python3 -c "print(max($p4 - $p, 0) / max($s4 - $s, 1) * 1e6)")
        # samply's saved profile has no names to check callers by.
        wrong_share=$(python3 -c "print('n/a' if '$tool' == 'samply' else f'{100 * $wrong / max($samples, 1):.3f}%')")
        printf '%-10s %-10s %8d %12s %10.1f %9.3fx %11.2f µs %11.2f µs %11.2f µs\n' "$build" "$tool" "$samples" \
            "$wrong_share" \
            "$(python3 -c "print($bytes / max($samples, 1))")" \
            "$(python3 -c "print($t / $base)")" "$(median "${profs[@]}")" "$marginal" "$(median "${posts[@]}")"
    done
done
