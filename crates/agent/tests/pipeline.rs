//! The pipeline with the deterministic synthetic source: exact accounting, and whole stacks through
//! a cache far smaller than the working set.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{CollectingExporter, wait_until_delivered};
use rootline_agent::{Agent, AgentConfig, SyntheticConfig, SyntheticSource};

const PIDS: [u32; 3] = [4_100_001, 4_100_002, 4_100_003];

fn config(interval_ms: u64, cache_budget: usize, buffer_bytes: usize) -> AgentConfig {
    let mut config = AgentConfig {
        export_interval: Duration::from_millis(interval_ms),
        target_refresh: Duration::from_millis(200),
        // Room for the largest buffers these tests ask for.
        memory_limit: 384 << 20,
        ..AgentConfig::default()
    };
    config.cache.byte_budget = cache_budget;
    config.cache.buckets = 64;
    config.buffers.bytes = buffer_bytes;
    config.validate().unwrap();
    config
}

/// The (pid, root-first names) histogram the synthetic source produces for its first `n` samples.
fn expected(synth: &SyntheticConfig, n: u64) -> BTreeMap<(u32, Vec<String>), u64> {
    let mut out = BTreeMap::new();
    for i in 0..n {
        let s = SyntheticSource::stack_of(synth, i);
        let pid = synth.pids[(i % synth.pids.len() as u64) as usize];
        let mut names = vec!["_start".to_string()];
        names.extend((1..synth.depth - 1).map(|d| format!("synthetic_fn_{d}")));
        names.push(SyntheticSource::leaf_name(synth, s));
        *out.entry((pid, names)).or_default() += 1;
    }
    out
}

fn run_to_completion(
    config: &AgentConfig,
    synth: SyntheticConfig,
) -> (rootline_agent::Stats, common::Collected) {
    let limit = synth.limit.unwrap();
    let (source, counters) = SyntheticSource::new(synth);
    let (exporter, collected, _) = CollectingExporter::new();
    let agent = Agent::start(config, Box::new(source), vec![Box::new(exporter)]).unwrap();
    wait_until_delivered(&counters, limit, Duration::from_secs(30));
    // Let at least one periodic export happen before the final one.
    std::thread::sleep(Duration::from_millis(300));
    let stats = agent.stop().unwrap();
    let collected = std::mem::take(&mut *collected.lock().unwrap());
    (stats, collected)
}

#[test]
fn every_sample_reaches_the_exporter_with_its_whole_stack() {
    let synth = SyntheticConfig {
        pids: PIDS.to_vec(),
        stacks: 40,
        depth: 12,
        rate_per_sec: 4000,
        limit: Some(4000),
    };
    let want = expected(&synth, 4000);
    let (stats, got) = run_to_completion(&config(200, 8 << 20, 1 << 20), synth);
    assert_eq!(stats.captured, 4000);
    assert_eq!(stats.dropped, 0);
    assert_eq!(stats.handed, 4000);
    assert_eq!(stats.exporters[0].exported, 4000);
    assert_eq!(stats.exporters[0].failed, 0);
    assert_eq!(stats.unresolved, 0);
    assert_eq!(got.samples, 4000);
    assert!(
        got.batches > 3,
        "several periods, got {} batches",
        got.batches
    );
    assert_eq!(got.stacks, want);
    // A generous cache: every stack defined once, then only hits.
    assert_eq!(stats.cache.misses, 40);
    assert_eq!(stats.cache.hits, 4000 - 40);
    assert_eq!(stats.cache.evictions, 0);
    assert_eq!(stats.cache.rundown, 40);
}

#[test]
fn cache_far_below_the_working_set_still_gives_correct_stacks() {
    let synth = SyntheticConfig {
        pids: PIDS.to_vec(),
        stacks: 300,
        depth: 20,
        rate_per_sec: 6000,
        limit: Some(6000),
    };
    let want = expected(&synth, 6000);
    // Room for about 8 of the 300 stacks.
    let budget = rootline_agent::config::stack_budget_for(8, 20);
    // Buffers large enough that this burst of definitions never meets the escape hatch.
    let (stats, got) = run_to_completion(&config(200, budget, 4 << 20), synth);
    assert_eq!(stats.captured, 6000);
    assert_eq!(stats.dropped, 0, "{stats:?}");
    assert_eq!(stats.exporters[0].exported, 6000);
    assert_eq!(stats.unresolved, 0);
    assert_eq!(got.stacks, want, "evictions must only cost re-definitions");
    let c = stats.cache;
    assert_eq!(c.hits + c.misses, 6000);
    assert!(c.misses > 5000, "most lookups miss: {c:?}");
    assert!(c.evictions >= c.misses - 8, "{c:?}");
    assert!(c.rundown <= 8, "{c:?}");
    assert_eq!(
        c.evictions + c.rundown,
        c.misses,
        "every defined stack leaves exactly once"
    );
}
