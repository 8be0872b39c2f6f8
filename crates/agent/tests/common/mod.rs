//! Helpers shared by the agent's integration tests.
#![allow(dead_code)]

pub mod receiver;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rootline_agent::{
    Agent, AgentConfig, AgentError, ExportBatch, ExportError, Exporter, ProcessProfile,
    SourceError, Stats, SyntheticConfig, SyntheticCounters, SyntheticSource,
};

/// What a [`CollectingExporter`] saw: samples per (pid, root-first stack of names).
#[derive(Debug, Default)]
pub struct Collected {
    pub stacks: BTreeMap<(u32, Vec<String>), u64>,
    pub samples: u64,
    pub batches: u64,
}

/// Switches for a [`CollectingExporter`].
#[derive(Debug, Default)]
pub struct Behaviour {
    /// Sleep this many milliseconds in each export (a stalled receiver).
    pub sleep_ms: AtomicU64,
    /// Fail every export (a dead receiver).
    pub fail: AtomicBool,
    /// Exports attempted.
    pub attempts: AtomicU64,
}

/// An exporter that keeps every stack it is given, in memory.
pub struct CollectingExporter {
    pub collected: Arc<Mutex<Collected>>,
    pub behaviour: Arc<Behaviour>,
}

impl CollectingExporter {
    pub fn new() -> (CollectingExporter, Arc<Mutex<Collected>>, Arc<Behaviour>) {
        let collected = Arc::new(Mutex::new(Collected::default()));
        let behaviour = Arc::new(Behaviour::default());
        (
            CollectingExporter {
                collected: Arc::clone(&collected),
                behaviour: Arc::clone(&behaviour),
            },
            collected,
            behaviour,
        )
    }
}

impl Exporter for CollectingExporter {
    fn name(&self) -> &str {
        "collect"
    }

    fn export_process(
        &mut self,
        _batch: &ExportBatch,
        process: &ProcessProfile,
    ) -> Result<(), ExportError> {
        self.behaviour.attempts.fetch_add(1, Relaxed);
        let sleep = self.behaviour.sleep_ms.load(Relaxed);
        if sleep > 0 {
            std::thread::sleep(Duration::from_millis(sleep));
        }
        if self.behaviour.fail.load(Relaxed) {
            return Err(ExportError::Transport("receiver is down".into()));
        }
        let profile = &process.profile;
        let samples = profile.samples();
        let mut collected = self.collected.lock().unwrap();
        let mut frames = Vec::new();
        for (i, &stack) in samples.stacks.iter().enumerate() {
            frames.clear();
            profile.stack_frames_root_first(stack, &mut frames);
            let names = frames
                .iter()
                .map(|&f| profile.frame_name(f).to_string())
                .collect();
            let pid = profile.thread(samples.threads[i]).pid;
            *collected.stacks.entry((pid, names)).or_default() += samples.values[0][i] as u64;
            collected.samples += samples.values[0][i] as u64;
        }
        collected.batches += 1;
        Ok(())
    }
}

/// Polls `cond` every 20 ms until it holds or `limit` passes; returns whether it held.
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Asserts that the synthetic source behind `counters` delivers exactly `n` samples within
/// `within`.
#[track_caller]
pub fn wait_until_delivered(counters: &SyntheticCounters, n: u64, within: Duration) {
    assert!(wait_for(within, || counters.delivered.load(Relaxed) == n));
}

/// Starts the agent with `config`, a [`SyntheticSource`] made from `synth` (which must set a
/// `limit`) and `exporters`; waits until the source has delivered all `limit` samples (asserting
/// that it does within `within`), then stops the agent and returns its final stats.
#[track_caller]
pub fn run_synthetic_until_delivered(
    config: &AgentConfig,
    synth: SyntheticConfig,
    exporters: Vec<Box<dyn Exporter>>,
    within: Duration,
) -> Stats {
    let limit = synth
        .limit
        .expect("the synthetic source needs a limit to run until");
    let (source, counters) = SyntheticSource::new(synth);
    let agent = Agent::start(config, Box::new(source), exporters).unwrap();
    wait_until_delivered(&counters, limit, within);
    agent.stop().unwrap()
}

/// The result of stopping an agent that ran the real sampler: its stats, or `None` after printing
/// why the test is skipped when perf events are not permitted here and `CI` is not set (in CI
/// that is a failure). Panics on any other error.
#[track_caller]
pub fn stats_or_skip_without_perf_events(result: Result<Stats, AgentError>) -> Option<Stats> {
    match result {
        Ok(stats) => Some(stats),
        Err(AgentError::Source(SourceError::Permission(message)))
            if std::env::var_os("CI").is_none() =>
        {
            eprintln!("skipping: perf events not permitted here: {message}");
            None
        }
        Err(e) => panic!("agent failed: {e}"),
    }
}

/// `n` real processes (`sleep 60`), so that resource attributes come from /proc; the caller
/// kills them.
pub fn children(n: usize) -> Vec<std::process::Child> {
    (0..n)
        .map(|_| {
            std::process::Command::new("sleep")
                .arg("60")
                .spawn()
                .unwrap()
        })
        .collect()
}

/// Resident set size of process `pid` in bytes (from `/proc/PID/status`).
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}
