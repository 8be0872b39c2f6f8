//! OTLP/HTTP export against a real HTTP receiver that decodes with the official protos: every
//! sample arrives, counts equal the agent's own totals per process, and a stalled, then dead, then
//! recovered receiver costs exactly the samples the agent says it dropped or failed to deliver.

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use common::receiver::Receiver;
use common::{children, rss_bytes, run_synthetic_until_delivered, wait_for};
use rootline_agent::config::OtlpConfig;
use rootline_agent::{Agent, AgentConfig, SyntheticConfig, SyntheticSource, build_exporters};

fn otlp_config(receiver: &Receiver, interval_ms: u64, timeout_ms: u64) -> AgentConfig {
    let mut config = AgentConfig {
        export_interval: Duration::from_millis(interval_ms),
        export_timeout: Duration::from_millis(timeout_ms),
        ..AgentConfig::default()
    };
    config.exporters.otlp = Some(OtlpConfig {
        endpoint: Some(receiver.endpoint()),
        retries: 1,
        backoff: Duration::from_millis(50),
        ..OtlpConfig::default()
    });
    config
}

#[test]
fn receiver_gets_every_sample_over_several_intervals() {
    let receiver = Receiver::start();
    let config = otlp_config(&receiver, 250, 2000);
    let mut kids = children(3);
    let pids: Vec<u32> = kids.iter().map(|c| c.id()).collect();
    let synth = SyntheticConfig {
        pids: pids.clone(),
        stacks: 30,
        depth: 8,
        rate_per_sec: 1500,
        limit: Some(3000),
    };
    let exporters = build_exporters(&config, |_| None).unwrap();
    let stats = run_synthetic_until_delivered(&config, synth, exporters, Duration::from_secs(20));
    for kid in &mut kids {
        let _ = kid.kill();
        let _ = kid.wait();
    }

    let got = receiver.received();
    assert_eq!(got.bad_requests, 0);
    assert_eq!(stats.captured, 3000);
    assert_eq!(stats.dropped, 0);
    assert_eq!(stats.exporters[0].failed, 0);
    assert_eq!(stats.exporters[0].exported, 3000);
    assert_eq!(got.total(), stats.exporters[0].exported, "{got:?}");
    assert!(
        got.requests >= 3 * 4,
        "several intervals x 3 processes, got {} requests",
        got.requests
    );
    for pid in &pids {
        assert_eq!(got.samples_by_pid[&i64::from(*pid)], 1000, "{got:?}");
        let attrs = &got.resources[&i64::from(*pid)];
        assert_eq!(attrs["process.executable.name"], "sleep");
        assert_eq!(attrs["process.command_line"], "sleep 60");
        assert_eq!(attrs["service.name"], "sleep");
        assert!(attrs.contains_key("host.name"), "{attrs:?}");
    }
    // Leaves arrive under their names.
    assert_eq!(got.leaves.len(), 30);
}

#[test]
fn stalled_dead_and_recovered_receiver() {
    let receiver = Receiver::start();
    let mut config = otlp_config(&receiver, 150, 300);
    config.buffers.bytes = 16 << 10;
    let synth = SyntheticConfig {
        pids: vec![std::process::id()],
        stacks: 40,
        depth: 10,
        rate_per_sec: 2000,
        limit: None,
    };
    let (source, counters) = SyntheticSource::new(synth);
    let exporters = build_exporters(&config, |_| None).unwrap();
    let rss_before = rss_bytes(std::process::id());
    let agent = Agent::start(&config, Box::new(source), exporters).unwrap();
    let exported = || agent.stats().exporters[0].exported;

    assert!(wait_for(Duration::from_secs(10), || exported() > 300));
    // Stalled: answers come after 1 s, past the 300 ms timeout.
    receiver.state.stall_ms.store(1000, Relaxed);
    assert!(wait_for(Duration::from_secs(15), || {
        let s = agent.stats();
        s.dropped > 100 && s.exporters[0].failed > 100
    }));
    let mut peak_rss = rss_bytes(std::process::id());
    // Dead: connections refused.
    receiver.state.stall_ms.store(0, Relaxed);
    receiver.state.down.store(true, Relaxed);
    let failed_before = agent.stats().exporters[0].failed;
    assert!(wait_for(Duration::from_secs(10), || agent
        .stats()
        .exporters[0]
        .failed
        > failed_before + 300));
    peak_rss = peak_rss.max(rss_bytes(std::process::id()));
    // Back: export resumes by itself.
    let before = exported();
    receiver.state.down.store(false, Relaxed);
    assert!(wait_for(Duration::from_secs(15), || exported() > before + 300));
    peak_rss = peak_rss.max(rss_bytes(std::process::id()));
    let stats = agent.stop().unwrap();

    let e = &stats.exporters[0];
    assert_eq!(stats.captured, counters.delivered.load(Relaxed));
    assert_eq!(
        stats.captured,
        stats.dropped + e.exported + e.failed,
        "captured = exported + dropped + failed: {stats:?}"
    );
    let got = receiver.received();
    assert_eq!(got.bad_requests, 0);
    assert_eq!(
        got.total(),
        e.exported,
        "the receiver counted exactly what the agent exported"
    );
    assert!(receiver.state.stalled_requests.load(Relaxed) > 0);
    let growth = peak_rss.saturating_sub(rss_before);
    assert!(
        growth < config.pipeline_memory_estimate() as u64,
        "RSS grew by {growth} bytes, more than the configured bound {}",
        config.pipeline_memory_estimate()
    );
}

/// A stalled receiver costs one process's attempts per export, not every process's: the other
/// processes of the export fail at once, counted exactly.
#[test]
fn stalled_receiver_costs_one_process_retries_per_export() {
    let receiver = Receiver::start();
    receiver.state.stall_ms.store(3000, Relaxed);
    let config = otlp_config(&receiver, 400, 300);
    let mut kids = children(5);
    let pids: Vec<u32> = kids.iter().map(|c| c.id()).collect();
    let synth = SyntheticConfig {
        pids,
        stacks: 10,
        depth: 5,
        rate_per_sec: 500,
        limit: Some(1000),
    };
    let exporters = build_exporters(&config, |_| None).unwrap();
    let stats = run_synthetic_until_delivered(&config, synth, exporters, Duration::from_secs(30));
    for kid in &mut kids {
        let _ = kid.kill();
        let _ = kid.wait();
    }
    let e = &stats.exporters[0];
    assert_eq!(stats.captured, 1000);
    assert_eq!(stats.captured, stats.dropped + e.failed, "{stats:?}");
    assert_eq!(e.exported, 0);
    assert!(e.batches_failed >= 2, "{stats:?}");
    // retries = 1: exactly two attempts per export, whatever the number of processes in it.
    assert_eq!(e.attempts, 2 * e.batches_failed, "{stats:?}");
    assert_eq!(e.retries, e.batches_failed, "{stats:?}");
    assert!(wait_for(Duration::from_secs(5), || receiver
        .state
        .stalled_requests
        .load(Relaxed)
        == e.attempts));
}

/// After a stop request the final export gives up at `shutdown_timeout`, even though the export
/// timeout and retries would allow much more, and counts what it could not send as failed.
#[test]
fn final_export_ends_by_the_shutdown_deadline() {
    let receiver = Receiver::start();
    receiver.state.stall_ms.store(5000, Relaxed);
    // One export a minute: everything goes out in the final export.
    let mut config = otlp_config(&receiver, 60_000, 1000);
    config.shutdown_timeout = Duration::from_millis(1500);
    if let Some(otlp) = &mut config.exporters.otlp {
        otlp.retries = 3;
        otlp.backoff = Duration::from_millis(200);
    }
    let mut kids = children(4);
    let pids: Vec<u32> = kids.iter().map(|c| c.id()).collect();
    let synth = SyntheticConfig {
        pids,
        stacks: 10,
        depth: 5,
        rate_per_sec: 4000,
        limit: Some(400),
    };
    let exporters = build_exporters(&config, |_| None).unwrap();
    let stats = run_synthetic_until_delivered(&config, synth, exporters, Duration::from_secs(10));
    for kid in &mut kids {
        let _ = kid.kill();
        let _ = kid.wait();
    }
    let e = &stats.exporters[0];
    assert_eq!(
        (stats.captured, e.exported, e.failed),
        (400, 0, 400),
        "{stats:?}"
    );
    // A 1 s attempt, a 200 ms backoff, then a second attempt cut to the 300 ms left; without the
    // deadline it would be 4 attempts (1 + 3 retries).
    assert!((1..=2).contains(&e.attempts), "{stats:?}");
    assert_eq!(stats.exports, 1);
}

/// A throttling receiver (503 with `Retry-After: 1` for one second) is retried after the wait it
/// asks for: one throttled answer, then everything is delivered. Retrying on the 50 ms backoff
/// alone would hit the throttle again and, with one retry allowed, fail.
#[test]
fn retry_after_is_honoured() {
    let receiver = Receiver::start();
    receiver.state.throttle_secs.store(1, Relaxed);
    let config = otlp_config(&receiver, 60_000, 3000);
    let synth = SyntheticConfig {
        pids: vec![std::process::id()],
        stacks: 10,
        depth: 5,
        rate_per_sec: 3000,
        limit: Some(300),
    };
    let exporters = build_exporters(&config, |_| None).unwrap();
    let stats = run_synthetic_until_delivered(&config, synth, exporters, Duration::from_secs(10));
    let e = &stats.exporters[0];
    assert_eq!((e.exported, e.failed, e.retries), (300, 0, 1), "{stats:?}");
    assert_eq!(receiver.state.throttled_requests.load(Relaxed), 1);
    assert_eq!(receiver.received().total(), 300);
}

/// A `Retry-After` longer than an export waits fails the export at once, without retries.
#[test]
fn retry_after_longer_than_an_export_waits_gives_up() {
    let receiver = Receiver::start();
    receiver.state.throttle_secs.store(3600, Relaxed);
    let config = otlp_config(&receiver, 200, 3000);
    let synth = SyntheticConfig {
        pids: vec![std::process::id()],
        stacks: 10,
        depth: 5,
        rate_per_sec: 1000,
        limit: Some(600),
    };
    let exporters = build_exporters(&config, |_| None).unwrap();
    let stats = run_synthetic_until_delivered(&config, synth, exporters, Duration::from_secs(10));
    let e = &stats.exporters[0];
    assert_eq!((e.exported, e.failed, e.retries), (0, 600, 0), "{stats:?}");
    assert!(e.batches_failed >= 2, "{stats:?}");
    assert_eq!(
        e.attempts, e.batches_failed,
        "one request per export: {stats:?}"
    );
    assert_eq!(receiver.state.throttled_requests.load(Relaxed), e.attempts);
}
