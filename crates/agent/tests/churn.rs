//! Target churn: real processes start and exit every 100 ms while the agent profiles them (matched
//! by a command-line regex, facts read from /proc, one OTLP-style export per process). The agent
//! neither crashes nor grows: its process table forgets exited processes and its RSS stays flat.
//!
//! The samples come from a source that reports the live children's pids, so this exercises the
//! agent's side of churn (target matching, /proc reads, pruning, per-process export) on every run.

mod common;

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{CollectingExporter, rss_bytes};
use rootline_agent::{
    Agent, AgentConfig, FrameDesc, PollStats, RawSample, SampleSource, SourceError, StackTable,
    TargetConfig,
};

/// Samples every live child once per poll, with a stack naming the child's pid.
struct LiveChildren {
    pids: Arc<Mutex<Vec<u32>>>,
    table: StackTable,
    stack: rootline_profile::StackId,
}

impl SampleSource for LiveChildren {
    fn poll(
        &mut self,
        timeout: Duration,
        sink: &mut dyn FnMut(&RawSample<'_>),
    ) -> Result<PollStats, SourceError> {
        std::thread::sleep(timeout.min(Duration::from_millis(10)));
        let pids = self.pids.lock().unwrap().clone();
        for pid in pids {
            sink(&RawSample {
                off_cpu: false,
                pid,
                tid: pid,
                time_ns: rootline_agent::now_ns(),
                weight_ns: 10_000_000,
                alloc_bytes: 0,
                stack: self.stack,
                stacks: &self.table,
                process_name: None,
            });
        }
        Ok(PollStats::default())
    }
}

#[test]
fn processes_starting_and_exiting_every_100ms() {
    // 16 s in the normal suite; ROOTLINE_CHURN_SECS=60 for the one-minute run.
    let secs = std::env::var("ROOTLINE_CHURN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16u64);
    let run_for = Duration::from_secs(secs.max(6));
    let pids = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    // The spawner: every 100 ms a new child that lives about 100 ms. A marker in the command
    // line makes them targets; the test's own process is not.
    let spawner = {
        let pids = Arc::clone(&pids);
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut children: Vec<std::process::Child> = Vec::new();
            let mut spawned = 0u64;
            while !stop.load(Relaxed) {
                // `$0` of the shell carries the marker into its command line.
                let child = std::process::Command::new("sh")
                    .args(["-c", "sleep 0.1", "rootline-churn-marker"])
                    .spawn();
                let child = match child {
                    Ok(c) => c,
                    Err(_) => break,
                };
                spawned += 1;
                children.push(child);
                children.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
                *pids.lock().unwrap() = children.iter().map(|c| c.id()).collect();
                std::thread::sleep(Duration::from_millis(100));
            }
            for mut c in children {
                let _ = c.kill();
                let _ = c.wait();
            }
            spawned
        })
    };

    let config = AgentConfig {
        export_interval: Duration::from_millis(250),
        target_refresh: Duration::from_millis(200),
        targets: TargetConfig {
            regex: vec!["rootline-churn-marker".into()],
            ..TargetConfig::default()
        },
        ..AgentConfig::default()
    };
    let table = StackTable::new();
    let stack = table.intern(&[
        FrameDesc::native("_start", 0x1000),
        FrameDesc::native("main", 0x2000),
        FrameDesc::native("nanosleep", 0x3000),
    ]);
    let source = LiveChildren {
        pids: Arc::clone(&pids),
        table,
        stack,
    };
    let (exporter, collected, _) = CollectingExporter::new();
    let agent = Agent::start(&config, Box::new(source), vec![Box::new(exporter)]).unwrap();

    let me = std::process::id();
    let started = Instant::now();
    let mut rss = Vec::new();
    while started.elapsed() < run_for {
        std::thread::sleep(Duration::from_secs(1));
        rss.push(rss_bytes(me));
    }
    stop.store(true, Relaxed);
    let spawned = spawner.join().unwrap();
    let stats = agent.stop().unwrap();

    assert!(spawned > 100, "only {spawned} processes started");
    let e = &stats.exporters[0];
    assert_eq!(stats.captured, stats.dropped + e.exported + e.failed);
    assert_eq!(stats.dropped, 0);
    assert!(stats.captured > 200, "{stats:?}");
    // Every sample is of a churning child (the regex matched them, from /proc, while alive).
    let collected = collected.lock().unwrap();
    let distinct: std::collections::BTreeSet<u32> =
        collected.stacks.keys().map(|(pid, _)| *pid).collect();
    assert!(
        distinct.len() > 50,
        "samples from only {} processes",
        distinct.len()
    );
    assert!(!distinct.contains(&me));
    // RSS flat: after warm-up (the first 4 s), the last reading is within 2 MiB of the first.
    let warm = rss[3];
    let last = *rss.last().unwrap();
    eprintln!(
        "churn: {spawned} processes, {} sampled, RSS {:?} MiB",
        distinct.len(),
        rss.iter().map(|r| r / (1 << 20)).collect::<Vec<_>>()
    );
    assert!(
        last <= warm + (2 << 20),
        "RSS grew from {warm} to {last} bytes while processes churned: {rss:?}"
    );
}
