//! The agent with the real sampler (rootline-capture, perf_event_open with cpu-clock on every
//! CPU): several busy target processes, picked by a command-line regex, exported over OTLP/HTTP
//! to a receiver that decodes with the official protos. Every sample the agent captured arrives,
//! per process, and nothing of non-target processes does.

mod common;

use std::time::Duration;

use common::receiver::Receiver;
use common::stats_or_skip_without_perf_events;
use rootline_agent::config::OtlpConfig;
use rootline_agent::{Agent, AgentConfig, TargetConfig, build_exporters};

const MARKER: &str = "rootline-real-capture-target";

fn busy_children(n: usize) -> Vec<std::process::Child> {
    (0..n)
        .map(|_| {
            // `$0` carries the marker into the command line; the loop keeps a CPU busy.
            std::process::Command::new("sh")
                .args(["-c", "while :; do :; done", MARKER])
                .spawn()
                .unwrap()
        })
        .collect()
}

#[test]
fn busy_targets_sampled_and_every_sample_exported() {
    let receiver = Receiver::start();
    let mut config = AgentConfig {
        export_interval: Duration::from_millis(500),
        export_timeout: Duration::from_secs(5),
        targets: TargetConfig {
            regex: vec![MARKER.into()],
            ..TargetConfig::default()
        },
        ..AgentConfig::default()
    };
    config.exporters.otlp = Some(OtlpConfig {
        endpoint: Some(receiver.endpoint()),
        ..OtlpConfig::default()
    });
    let mut kids = busy_children(3);
    let pids: Vec<i64> = kids.iter().map(|c| i64::from(c.id())).collect();
    let source = match rootline_agent::default_source(&config) {
        Ok(s) => s,
        Err(e) => panic!("cannot start the sampler: {e}"),
    };
    let exporters = build_exporters(&config, |_| None).unwrap();
    let agent = Agent::start(&config, source, exporters).unwrap();
    std::thread::sleep(Duration::from_secs(4));
    let result = agent.stop();
    for kid in &mut kids {
        let _ = kid.kill();
        let _ = kid.wait();
    }
    let Some(stats) = stats_or_skip_without_perf_events(result) else {
        return;
    };

    let got = receiver.received();
    eprintln!(
        "real capture: {stats:?}\nreceived: {:?}",
        got.samples_by_pid
    );
    let e = &stats.exporters[0];
    // How many samples reach the agent depends on how fast the sampler keeps up on this (shared)
    // machine; the kernel's losses are counted in `lost`. Every captured one must arrive.
    assert!(stats.captured >= 3, "too few samples: {stats:?}");
    assert_eq!(stats.captured, stats.dropped + e.exported + e.failed);
    assert_eq!(e.failed, 0);
    assert_eq!(got.bad_requests, 0);
    assert_eq!(got.total(), e.exported, "receiver total equals the agent's");
    let seen: Vec<i64> = got.samples_by_pid.keys().copied().collect();
    for pid in &seen {
        assert!(pids.contains(pid), "pid {pid} is not a target: {seen:?}");
    }
    for pid in &pids {
        assert!(
            got.samples_by_pid.get(pid).copied().unwrap_or(0) > 0,
            "no samples of busy target {pid}: {:?}",
            got.samples_by_pid
        );
        let attrs = &got.resources[pid];
        assert!(attrs["process.command_line"].contains(MARKER), "{attrs:?}");
    }
}
