#!/usr/bin/env bash
# Shows the workspace's crate graph and checks the layering: no cycle between crates (cargo
# refuses those anyway), pure crates free of platform and unsafe code, and no module cycle inside
# any crate (scripts/lib/module_graph.py says how modules are compared).
# Usage: scripts/crate-graph.sh        exit status 1 when a check fails.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo metadata --format-version 1 --no-deps --offline 2>/dev/null | python3 -c '
import json, sys
meta = json.load(sys.stdin)
names = {p["name"] for p in meta["packages"]}
deps = {p["name"]: sorted({d["name"] for d in p["dependencies"]
                           if d["name"] in names and d["kind"] is None})
        for p in meta["packages"]}
order, state = [], {}
def visit(n, path):
    if state.get(n) == 1:
        sys.exit("crate cycle: " + " -> ".join(path + [n]))
    if state.get(n) == 2:
        return
    state[n] = 1
    for d in deps[n]:
        visit(d, path + [n])
    state[n] = 2
    order.append(n)
for n in sorted(deps):
    visit(n, [])
print("crates, each after everything it depends on (normal dependencies):")
for n in order:
    print("  %-18s -> %s" % (n, ", ".join(deps[n]) or "(none)"))
'

# Pure crates: no unsafe code, no libc, no perf.
status=0
for crate in profile formats repair dotnet unwind image; do
    lib="crates/$crate/src/lib.rs"
    if ! grep -q '^#!\[forbid(unsafe_code)\]' "$lib"; then
        echo "crates/$crate is pure but $lib lacks #![forbid(unsafe_code)]"; status=1
    fi
    if grep -Eq '^(libc|perf-event-open-sys|nix)\b' <(sed -n '/^\[dependencies\]/,/^\[/p' "crates/$crate/Cargo.toml"); then
        echo "crates/$crate is pure but depends on a platform crate"; status=1
    fi
done
[ "$status" -eq 0 ] && echo "pure crates (profile, formats, repair, dotnet, unwind, image): no unsafe code, no platform crate"

python3 scripts/lib/module_graph.py crates || status=1
exit "$status"
