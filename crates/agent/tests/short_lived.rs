//! Processes that live a few milliseconds (a build's compilers and assemblers, a shell's
//! commands): the agent learns about a process from its first samples, which reach it a flush
//! later, when such a process is gone from `/proc`. It must still be named (by the name its
//! `exec` gave it, which the sampler saw) and be matched by a name regex, not exported as
//! `unknown` or ignored.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::stats_or_skip_without_perf_events;
use rootline_agent::{
    Agent, AgentConfig, ExportBatch, ExportError, Exporter, ProcessProfile, TargetConfig,
};

/// Samples exported per process name (`(none)` when unnamed).
struct ByName(Arc<Mutex<BTreeMap<String, u64>>>);

impl Exporter for ByName {
    fn name(&self) -> &str {
        "by-name"
    }

    fn export_process(
        &mut self,
        _batch: &ExportBatch,
        process: &ProcessProfile,
    ) -> Result<(), ExportError> {
        let name = process
            .process
            .comm
            .clone()
            .unwrap_or_else(|| "(none)".into());
        *self.0.lock().unwrap().entry(name).or_default() += process.samples;
        Ok(())
    }
}

#[test]
fn processes_gone_before_the_agent_sees_them_are_named_and_matched_by_name() {
    let program = tempfile::tempdir().unwrap();
    let spinner = program.path().join("brief-spinner");
    // Spins ~25 ms, then exits (and the shell reaps it at once).
    std::fs::write(
        program.path().join("spin.c"),
        "#include <time.h>\n\
         int main(void) { struct timespec t, n; clock_gettime(CLOCK_MONOTONIC, &t);\n\
         volatile unsigned long s = 0; do { for (int i = 0; i < 100000; i++) s += i;\n\
         clock_gettime(CLOCK_MONOTONIC, &n); } while ((n.tv_sec - t.tv_sec) * 1000000000L\n\
         + (n.tv_nsec - t.tv_nsec) < 25000000L); return 0; }\n",
    )
    .unwrap();
    let status = std::process::Command::new("cc")
        .args(["-O1", "-o"])
        .arg(&spinner)
        .arg(program.path().join("spin.c"))
        .status()
        .expect("cc runs");
    assert!(status.success());
    let config = AgentConfig {
        export_interval: Duration::from_millis(500),
        targets: TargetConfig {
            regex: vec!["^brief-spinner$".into()],
            ..TargetConfig::default()
        },
        ..AgentConfig::default()
    };
    let names = Arc::new(Mutex::new(BTreeMap::new()));
    let source = rootline_agent::default_source(&config).expect("sampler");
    let agent = Agent::start(&config, source, vec![Box::new(ByName(names.clone()))]).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let script = format!("for i in $(seq 40); do {}; done", spinner.display());
    let status = std::process::Command::new("sh")
        .args(["-c", &script])
        .status()
        .unwrap();
    assert!(status.success());
    std::thread::sleep(Duration::from_secs(1));
    let Some(stats) = stats_or_skip_without_perf_events(agent.stop()) else {
        return;
    };
    let names = names.lock().unwrap();
    println!("{stats:?}\nexported by name: {names:?}");
    let spinners = names.get("brief-spinner").copied().unwrap_or(0);
    // 40 × 25 ms of CPU at 99 Hz: about 99 samples (before, 5 reached the exporter: the rest
    // came from processes `/proc` no longer had, which the regex could not match).
    assert!(
        spinners >= 50,
        "only {spinners} samples of the 40 spinners: {names:?}"
    );
    assert_eq!(
        names.len(),
        1,
        "only the spinners are targets, all named: {names:?}"
    );
}
