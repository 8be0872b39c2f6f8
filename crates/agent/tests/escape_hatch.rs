//! The escape hatch: a stalled, then dead, then recovered exporter. Memory stays bounded, every
//! sample is accounted for exactly, and export resumes by itself. (Its own test binary, so the RSS
//! it measures is not shared with other tests.)

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use common::{CollectingExporter, rss_bytes, wait_for};
use rootline_agent::{Agent, AgentConfig, SyntheticConfig, SyntheticSource};

const PIDS: [u32; 3] = [4_100_001, 4_100_002, 4_100_003];

#[test]
fn stalled_then_dead_exporter_drops_exactly_and_export_resumes() {
    let synth = SyntheticConfig {
        pids: PIDS.to_vec(),
        stacks: 50,
        depth: 10,
        rate_per_sec: 3000,
        limit: None,
    };
    // Small buffers (about 340 records each) so a stall fills both quickly.
    let mut config = AgentConfig {
        export_interval: Duration::from_millis(100),
        ..AgentConfig::default()
    };
    config.buffers.bytes = 16 << 10;
    config.cache.byte_budget = 1 << 20;
    config.validate().unwrap();
    let (source, counters) = SyntheticSource::new(synth);
    let (exporter, collected, behaviour) = CollectingExporter::new();
    let rss_before = rss_bytes(std::process::id());
    let agent = Agent::start(&config, Box::new(source), vec![Box::new(exporter)]).unwrap();

    // Healthy.
    assert!(wait_for(Duration::from_secs(10), || agent
        .stats()
        .exporters[0]
        .exported
        > 500));
    // Stalled: every export takes 600 ms (longer than the interval).
    behaviour.sleep_ms.store(600, Relaxed);
    assert!(wait_for(Duration::from_secs(10), || agent.stats().dropped > 200));
    // Dead: exports fail.
    behaviour.sleep_ms.store(0, Relaxed);
    behaviour.fail.store(true, Relaxed);
    assert!(wait_for(Duration::from_secs(10), || agent
        .stats()
        .exporters[0]
        .failed
        > 500));
    let mut peak_rss = rss_bytes(std::process::id());
    // Back: exports succeed again without any intervention.
    let exported_while_down = agent.stats().exporters[0].exported;
    behaviour.fail.store(false, Relaxed);
    assert!(wait_for(Duration::from_secs(10), || agent
        .stats()
        .exporters[0]
        .exported
        > exported_while_down + 500));
    peak_rss = peak_rss.max(rss_bytes(std::process::id()));
    let stats = agent.stop().unwrap();

    let e = &stats.exporters[0];
    assert!(stats.dropped > 0 && e.failed > 0);
    assert_eq!(stats.captured, counters.delivered.load(Relaxed));
    assert_eq!(
        stats.captured,
        stats.dropped + e.exported + e.failed,
        "captured = exported + dropped + failed, exactly: {stats:?}"
    );
    assert_eq!(collected.lock().unwrap().samples, e.exported);
    assert_eq!(stats.unresolved, 0);
    let growth = peak_rss.saturating_sub(rss_before);
    assert!(
        growth < config.pipeline_memory_estimate() as u64,
        "RSS grew by {growth} bytes, more than the configured pipeline bound {}",
        config.pipeline_memory_estimate()
    );
}
