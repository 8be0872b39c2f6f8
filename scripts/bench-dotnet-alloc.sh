#!/usr/bin/env bash
# What `rootline dotnet collect --alloc` and `rootline record --alloc` cost an allocating .NET
# program: crates/dotnet/tests/data/Alloc.cs allocates 4 KB arrays as fast as it can; its allocation
# rate is measured over a window of SECS seconds alone, under `dotnet collect` (CPU samples), under
# `dotnet collect --alloc`, under `record -p` (perf) and under `record --alloc -p` (perf and
# allocation ticks), ROUNDS times each (MODES picks some of none, cpu, alloc, record, record-alloc).
# Usage: scripts/bench-dotnet-alloc.sh DOTNET [ROOTLINE]   (DOTNET: a `dotnet` host; ROOTLINE
# defaults to target/release/rootline; SECS=4, ROUNDS=3)
set -euo pipefail
cd "$(dirname "$0")/.."
dotnet=${1:?usage: $0 DOTNET [ROOTLINE]}
rootline=${2:-${CARGO_TARGET_DIR:-target}/release/rootline}
secs=${SECS:-4}
rounds=${ROUNDS:-3}
[ -x "$rootline" ] || { echo "build it first: cargo build --release -p rootline" >&2; exit 1; }
command -v mcs >/dev/null || { echo "needs mcs (apt-get install mono-mcs)" >&2; exit 1; }
version=$(ls "$(dirname "$dotnet")/shared/Microsoft.NETCore.App" | sort -V | tail -1)
major=${version%%.*}
minor=$(echo "$version" | cut -d. -f2)
if [ "$major" -lt 5 ]; then tfm=netcoreapp$major.$minor; else tfm=net$major.$minor; fi
work=$(mktemp -d)
app=
trap '[ -n "$app" ] && kill "$app" 2>/dev/null; rm -rf "$work"' EXIT
mcs -optimize+ -out:"$work/Alloc.exe" crates/dotnet/tests/data/Alloc.cs >/dev/null
cat > "$work/Alloc.runtimeconfig.json" <<JSON
{"runtimeOptions":{"tfm":"$tfm","framework":{"name":"Microsoft.NETCore.App","version":"$version"},"configProperties":{"System.Globalization.Invariant":true}}}
JSON

# One measurement: millions of allocations a second with collection mode $1 (none, cpu, alloc).
measure() {
    "$dotnet" "$work/Alloc.exe" > "$work/out.txt" &
    app=$!
    sleep 2
    local collector=
    case "$1" in
    cpu | alloc)
        local flag=
        [ "$1" = alloc ] && flag=--alloc
        "$rootline" dotnet collect -p "$app" $flag --duration $((secs + 3)) \
            -o "$work/trace.nettrace" 2>/dev/null &
        collector=$!
        sleep 1
        ;;
    record | record-alloc)
        local flag=
        [ "$1" = record-alloc ] && flag=--alloc
        "$rootline" record -p "$app" $flag --duration $((secs + 3)) \
            -o "$work/rec.rlp" 2>/dev/null &
        collector=$!
        sleep 1
        ;;
    esac
    local b0 b1
    b0=$(grep -c beat "$work/out.txt" || true)
    sleep "$secs"
    b1=$(grep -c beat "$work/out.txt" || true)
    [ -n "$collector" ] && wait "$collector"
    kill "$app"
    wait "$app" 2>/dev/null || true
    app=
    # A beat is 2^20 allocations.
    awk -v d=$((b1 - b0)) -v s="$secs" 'BEGIN { printf "%.2f", d * 1.048576 / s }'
}

echo ".NET $version, $secs s windows, M allocations/s (4 KB each)"
for mode in ${MODES:-none cpu alloc record record-alloc}; do
    line="$mode:"
    for _ in $(seq "$rounds"); do line="$line $(measure $mode)"; done
    echo "$line"
done
