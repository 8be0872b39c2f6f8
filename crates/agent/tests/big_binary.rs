//! The agent's memory cap holds with a target whose binary is several times larger than the cap:
//! binaries are never read whole (only their unwind tables and symbol tables are kept, within
//! `modules.byte_budget`), and stacks through them stay whole.

#[path = "../../capture/tests/common/callgraph.rs"]
mod callgraph;
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use callgraph::build_callgraph;
use common::{CollectingExporter, rss_bytes, stats_or_skip_without_perf_events};
use rootline_agent::{Agent, AgentConfig, TargetConfig};

/// Bytes of padding added to the target's file (a section that is never loaded).
const PADDING: u64 = 640 << 20;

/// The ground-truth call graph program, with `PADDING` bytes of unloaded section added.
fn padded_target() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let base = build_callgraph("big_binary_base", &["-O0", "-fno-omit-frame-pointer"]);
    let pad = dir.join("big_binary_pad");
    std::fs::File::create(&pad)
        .and_then(|f| f.set_len(PADDING))
        .expect("padding file");
    let out = dir.join("big_binary_padded");
    let status = Command::new("objcopy")
        .arg("--add-section")
        .arg(format!(".rootline_pad={}", pad.display()))
        .args(["--set-section-flags", ".rootline_pad=noload,readonly"])
        .arg(&base)
        .arg(&out)
        .status()
        .expect("objcopy runs");
    assert!(status.success());
    let _ = std::fs::remove_file(pad);
    assert!(std::fs::metadata(&out).unwrap().len() > PADDING);
    out
}

#[test]
fn a_binary_larger_than_the_memory_limit_is_profiled_within_it() {
    let binary = padded_target();
    let config = AgentConfig {
        export_interval: Duration::from_millis(500),
        ..AgentConfig::default()
    };
    assert!(
        (config.memory_limit as u64) < PADDING / 2,
        "the binary must dwarf the cap"
    );
    let mut target = Command::new(&binary).args(["4", "1"]).spawn().unwrap();
    let config = AgentConfig {
        targets: TargetConfig {
            pids: vec![target.id()],
            ..TargetConfig::default()
        },
        ..config
    };
    let (exporter, collected, _) = CollectingExporter::new();
    let source = rootline_agent::default_source(&config).expect("sampler");
    let modules = source.modules().expect("the sampler counts its modules");
    let me = std::process::id();
    let rss_before = rss_bytes(me);
    let agent = Agent::start(&config, source, vec![Box::new(exporter)]).unwrap();
    let (mut peak_rss, mut peak_modules) = (rss_before, 0);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        peak_rss = peak_rss.max(rss_bytes(me));
        peak_modules = peak_modules.max(modules.live_bytes());
        std::thread::sleep(Duration::from_millis(20));
    }
    let result = agent.stop();
    let _ = target.kill();
    let _ = target.wait();
    let Some(stats) = stats_or_skip_without_perf_events(result) else {
        return;
    };

    let collected = collected.lock().unwrap();
    let (mut leaf, mut whole) = (0, 0);
    for ((pid, names), &n) in &collected.stacks {
        assert_eq!(*pid, target.id());
        if names.last().map(String::as_str) != Some("leaf") {
            continue;
        }
        leaf += n;
        let caller_is_a = names.len() >= 2 && names[names.len() - 2] == "a";
        if caller_is_a && names.iter().any(|f| f == "main" || f == "worker") {
            whole += n;
        }
    }
    let growth = peak_rss.saturating_sub(rss_before);
    println!(
        "binary {} MiB; agent RSS grew by {:.1} MiB (limit {} MiB), modules peaked at {:.2} MiB; \
         {leaf} leaf samples, {whole} whole; in-kernel walk: {:?}",
        (PADDING >> 20),
        growth as f64 / (1 << 20) as f64,
        config.memory_limit >> 20,
        peak_modules as f64 / (1 << 20) as f64,
        stats.kernel_walk,
    );
    // The host-wide sampler runs at 99 Hz and the target gets what CPU a busy machine leaves it:
    // a few dozen samples already show whether stacks through the big binary are whole.
    assert!(leaf >= 20, "{leaf} leaf samples");
    assert_eq!(
        whole, leaf,
        "every leaf sample runs whole to its thread's root"
    );
    assert!(peak_modules <= config.modules.byte_budget);
    assert!(
        growth < config.memory_limit as u64,
        "RSS grew by {growth} bytes, past memory_limit = {}",
        config.memory_limit
    );
}
