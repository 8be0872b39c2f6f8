//! Benchmark, run on demand (`cargo test -p rootline-agent --test rust_build -- --ignored
//! --nocapture`): the agent with its default settings profiles the host while cargo builds two
//! crates from the local registry (regex-syntax, and zstd-sys, whose C is compiled by cc1) in a
//! fresh target directory. It prints, for rustc's samples (a `rustc_` frame), LLVM's (an `llvm::`
//! frame) and cc1's (`toplev::main`, or a `cc1+0x…` frame where cc1 is stripped), how many are
//! whole (no `[truncated: …]` frame), and the agent's RSS growth against `memory_limit`; it fails
//! below 99% whole or past the limit.
//!
//! `ROOTLINE_BENCH_KERNEL_WALK=off` runs the same with `kernel_walk = "off"`, for comparison;
//! `ROOTLINE_BENCH_MODULES_MIB=N` raises `modules.byte_budget` (and `memory_limit` with it) to
//! N MiB: the budget is shared by every process on the host; `ROOTLINE_BENCH_KERNEL_ROWS_MIB=N`
//! raises `modules.kernel_rows` (and `memory_limit` with it) to N MiB.

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{CollectingExporter, rss_bytes, stats_or_skip_without_perf_events};
use rootline_agent::config::KernelWalkSetting;
use rootline_agent::{Agent, AgentConfig};

const MANIFEST: &str = r#"[package]
name = "bench_build"
version = "0.1.0"
edition = "2021"
[dependencies]
regex-syntax = "=0.8.5"
zstd-sys = "=2.1.3"
"#;

#[test]
#[ignore = "a benchmark: builds crates for a minute or more"]
fn agent_during_a_rust_build() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("Cargo.toml"), MANIFEST).unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/main.rs"), "fn main() {}\n").unwrap();
    let mut config = AgentConfig {
        export_interval: Duration::from_secs(1),
        ..AgentConfig::default()
    };
    if std::env::var("ROOTLINE_BENCH_KERNEL_WALK").as_deref() == Ok("off") {
        config.kernel_walk = KernelWalkSetting::Off;
    }
    if let Some(mib) = std::env::var("ROOTLINE_BENCH_MODULES_MIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        let more = (mib << 20).saturating_sub(config.modules.byte_budget);
        config.modules.byte_budget += more;
        config.memory_limit += more;
    }
    if let Some(mib) = std::env::var("ROOTLINE_BENCH_KERNEL_ROWS_MIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        // The table and a binary's rows waiting to be placed.
        let more = (mib << 20).saturating_sub(config.modules.kernel_rows);
        config.modules.kernel_rows += more;
        config.memory_limit += 2 * more;
    }
    let (exporter, collected, _) = CollectingExporter::new();
    let source = rootline_agent::default_source(&config).expect("sampler");
    let modules = source.modules().expect("the sampler counts its modules");
    let mut peak_modules = 0;
    let me = std::process::id();
    let rss_before = rss_bytes(me);
    let agent = Agent::start(&config, source, vec![Box::new(exporter)]).unwrap();
    // The agent has read the host's processes before the build starts.
    std::thread::sleep(Duration::from_secs(3));
    let mut build = Command::new("cargo")
        .args(["build", "--offline", "-j", "2"])
        .current_dir(dir.path())
        .env("CARGO_TARGET_DIR", dir.path().join("target"))
        .spawn()
        .expect("cargo runs");
    let started = Instant::now();
    let mut peak = rss_before;
    let status = loop {
        peak = peak.max(rss_bytes(me));
        peak_modules = peak_modules.max(modules.live_bytes());
        if let Some(status) = build.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = started.elapsed();
    let Some(stats) = stats_or_skip_without_perf_events(agent.stop()) else {
        return;
    };
    assert!(status.success(), "the build failed");
    let growth = peak.saturating_sub(rss_before);
    let mut by: BTreeMap<&str, (u64, u64, BTreeMap<String, u64>)> = BTreeMap::new();
    for ((_, names), &n) in &collected.lock().unwrap().stacks {
        let kind = if names
            .iter()
            .any(|f| f.contains("llvm::") || f.starts_with("LLVM"))
        {
            "llvm"
        } else if names.iter().any(|f| f.contains("rustc_")) {
            "rustc"
        } else if names.iter().any(|f| {
            // Debian's cc1 is stripped: its frames are named by offset.
            f == "toplev::main" || f == "compile_file" || f.starts_with("cc1+0x")
        }) {
            "cc1"
        } else {
            continue;
        };
        let e = by.entry(kind).or_default();
        e.0 += n;
        if names[0].starts_with("[truncated") {
            *e.2.entry(names[0].clone()).or_default() += n;
        } else {
            e.1 += n;
        }
    }
    println!(
        "build took {took:?}; kernel_walk = {:?}; agent RSS grew by {:.1} MiB (peak {:.1} MiB, \
         limit {} MiB); walk {:?}; module-limited {}; modules peaked at {:.1} MiB",
        config.kernel_walk,
        growth as f64 / (1 << 20) as f64,
        peak as f64 / (1 << 20) as f64,
        config.memory_limit >> 20,
        stats.kernel_walk,
        stats.module_limited,
        peak_modules as f64 / (1 << 20) as f64,
    );
    for (kind, (all, whole, cut)) in &by {
        println!(
            "{kind}: {whole} of {all} samples whole ({:.1}%); cut: {cut:?}",
            *whole as f64 * 100.0 / (*all).max(1) as f64
        );
    }
    assert!(growth < config.memory_limit as u64, "RSS grew by {growth}");
    for (kind, (all, whole, _)) in &by {
        assert!(whole * 100 >= all * 99, "{kind}: {whole} of {all} whole");
    }
}
