//! The agent with its default settings keeps deep stacks whole that are rebuilt between samples,
//! within its memory limit: capture's `tests/c/rebuild.c` recurses 1,000 levels with 1 KiB of
//! locals per frame on its main thread and a second thread (a megabyte of stack, far past the
//! 16 KiB a sample copies), spins about a millisecond in the leaf, returns all the way and
//! recurses again. Frames past the copy read live after the sample cannot be proven unchanged
//! (the stack is rebuilt hundreds of times a second), so without the in-kernel walk such stacks
//! end `[truncated: live-unproven]`; with it (the default) they run to the thread's root.

#[path = "../../capture/tests/common/c_program.rs"]
mod c_program;
mod common;

use std::collections::BTreeMap;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::{CollectingExporter, rss_bytes, stats_or_skip_without_perf_events};
use rootline_agent::config::KernelWalkSetting;
use rootline_agent::{Agent, AgentConfig, Stats, TargetConfig};

const DEPTH: usize = 1000;

/// The workload's name (its `comm`, which the agent's target rule matches).
const NAME: &str = "agent_rebuild";

/// How long the agent runs before the workload starts.
const AGENT_START: Duration = Duration::from_secs(3);

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Samples in the leaf, and those of them whole: from the thread's root through exactly
/// `DEPTH + 1` `recurse` frames.
#[derive(Debug, Default)]
struct Verdict {
    in_leaf: u64,
    whole: u64,
    truncated: u64,
    truncated_by: std::collections::BTreeMap<String, u64>,
    examples: Vec<String>,
}

/// Exported stacks: samples by process and frame names, root first.
type Stacks = BTreeMap<(u32, Vec<String>), u64>;

/// A new process's first samples come before the sampler has read its mappings and sent them,
/// with its binaries' rows, to the in-kernel walk; the verdict that must reach 99% counts the
/// samples exported after this.
const WARM_UP: Duration = Duration::from_millis(2000);

/// Runs the agent with `config` on the workload for a few seconds: the verdict on all its
/// samples, on those after [`WARM_UP`], the agent's counters and its RSS growth.
fn profile(
    config: AgentConfig,
    binary: &std::path::Path,
) -> Option<(Verdict, Verdict, Stats, u64)> {
    let config = AgentConfig {
        export_interval: Duration::from_millis(500),
        targets: TargetConfig {
            regex: vec![format!("^{NAME}$")],
            ..TargetConfig::default()
        },
        ..config
    };
    let (exporter, collected, _) = CollectingExporter::new();
    let source = rootline_agent::default_source(&config).expect("sampler");
    let me = std::process::id();
    let rss_before = rss_bytes(me);
    let agent = Agent::start(&config, source, vec![Box::new(exporter)]).unwrap();
    let mut peak = rss_before;
    // A running agent sees the workload start: it has read the host's processes first.
    let settle = Instant::now();
    while settle.elapsed() < AGENT_START {
        peak = peak.max(rss_bytes(me));
        std::thread::sleep(Duration::from_millis(20));
    }
    let target = Killed(
        Command::new(binary)
            .args([DEPTH.to_string(), "30".into()])
            .spawn()
            .expect("starts the workload"),
    );
    let start = Instant::now();
    let mut warm_up = None;
    while start.elapsed() < Duration::from_secs(6) {
        peak = peak.max(rss_bytes(me));
        if warm_up.is_none() && start.elapsed() >= WARM_UP {
            warm_up = Some(collected.lock().unwrap().stacks.clone());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = stats_or_skip_without_perf_events(agent.stop())?;
    drop(target);
    let all = collected.lock().unwrap().stacks.clone();
    Some((
        verdict(&all, &BTreeMap::new()),
        verdict(&all, &warm_up.unwrap_or_default()),
        stats,
        peak.saturating_sub(rss_before),
    ))
}

/// The samples in `all` not already in `before`, judged.
fn verdict(all: &Stacks, before: &Stacks) -> Verdict {
    let mut v = Verdict::default();
    for ((pid, names), &n) in all {
        let n = n - before.get(&(*pid, names.clone())).copied().unwrap_or(0);
        if n == 0 {
            continue;
        }
        if names.last().map(String::as_str) != Some("spin") {
            continue;
        }
        v.in_leaf += n;
        if names[0].starts_with("[truncated") {
            v.truncated += n;
            *v.truncated_by
                .entry(format!("{} after {} frames", names[0], names.len() - 1))
                .or_default() += n;
            continue;
        }
        let main = names.len() > 5
            && names[0] == "_start"
            && names[2..5] == ["__libc_start_call_main", "main", "cycle"];
        let second = names.len() > 4
            && names[0].ends_with("clone3")
            && names[1..4] == ["start_thread", "second", "cycle"];
        let body = if main { 5 } else { 4 };
        let recursion = &names[body.min(names.len())..names.len() - 1];
        if (main || second)
            && recursion.len() == DEPTH + 1
            && recursion.iter().all(|n| n == "recurse")
        {
            v.whole += n;
        } else if v.examples.len() < 4 {
            let head: Vec<_> = names.iter().take(6).collect();
            v.examples
                .push(format!("{head:?} ({} frames)", names.len()));
        }
    }
    v
}

#[test]
fn default_settings_keep_rebuilt_deep_stacks_whole_within_the_memory_limit() {
    let binary = c_program::build_c("rebuild.c", NAME, &["-O1"]);
    let on = AgentConfig::default();
    let limit = on.memory_limit as u64;
    let Some((from_start, walked, stats, growth)) = profile(on, &binary) else {
        return;
    };
    let Some(walk) = stats.kernel_walk else {
        assert!(
            std::env::var_os("CI").is_none(),
            "the in-kernel walk did not load (see the agent's log)"
        );
        eprintln!("skipping: the in-kernel walk cannot load here (see the agent's log)");
        return;
    };
    let off = AgentConfig {
        kernel_walk: KernelWalkSetting::Off,
        ..AgentConfig::default()
    };
    let (_, unwalked, off_stats, _) = profile(off, &binary).expect("perf events worked just now");
    println!(
        "default settings, after the first {WARM_UP:?}: {walked:?}; from the process's start: \
         {from_start:?}; walk {walk:?}, RSS grew {:.1} MiB (limit {} MiB); kernel_walk = \"off\": \
         {unwalked:?} (walk {:?})",
        growth as f64 / (1 << 20) as f64,
        limit >> 20,
        off_stats.kernel_walk,
    );
    assert!(walked.in_leaf >= 50, "{walked:?}");
    assert!(
        walked.whole * 100 >= walked.in_leaf * 99,
        "with the walk, at least 99% whole: {walked:?}"
    );
    assert_eq!(
        from_start.whole + from_start.truncated,
        from_start.in_leaf,
        "every stack not whole ends in an explicit [truncated: …] frame: {from_start:?}"
    );
    assert!(off_stats.kernel_walk.is_none());
    assert!(unwalked.in_leaf >= 50, "{unwalked:?}");
    assert!(
        unwalked.whole * 2 < unwalked.in_leaf,
        "without the walk most of these stacks cannot be proven whole: {unwalked:?}"
    );
    assert!(
        growth < limit,
        "RSS grew by {growth} bytes, past memory_limit = {limit}"
    );
}
