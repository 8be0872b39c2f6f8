//! The capture thread: polls the [`SampleSource`], keeps the target decisions and the
//! [`StackCache`], and writes definitions, evictions and samples into the active buffer. The cache
//! is only touched for samples that fit, so a dropped sample never leaves a stack defined in the
//! cache but missing from the stream.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use rootline_profile::{FrameKind, TruncateReason};

use crate::buffer::{RECORD_COST, Record, SampleRecord, define_cost};
use crate::cache::{InsertPlan, Lookup, StackCache};
use crate::handoff::{Shared, make_room};
use crate::process::ProcessInfo;
use crate::source::{RawSample, SampleSource, SourceError};
use crate::targets::Targets;

/// Longest a capture poll waits, so a stop request is seen quickly.
const POLL_TIMEOUT: Duration = Duration::from_millis(50);

/// The capture thread's state.
pub(crate) struct Capture {
    pub shared: Arc<Shared>,
    pub cache: StackCache,
    pub plan: InsertPlan,
    pub evicted: Vec<u64>,
    /// The id of the stack table the cache's stacks come from (0: none yet).
    pub table: u64,
    /// Target decision per pid seen: `None` = not a target.
    pub processes: HashMap<u32, Option<Arc<ProcessInfo>>>,
    pub targets: Targets,
    pub proc_root: PathBuf,
    pub refresh: Duration,
}

impl Capture {
    /// Runs until the agent stops or `source` fails, then lists the cache's rundown.
    pub fn run(mut self, mut source: Box<dyn SampleSource>) -> Result<(), SourceError> {
        let result = self.poll_loop(source.as_mut());
        let keys = self.cache.rundown();
        let stats = self.cache.stats();
        self.shared.counters.publish_cache(&stats);
        tracing::info!(
            stacks = keys.len(),
            hits = stats.hits,
            misses = stats.misses,
            evictions = stats.evictions,
            "stack cache rundown: {} stacks cached at the end",
            keys.len()
        );
        let mut hand = self.shared.lock();
        hand.capture_done = true;
        drop(hand);
        self.shared.wake.notify_all();
        result
    }

    fn poll_loop(&mut self, source: &mut dyn SampleSource) -> Result<(), SourceError> {
        source.set_targets(self.targets.scan().as_deref())?;
        let mut next_refresh = Instant::now() + self.refresh;
        while !self.shared.stop.load(Relaxed) {
            let stats = source.poll(POLL_TIMEOUT, &mut |sample| self.handle(sample))?;
            if stats.lost > 0 {
                self.shared.counters.lost.fetch_add(stats.lost, Relaxed);
            }
            self.publish_kernel_walk(&stats);
            self.shared.counters.publish_cache(&self.cache.stats());
            if Instant::now() >= next_refresh {
                next_refresh = Instant::now() + self.refresh;
                self.forget_exited();
                if !self.targets.is_host() {
                    source.set_targets(self.targets.scan().as_deref())?;
                }
            }
        }
        let stats = source.finish(&mut |sample| self.handle(sample))?;
        self.shared.counters.lost.fetch_add(stats.lost, Relaxed);
        self.publish_kernel_walk(&stats);
        Ok(())
    }

    /// Keeps the in-kernel walk's latest totals, when the source reported any.
    fn publish_kernel_walk(&self, stats: &crate::source::PollStats) {
        if let Some(w) = stats.kernel_walk {
            *self
                .shared
                .counters
                .kernel_walk
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(w);
        }
    }

    /// Drops the facts of processes that no longer exist, so churn does not grow the table.
    fn forget_exited(&mut self) {
        let root = &self.proc_root;
        self.processes
            .retain(|pid, _| root.join(pid.to_string()).exists());
    }

    /// What is known of `pid` and whether it is a target; `name` is the source's name for it,
    /// used when `/proc` no longer has the process (it lived a few milliseconds).
    fn process(&mut self, pid: u32, name: Option<&str>) -> Option<Arc<ProcessInfo>> {
        if let Some(known) = self.processes.get(&pid) {
            return known.clone();
        }
        let mut info = ProcessInfo::read(&self.proc_root, pid);
        if info.comm.is_none() {
            info.comm = name.map(str::to_string);
        }
        let decision = self.targets.matches(&info).then(|| Arc::new(info));
        self.processes.insert(pid, decision.clone());
        decision
    }

    fn handle(&mut self, sample: &RawSample<'_>) {
        let shared = Arc::clone(&self.shared);
        let counters = &shared.counters;
        let Some(process) = self.process(sample.pid, sample.process_name) else {
            counters.ignored.fetch_add(1, Relaxed);
            return;
        };
        counters.captured.fetch_add(1, Relaxed);
        // A stack cut short starts (root first) with its `[truncated: reason]` frame. A node the
        // table lacks (a broken source) is resolved as a missing definition at export.
        let summary = sample.stacks.summary(sample.stack, |root| {
            (root.kind == FrameKind::Truncated).then(|| {
                TruncateReason::parse_frame_name(&root.name)
                    == Some(TruncateReason::ModuleMemoryLimit)
            })
        });
        let (depth, cut) = summary.unwrap_or((1, None));
        if let Some(module_limited) = cut {
            counters.truncated.fetch_add(1, Relaxed);
            if module_limited {
                counters.module_limited.fetch_add(1, Relaxed);
            }
        }
        let mut hand = shared.lock();
        if sample.stacks.id() != self.table {
            // The source replaced its table: let go of the old one's stacks, in one record.
            if self.cache.stale(sample.stacks) > 0 {
                if !make_room(&shared, &mut hand, 1, RECORD_COST) {
                    counters.dropped.fetch_add(1, Relaxed);
                    return;
                }
                self.cache.evict_stale(sample.stacks, &mut self.evicted);
                self.evicted.clear();
                hand.active.push(Record::Retire {
                    table: sample.stacks.id(),
                });
            }
            self.table = sample.stacks.id();
        }
        if !make_room(&shared, &mut hand, 1, RECORD_COST) {
            counters.dropped.fetch_add(1, Relaxed);
            return;
        }
        let record = |key| {
            Record::Sample(SampleRecord {
                key,
                process,
                tid: sample.tid,
                time_ns: sample.time_ns,
                weight_ns: sample.weight_ns,
                alloc_bytes: sample.alloc_bytes,
                off_cpu: sample.off_cpu,
            })
        };
        match self.cache.lookup(sample.stacks, sample.stack, depth) {
            Lookup::Hit(key) => hand.active.push(record(key)),
            Lookup::Miss(miss) => {
                self.cache.plan_insert(&miss, &mut self.plan);
                let extra = self.plan.evictions() + usize::from(!self.plan.cacheable());
                let records = 2 + extra;
                let bytes = define_cost(depth as usize) + RECORD_COST * (1 + extra);
                if !make_room(&shared, &mut hand, records, bytes) {
                    counters.dropped.fetch_add(1, Relaxed);
                    return;
                }
                let stack = (sample.stacks, sample.stack);
                let inserted = self
                    .cache
                    .insert(&miss, stack, &self.plan, &mut self.evicted);
                let key = inserted.key;
                hand.active.push(Record::Define {
                    key,
                    stack: inserted.stack,
                });
                for evicted in self.evicted.drain(..) {
                    hand.active.push(Record::Evict { key: evicted });
                }
                hand.active.push(record(key));
                if !self.plan.cacheable() {
                    hand.active.push(Record::Evict { key });
                }
            }
        }
    }
}
