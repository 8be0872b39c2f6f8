//! A deterministic [`SampleSource`] for tests and demonstrations: it replays a fixed working set
//! of stacks for a fixed list of processes at a fixed rate, and counts what it delivered.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use rootline_profile::StackId;

use crate::source::{PollStats, RawSample, SampleSource, SourceError};
use crate::stacks::{FrameDesc, StackTable};

/// Settings of a [`SyntheticSource`].
#[derive(Debug, Clone)]
pub struct SyntheticConfig {
    /// Process ids the samples claim to come from (round robin).
    pub pids: Vec<u32>,
    /// Number of distinct stacks in the working set.
    pub stacks: usize,
    /// Depth of every stack.
    pub depth: usize,
    /// Samples delivered per second of wall time.
    pub rate_per_sec: u64,
    /// Stop after this many samples (`None`: never).
    pub limit: Option<u64>,
}

/// Counters shared with the test that owns the source.
#[derive(Debug, Default)]
pub struct SyntheticCounters {
    /// Samples delivered to the agent so far.
    pub delivered: AtomicU64,
    /// Pauses delivery while true.
    pub paused: AtomicBool,
}

/// The synthetic source. See the module documentation.
pub struct SyntheticSource {
    config: SyntheticConfig,
    /// Each synthetic stack's id in `table`.
    stacks: Vec<StackId>,
    table: StackTable,
    started: Instant,
    next: u64,
    counters: Arc<SyntheticCounters>,
}

impl SyntheticSource {
    /// A source with `config`; its counters are returned for the caller to watch.
    pub fn new(config: SyntheticConfig) -> (SyntheticSource, Arc<SyntheticCounters>) {
        let names: Vec<Arc<str>> = (0..config.stacks + config.depth)
            .map(|i| Arc::from(format!("synthetic_fn_{i}")))
            .collect();
        let module: Arc<str> = Arc::from("/synthetic/libwork.so");
        let stacks = (0..config.stacks)
            .map(|s| {
                let mut frames = vec![FrameDesc {
                    name: Arc::from("_start"),
                    module: Some(Arc::clone(&module)),
                    address: 0x1000,
                    inline_depth: 0,
                    kind: rootline_profile::FrameKind::Native,
                    code: None,
                }];
                for d in 1..config.depth.max(1) {
                    // The leaf differs per stack; callers are shared, as in real programs.
                    let n = if d + 1 == config.depth.max(1) {
                        config.depth + s
                    } else {
                        d
                    };
                    frames.push(FrameDesc {
                        name: Arc::clone(&names[n % names.len()]),
                        module: Some(Arc::clone(&module)),
                        address: 0x10_0000 + (n as u64) * 0x40,
                        inline_depth: 0,
                        kind: rootline_profile::FrameKind::Native,
                        code: None,
                    });
                }
                frames
            })
            .collect::<Vec<_>>();
        let table = StackTable::new();
        let stacks = stacks.iter().map(|frames| table.intern(frames)).collect();
        let counters = Arc::new(SyntheticCounters::default());
        (
            SyntheticSource {
                config,
                stacks,
                table,
                started: Instant::now(),
                next: 0,
                counters: Arc::clone(&counters),
            },
            counters,
        )
    }

    /// The leaf function name of stack `index`.
    pub fn leaf_name(config: &SyntheticConfig, index: usize) -> String {
        if config.depth <= 1 {
            "_start".to_string()
        } else {
            format!("synthetic_fn_{}", config.depth + index)
        }
    }

    /// The stack index sample number `n` uses: a fixed, uneven pattern over the working set.
    pub fn stack_of(config: &SyntheticConfig, n: u64) -> usize {
        let s = config.stacks.max(1) as u64;
        ((n.wrapping_mul(2_654_435_761) >> 7) % s) as usize
    }
}

impl SampleSource for SyntheticSource {
    fn poll(
        &mut self,
        timeout: Duration,
        sink: &mut dyn FnMut(&RawSample<'_>),
    ) -> Result<PollStats, SourceError> {
        std::thread::sleep(timeout.min(Duration::from_millis(10)));
        if self.counters.paused.load(Relaxed) {
            return Ok(PollStats::default());
        }
        let elapsed = self.started.elapsed().as_secs_f64();
        let mut due = (elapsed * self.config.rate_per_sec as f64) as u64;
        if let Some(limit) = self.config.limit {
            due = due.min(limit);
        }
        let now_ns = crate::now_ns();
        while self.next < due && !self.config.pids.is_empty() && !self.stacks.is_empty() {
            let n = self.next;
            let stack = SyntheticSource::stack_of(&self.config, n);
            let pid = self.config.pids[(n % self.config.pids.len() as u64) as usize];
            sink(&RawSample {
                off_cpu: false,
                pid,
                tid: pid,
                time_ns: now_ns,
                weight_ns: 10_101_010,
                alloc_bytes: 0,
                stack: self.stacks[stack],
                stacks: &self.table,
                process_name: None,
            });
            self.counters.delivered.fetch_add(1, Relaxed);
            self.next += 1;
        }
        Ok(PollStats::default())
    }
}
