#!/usr/bin/env bash
# Whole stacks on stacks that change, and on a real compiler: rootline with its in-kernel stack
# walk, rootline without it, perf (--call-graph fp and dwarf) and samply (when installed), side by
# side on the same workloads.
#
# 1. Rebuilt recursion (crates/capture/tests/c/rebuild.c): the main thread and a second thread
#    recurse DEPTH levels with 1 KiB of locals per frame, spin ~1 ms, return to their loop and
#    recurse again. Built with frame pointers and without (CFI only); each profiler attaches by
#    PID for RUN_SECONDS at 999 Hz. A sample in `spin` is whole when it runs from the thread's
#    root (_start / clone3) through exactly DEPTH+1 `recurse` frames.
# 2. rustc compiling a crate from the local cargo registry (RUSTC_CRATE, default regex-syntax):
#    share of rustc's samples that reach a thread root with no [truncated]/[unknown] frame, and
#    the profiler's CPU above the bare run (user+sys of profiler and compiler minus the bare
#    compiler's in the same round, median of RUNS rounds), and the profiler's own CPU (user+sys
#    of profiler and compiler minus the compiler's own in that run: what the total costs apart
#    from what the compiler is charged, the sampling interrupt and in-kernel walk among it).
#
# With rootline and samply both run, the two are also compared round by round: in a round both
# run against the same bare compile, so their difference is free of the bare run's noise.
#
# samply is run twice: as it saves by default (`samply`: addresses only; names are looked up
# when the profile is opened, from the binaries then on disk) and with its names gathered while
# recording (`samply-symbols`, --unstable-presymbolicate: a .syms.json beside the profile), which
# is what rootline's recording does (its .rlp carries its frames' names).
#
# Usage: scripts/bench-kernel-walk.sh            (root; DEPTHS="1000 10000" RUN_SECONDS=4 RUNS=3)
#        TOOLS="rootline samply samply-symbols" DEPTHS= RUNS=21 scripts/bench-kernel-walk.sh   (the cost only)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
RUN_SECONDS="${RUN_SECONDS:-4}"
DEPTHS="${DEPTHS-1000 10000}"
RUNS="${RUNS:-3}"
TMP="$(mktemp -d)"
PID=
trap 'if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; fi; rm -rf "$TMP"' EXIT
cd "$ROOT"
cargo build --quiet --release -p rootline
RL="$ROOT/target/release/rootline"
cc -O2 -g -fno-omit-frame-pointer crates/capture/tests/c/rebuild.c -lpthread -o "$TMP/fp"
cc -O2 -g -fomit-frame-pointer crates/capture/tests/c/rebuild.c -lpthread -o "$TMP/nofp"
if [ -n "${TOOLS:-}" ]; then
    read -r -a tools <<<"$TOOLS"
else
    tools=(rootline rootline-no-kernel-walk perf-fp perf-dwarf)
    command -v samply >/dev/null && tools+=(samply samply-symbols)
fi

# perf script → folded (comm;root;…;leaf count)
perf_folded() {
    perf script --no-inline -i "$1" -F comm,ip,sym 2>/dev/null | python3 -c '
import sys, collections
c = collections.Counter(); frames = []; comm = None
def flush():
    if comm is not None:
        c[";".join([comm] + frames[::-1])] += 1
for line in sys.stdin:
    if not line.strip():
        flush(); frames = []; comm = None; continue
    if not line[0].isspace():
        comm = line.split()[0]; continue
    parts = line.split()
    frames.append(parts[1].split("+")[0] if len(parts) > 1 else "[unknown]")
flush()
for k, v in c.items(): print(k, v)'
}

# record TOOL PID OUT SECONDS: attaches TOOL to PID, writes folded stacks to OUT
record() {
    local tool=$1 pid=$2 out=$3 secs=$4
    case $tool in
    rootline) "$RL" record -p "$pid" --duration "$secs" -o "$out" 2>"$out.log" ;;
    rootline-no-kernel-walk) "$RL" record -p "$pid" --kernel-walk off --duration "$secs" -o "$out" 2>"$out.log" ;;
    perf-fp) perf record -q -F 999 -e cpu-clock --call-graph fp -p "$pid" -o "$TMP/p.data" -- sleep "$secs" 2>/dev/null
        perf_folded "$TMP/p.data" >"$out" ;;
    perf-dwarf) perf record -q -F 999 -e cpu-clock --call-graph dwarf -p "$pid" -o "$TMP/p.data" -- sleep "$secs" 2>/dev/null
        perf_folded "$TMP/p.data" >"$out" ;;
    samply) rm -f "$TMP/s.json.gz" "$TMP/s.json.syms.json"
        # Names gathered while recording (.syms.json), read with the profile's addresses.
        timeout --signal=INT "$secs" samply record --save-only --unstable-presymbolicate -r 999 -p "$pid" \
            -o "$TMP/s.json.gz" >/dev/null 2>&1 || true
        python3 "$ROOT/scripts/lib/fxprof_folded.py" "$TMP/s.json.gz" >"$out" 2>/dev/null || : >"$out" ;;
    esac
}

whole_recursion() {
    python3 - "$1" "$2" <<'PY'
import sys
path, depth = sys.argv[1], int(sys.argv[2])
leaf = whole = 0
for line in open(path):
    stack, n = line.rsplit(" ", 1)
    f = stack.split(";")[1:]
    if not f or f[-1] != "spin":
        continue
    leaf += int(n)
    rooted = f[0] == "_start" or f[0].endswith("clone3")
    rec = f[:-1]
    body = rec[len(rec) - rec[::-1].index("cycle"):] if "cycle" in rec else []
    if rooted and len(body) == depth + 1 and all(x == "recurse" for x in body):
        whole += int(n)
print(f"{100 * whole / max(leaf, 1):6.2f}% ({whole}/{leaf})")
PY
}

echo "== rebuilt recursion, attached by PID, ${RUN_SECONDS}s at 999 Hz: whole stacks in the leaf"
for depth in $DEPTHS; do
    for build in fp nofp; do
        for tool in "${tools[@]}"; do
            # The same stacks as `samply`'s (only its names are gathered while recording).
            [ "$tool" = samply-symbols ] && continue
            (ulimit -s $(( (depth + 64) * 2 + 8192 )); exec "$TMP/$build" "$depth" 3600) &
            PID=$!
            sleep 0.5
            record "$tool" "$PID" "$TMP/out.folded" "$RUN_SECONDS"
            kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; PID=
            printf "depth %-6s %-5s %-24s %s\n" "$depth" "$build" "$tool" "$(whole_recursion "$TMP/out.folded" "$depth")"
            if [ "$tool" = rootline ]; then grep -h "in-kernel stack walk" "$TMP/out.folded.log" | sed 's/^/    /' || true; fi
        done
    done
done

# --- rustc
REG=$(ls -d "$HOME"/.cargo/registry/src/*/ 2>/dev/null | head -1)
CRATE_DIR=$(ls -d "$REG"${RUSTC_CRATE:-regex-syntax}-* 2>/dev/null | sort -V | tail -1)
if [ -z "$CRATE_DIR" ]; then
    echo "rustc: no ${RUSTC_CRATE:-regex-syntax} in the local cargo registry; skipped"
    exit 0
fi
# The compiler runs under /usr/bin/time, which writes its own CPU (user, sys) to $TMP/compiler.cpu:
# a profiler's own CPU is the total less the compiler's (unlike the total, it hardly varies from
# round to round).
RUSTC_CMD=(/usr/bin/time -f "%U %S" -o "$TMP/compiler.cpu" rustc --edition 2021 --crate-type lib --crate-name bench -C opt-level=2 -C codegen-units=4 \
    --cap-lints allow -o "$TMP/libbench.rlib" "$CRATE_DIR/src/lib.rs")
echo "== rustc compiling $(basename "$CRATE_DIR") (-C opt-level=2, 4 codegen units), median of $RUNS"
cpu_of() { # CPU seconds (user+sys) of a command and its children (its stderr to $STDERR_TO, if set)
    python3 -c '
import os, resource, subprocess, sys
err = open(os.environ["STDERR_TO"], "w") if os.environ.get("STDERR_TO") else subprocess.DEVNULL
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=err)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{r.ru_utime + r.ru_stime:.2f}")' "$@"
}
whole_share() {
    # The compiler's own thread (comm `rustc`) and LLVM's threads (`opt cgu.N`, `lto cgu.N`)
    # apart: the first is deep and frame-pointer-less, the others shallower with large frames.
    python3 - "$1" <<'PY'
import sys
total = {"rustc": 0, "llvm": 0}
whole = dict(total)
for line in open(sys.argv[1]):
    stack, n = line.rsplit(" ", 1)
    f = stack.split(";")
    kind = "rustc" if f[0] == "rustc" else "llvm" if " cgu." in f[0] else None
    if kind is None or len(f) < 2:
        continue
    total[kind] += int(n)
    # samply's names lose a leading underscore (`_start` is `start` in its .syms.json).
    rooted = f[1] in ("_start", "start") or f[1].endswith("clone3") or f[1] == "clone"
    if rooted and not any(x.startswith("[truncated") or x == "[unknown]" for x in f):
        whole[kind] += int(n)
print("whole: " + ", ".join(f"{100 * whole[k] / max(total[k], 1):.2f}% of {total[k]} {k} samples"
                            for k in ("rustc", "llvm")))
PY
}
# Each profiler writes its own format (rootline .rlp, perf.data, samply's .json.gz), and the
# conversion to folded stacks for the whole-share count comes after, uncounted, for all alike.
# Each round runs the bare compile and then every tool once, and each tool's cost is its CPU minus
# that round's bare run: this VM's runs vary by 10-20% over minutes, more than a profiler costs.
# samply needs kernel.perf_event_paranoid <= 1 even as root (its check). Its --save-only profile
# names no frame, so samply's whole share is counted on samply-symbols' last profile, named by
# its .syms.json (the same stacks: only the names are gathered besides).
declare -A extra own total
bare_all=()
walk_ms=""
for _ in $(seq "$RUNS"); do
    bare=$(cpu_of "${RUSTC_CMD[@]}")
    bare_all+=("$bare")
    for tool in "${tools[@]}"; do
        case $tool in
        rootline) c=$(STDERR_TO="$TMP/rootline.err" cpu_of "$RL" record -o "$TMP/$tool.rlp" -- "${RUSTC_CMD[@]}")
            # The walk's own time in the sampled threads, as `record` reports it (the kernel's
            # BPF run-time statistics): part of the compiler's CPU, not of rootline's own.
            walk_ms+="$(grep -o 'the program took [0-9.]* ms' "$TMP/rootline.err" | awk '{print $4}') " ;;
        rootline-no-kernel-walk) c=$(cpu_of "$RL" record --kernel-walk off -o "$TMP/$tool.rlp" -- "${RUSTC_CMD[@]}") ;;
        perf-fp) c=$(cpu_of perf record -q -F 999 -e cpu-clock --call-graph fp -o "$TMP/$tool.data" -- "${RUSTC_CMD[@]}") ;;
        perf-dwarf) c=$(cpu_of perf record -q -F 999 -e cpu-clock --call-graph dwarf -o "$TMP/$tool.data" -- "${RUSTC_CMD[@]}") ;;
        samply) rm -f "$TMP/s.json.gz"; c=$(cpu_of samply record --save-only -r 999 -o "$TMP/s.json.gz" -- "${RUSTC_CMD[@]}")
            [ -s "$TMP/s.json.gz" ] || echo "samply wrote nothing (kernel.perf_event_paranoid must be <= 1)" >&2 ;;
        samply-symbols) rm -f "$TMP/ss.json.gz" "$TMP/ss.json.syms.json"
            c=$(cpu_of samply record --save-only --unstable-presymbolicate -r 999 -o "$TMP/ss.json.gz" -- "${RUSTC_CMD[@]}")
            [ -s "$TMP/ss.json.syms.json" ] || echo "samply wrote no names (its --unstable-presymbolicate is missing or failed)" >&2 ;;
        esac
        total[$tool]+="$c "
        extra[$tool]+="$(python3 -c "print(f\"{$c - $bare:.2f}\")") "
        own[$tool]+="$(python3 -c "u, s = open('$TMP/compiler.cpu').read().split(); print(f'{$c - float(u) - float(s):.2f}')") "
    done
done
med() { python3 -c 'import statistics,sys; print(f"{statistics.median(map(float, sys.argv[1:])):.2f}")' "$@"; }
bare_med=$(med "${bare_all[@]}")
echo "bare rustc: ${bare_med}s CPU (runs: ${bare_all[*]})"
for tool in "${tools[@]}"; do
    case $tool in
    rootline*) "$RL" convert "$TMP/$tool.rlp" -o "$TMP/$tool.folded" 2>/dev/null ;;
    perf-*) perf_folded "$TMP/$tool.data" >"$TMP/$tool.folded" ;;
    samply) : >"$TMP/$tool.folded" ;;
    samply-symbols) python3 "$ROOT/scripts/lib/fxprof_folded.py" "$TMP/ss.json.gz" >"$TMP/$tool.folded" 2>/dev/null ||
        : >"$TMP/$tool.folded" ;;
    esac
    # shellcheck disable=SC2086
    m=$(med ${extra[$tool]})
    # shellcheck disable=SC2086
    o=$(med ${own[$tool]})
    if [ "$tool" = samply ]; then
        share="whole: as samply-symbols (the same stacks; this profile names no frame)"
    else
        share=$(whole_share "$TMP/$tool.folded")
    fi
    printf "%-24s +%5.2fs CPU over bare (%.2fx; each round: %s), own %.2fs (%s)  %s\n" "$tool" "$m" \
        "$(python3 -c "print(1 + $m / $bare_med)")" "${extra[$tool]% }" "$o" "${own[$tool]% }" "$share"
done
if [ -n "${walk_ms// /}" ]; then
    # shellcheck disable=SC2086
    echo "rootline's in-kernel walk in the compiler's threads: median $(med $walk_ms) ms a recording (each round: ${walk_ms% })"
fi
for other in samply samply-symbols; do
    if [ -n "${total[rootline]:-}" ] && [ -n "${total[$other]:-}" ]; then
        # shellcheck disable=SC2086
        python3 - "$other" ${total[rootline]} -- ${total[$other]} <<'PY'
import statistics, sys
other, cut = sys.argv[1], sys.argv.index("--")
rl, sa = [float(x) for x in sys.argv[2:cut]], [float(x) for x in sys.argv[cut + 1:]]
d = [a - b for a, b in zip(rl, sa)]
print(f"rootline - {other}, same round (over bare, and in total): median {statistics.median(d):+.2f}s; "
      f"rootline at or below {other} in {sum(x <= 0 for x in d)} of {len(d)} rounds "
      f"(each: {' '.join(f'{x:+.2f}' for x in d)})")
PY
    fi
done
