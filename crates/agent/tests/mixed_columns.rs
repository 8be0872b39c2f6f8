//! With off-CPU recording and .NET allocation ticks both on, the agent's profiles carry both:
//! the columns `samples`, `cpu`, `off_cpu`, `alloc-bytes`, `alloc-count`, each kind of sample
//! weighing in its own columns and 0 in the others. The samples come from a source that sends a
//! known mix (CPU, off-CPU, allocation) for a real process, a child the agent reads from /proc.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rootline_agent::{
    Agent, AgentConfig, ExportBatch, ExportError, Exporter, FrameDesc, PollStats, ProcessProfile,
    RawSample, SampleSource, SourceError, StackTable, TargetConfig,
};

/// Sends one CPU, one off-CPU and one allocation sample of `pid` per poll, `rounds` times.
struct Mix {
    pid: u32,
    rounds: u32,
    table: StackTable,
    stack: rootline_profile::StackId,
}

const CPU_NS: u64 = 10_000_000;
const OFF_NS: u64 = 3_000_000;
const BYTES: u64 = 100_000;

impl SampleSource for Mix {
    fn poll(
        &mut self,
        timeout: Duration,
        sink: &mut dyn FnMut(&RawSample<'_>),
    ) -> Result<PollStats, SourceError> {
        std::thread::sleep(timeout.min(Duration::from_millis(10)));
        if self.rounds == 0 {
            return Ok(PollStats::default());
        }
        self.rounds -= 1;
        for (off_cpu, weight_ns, alloc_bytes) in
            [(false, CPU_NS, 0), (true, OFF_NS, 0), (false, 0, BYTES)]
        {
            sink(&RawSample {
                off_cpu,
                pid: self.pid,
                tid: self.pid,
                time_ns: rootline_agent::now_ns(),
                weight_ns,
                alloc_bytes,
                stack: self.stack,
                stacks: &self.table,
                process_name: None,
            });
        }
        Ok(PollStats::default())
    }
}

/// Sums of each column by name, and the values of every sample.
#[derive(Default)]
struct Columns {
    sums: BTreeMap<String, i64>,
    rows: Vec<Vec<(String, i64)>>,
}

struct Keep(Arc<Mutex<Columns>>);

impl Exporter for Keep {
    fn name(&self) -> &str {
        "keep"
    }

    fn export_process(
        &mut self,
        _batch: &ExportBatch,
        process: &ProcessProfile,
    ) -> Result<(), ExportError> {
        let profile = &process.profile;
        let types = profile.sample_types();
        let samples = profile.samples();
        let mut kept = self.0.lock().unwrap();
        for i in 0..samples.len() {
            let row: Vec<(String, i64)> = types
                .iter()
                .enumerate()
                .map(|(c, t)| (t.name.clone(), samples.values[c][i]))
                .collect();
            for (name, v) in &row {
                *kept.sums.entry(name.clone()).or_default() += v;
            }
            kept.rows.push(row);
        }
        Ok(())
    }
}

#[test]
fn off_cpu_and_allocation_samples_share_a_profile_in_their_own_columns() {
    let mut child = std::process::Command::new("sh")
        .args(["-c", "sleep 30", "rootline-mixed-marker"])
        .spawn()
        .unwrap();
    let mut config = AgentConfig {
        export_interval: Duration::from_millis(200),
        target_refresh: Duration::from_millis(100),
        targets: TargetConfig {
            regex: vec!["rootline-mixed-marker".into()],
            ..TargetConfig::default()
        },
        ..AgentConfig::default()
    };
    config.off_cpu.enabled = true;
    config.dotnet.allocation_ticks = true;
    let table = StackTable::new();
    let stack = table.intern(&[
        FrameDesc::native("_start", 0x1000),
        FrameDesc::native("main", 0x2000),
    ]);
    let rounds = 20;
    let source = Mix {
        pid: child.id(),
        rounds,
        table,
        stack,
    };
    let kept = Arc::new(Mutex::new(Columns::default()));
    let agent = Agent::start(
        &config,
        Box::new(source),
        vec![Box::new(Keep(kept.clone()))],
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let stats = agent.stop().unwrap();
    let _ = child.kill();
    let _ = child.wait();

    let kept = kept.lock().unwrap();
    assert_eq!(stats.dropped, 0, "{stats:?}");
    assert_eq!(kept.rows.len() as u32, 3 * rounds, "{stats:?}");
    let names: Vec<&str> = kept.rows[0].iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["samples", "cpu", "off_cpu", "alloc-bytes", "alloc-count"]
    );
    let n = i64::from(rounds);
    let want: BTreeMap<String, i64> = [
        ("samples", n),
        ("cpu", n * CPU_NS as i64),
        ("off_cpu", n * OFF_NS as i64),
        ("alloc-bytes", n * BYTES as i64),
        ("alloc-count", n),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(kept.sums, want);
    // Each sample weighs in one kind of column only.
    for row in &kept.rows {
        let nonzero: Vec<&str> = row
            .iter()
            .filter(|(_, v)| *v != 0)
            .map(|(n, _)| n.as_str())
            .collect();
        assert!(
            matches!(
                nonzero.as_slice(),
                ["samples", "cpu"] | ["off_cpu"] | ["alloc-bytes", "alloc-count"]
            ),
            "{row:?}"
        );
    }
}
