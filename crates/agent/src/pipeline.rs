//! The agent's two threads: starting and stopping them, and the exporter thread.
//!
//! The capture thread ([`crate::capture_thread`]) polls the [`SampleSource`], keeps the stack
//! cache and writes records into the *active* buffer ([`crate::handoff`]). The exporter thread owns nothing while it waits; at each tick of
//! `export_interval` it swaps the active buffer with the empty spare, resolves the records into
//! per-process profiles and runs every exporter on them, then returns the emptied buffer as the new
//! spare. When the active buffer fills up and the spare is there, the capture thread swaps by
//! itself and wakes the exporter early. When the spare is not there — the exporter is still busy
//! with it — both buffers are full: the escape hatch drops the new sample and counts it. The cache
//! is only touched for samples that fit, so a dropped sample never leaves a stack defined in the
//! cache but missing from the stream.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::batch::{BatchBuilder, Resolver};
use crate::buffer::SampleBuffer;
use crate::cache::{InsertPlan, StackCache};
use crate::capture_thread::Capture;
use crate::config::AgentConfig;
use crate::export::Exporter;
use crate::handoff::{Hand, Shared, take_active};
use crate::source::{SampleSource, SourceError};
use crate::stats::{Counters, Stats};
use crate::targets::{TargetError, Targets};
use rootline_profile::TruncateReason;

/// An error starting or running the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A target rule is invalid.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// The sample source failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A thread could not be started or panicked.
    #[error("agent thread: {0}")]
    Thread(String),
}

/// A running agent: a capture thread and an exporter thread.
pub struct Agent {
    shared: Arc<Shared>,
    shutdown_timeout: Duration,
    capture: Option<JoinHandle<Result<(), SourceError>>>,
    exporter: Option<JoinHandle<()>>,
}

impl Agent {
    /// Starts the agent with `source` and `exporters`. `/proc` is read for process facts.
    pub fn start(
        config: &AgentConfig,
        source: Box<dyn SampleSource>,
        exporters: Vec<Box<dyn Exporter>>,
    ) -> Result<Agent, AgentError> {
        Agent::start_with_proc(config, source, exporters, Path::new("/proc"))
    }

    /// Like [`Agent::start`], reading process facts under `proc_root`.
    pub fn start_with_proc(
        config: &AgentConfig,
        source: Box<dyn SampleSource>,
        exporters: Vec<Box<dyn Exporter>>,
        proc_root: &Path,
    ) -> Result<Agent, AgentError> {
        let targets = Targets::new(&config.targets, proc_root)?;
        let modules = source.modules();
        let names = exporters.iter().map(|e| e.name().to_string()).collect();
        let now = crate::now_ns();
        let shared = Arc::new(Shared {
            hand: Mutex::new(Hand {
                active: SampleBuffer::new(config.buffers.bytes),
                active_since_ns: now,
                spare: Some(SampleBuffer::new(config.buffers.bytes)),
                ready: None,
                capture_done: false,
            }),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            deadline: Mutex::new(None),
            counters: Counters::new(names),
        });
        let capture = Capture {
            shared: Arc::clone(&shared),
            cache: StackCache::new(config.cache.limits()),
            plan: InsertPlan::default(),
            evicted: Vec::new(),
            table: 0,
            processes: HashMap::new(),
            targets,
            proc_root: proc_root.to_path_buf(),
            refresh: config.target_refresh,
        };
        let capture = std::thread::Builder::new()
            .name("rootline-capture".into())
            .spawn(move || capture.run(source))
            .map_err(|e| AgentError::Thread(e.to_string()))?;
        let export = ExportLoop {
            shared: Arc::clone(&shared),
            exporters,
            resolver: Resolver::new(),
            interval: config.export_interval,
            sample_rate_hz: config.frequency_hz,
            alloc: config.dotnet.allocation_ticks,
            off_cpu: config.off_cpu.enabled,
            sequence: 0,
            last_status: Stats::default(),
            module_budget: config.modules.byte_budget,
            modules,
        };
        let exporter = std::thread::Builder::new()
            .name("rootline-export".into())
            .spawn(move || export.run())
            .map_err(|e| AgentError::Thread(e.to_string()))?;
        Ok(Agent {
            shared,
            shutdown_timeout: config.shutdown_timeout,
            capture: Some(capture),
            exporter: Some(exporter),
        })
    }

    /// The counters as of now.
    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }

    /// True when the capture thread has ended (stop requested, or the source failed).
    pub fn capture_finished(&self) -> bool {
        self.capture.as_ref().is_none_or(|h| h.is_finished())
    }

    /// Stops capturing, flushes both buffers through a final export, and returns the final
    /// counters. The source's error, if it failed, is returned after the flush. Exports still
    /// running or starting after this call end by `shutdown_timeout` from now; what they could not
    /// deliver by then counts as failed.
    pub fn stop(mut self) -> Result<Stats, AgentError> {
        self.request_stop();
        let capture = self.capture.take().map(|h| h.join());
        let exporter = self.exporter.take().map(|h| h.join());
        if let Some(Err(_)) = exporter {
            return Err(AgentError::Thread("exporter thread panicked".into()));
        }
        match capture {
            Some(Err(_)) => return Err(AgentError::Thread("capture thread panicked".into())),
            Some(Ok(Err(e))) => return Err(e.into()),
            _ => {}
        }
        Ok(self.stats())
    }

    /// Runs until `stop` becomes true (e.g. set by a SIGTERM handler) or the source fails, then
    /// stops as [`Agent::stop`] does.
    pub fn run_until(self, stop: &AtomicBool) -> Result<Stats, AgentError> {
        while !stop.load(Relaxed) && !self.capture_finished() {
            std::thread::sleep(Duration::from_millis(100));
        }
        self.stop()
    }
}

impl Agent {
    fn request_stop(&self) {
        let deadline = Instant::now() + self.shutdown_timeout;
        self.shared
            .deadline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(deadline);
        self.shared.stop.store(true, Relaxed);
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.request_stop();
        if let Some(h) = self.capture.take() {
            let _ = h.join();
        }
        if let Some(h) = self.exporter.take() {
            let _ = h.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// exporter thread

struct ExportLoop {
    shared: Arc<Shared>,
    exporters: Vec<Box<dyn Exporter>>,
    resolver: Resolver,
    interval: Duration,
    sample_rate_hz: u32,
    /// Profiles carry the allocation columns (`dotnet.allocation_ticks`).
    alloc: bool,
    /// Profiles carry the `off_cpu` sample type.
    off_cpu: bool,
    sequence: u64,
    last_status: Stats,
    /// `modules.byte_budget`, named in the warning when stacks end at it.
    module_budget: usize,
    /// Where the source counts its modules, when it loads any.
    modules: Option<rootline_image::ModuleBudget>,
}

enum Take {
    Early,
    Tick,
    Final,
}

impl ExportLoop {
    fn run(mut self) {
        let mut next_tick = Instant::now() + self.interval;
        loop {
            let (taken, why) = self.wait_for_buffer(next_tick);
            if let Some((buffer, start, end)) = taken {
                let buffer = self.export_buffer(buffer, start, end);
                let mut hand = self.shared.lock();
                hand.spare = Some(buffer);
            }
            match why {
                Take::Early => {}
                Take::Tick => {
                    self.log_period();
                    next_tick += self.interval;
                    let now = Instant::now();
                    if next_tick <= now {
                        next_tick = now + self.interval;
                    }
                }
                Take::Final => {
                    // Both buffers: `ready` (if any) went first, then the active one.
                    let leftover = {
                        let mut hand = self.shared.lock();
                        take_active(&mut hand)
                    };
                    if let Some((buffer, start, end)) = leftover {
                        let buffer = self.export_buffer(buffer, start, end);
                        self.shared.lock().spare = Some(buffer);
                    }
                    for exporter in &mut self.exporters {
                        if let Err(err) = exporter.finish() {
                            tracing::warn!(exporter = exporter.name(), "final flush failed: {err}");
                        }
                    }
                    self.resolver.clear();
                    self.log_period();
                    return;
                }
            }
        }
    }

    /// Waits for a full buffer, the next tick or the end of capture, and takes the buffer to export.
    #[allow(clippy::type_complexity)]
    fn wait_for_buffer(&self, next_tick: Instant) -> (Option<(SampleBuffer, u64, u64)>, Take) {
        let mut hand = self.shared.lock();
        loop {
            if let Some(ready) = hand.ready.take() {
                return (Some(ready), Take::Early);
            }
            if hand.capture_done {
                return (None, Take::Final);
            }
            let now = Instant::now();
            if now >= next_tick {
                return (take_active(&mut hand), Take::Tick);
            }
            hand = self
                .shared
                .wake
                .wait_timeout(hand, next_tick - now)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    fn export_buffer(&mut self, mut buffer: SampleBuffer, start: u64, end: u64) -> SampleBuffer {
        let counters = &self.shared.counters;
        counters.handed.fetch_add(buffer.samples(), Relaxed);
        let mut builder = BatchBuilder::new(Some(self.sample_rate_hz), self.alloc);
        if self.off_cpu {
            builder.with_off_cpu();
        }
        self.resolver.drain_into(&buffer, &mut builder);
        counters
            .unresolved
            .store(self.resolver.unresolved(), Relaxed);
        buffer.clear();
        self.sequence += 1;
        let batch = builder.finish(self.sequence, start, end);
        if batch.samples == 0 {
            return buffer;
        }
        counters.exports.fetch_add(1, Relaxed);
        let deadline = *self
            .shared
            .deadline
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (exporter, c) in self.exporters.iter_mut().zip(&counters.exporters) {
            exporter.set_deadline(deadline);
            let began = Instant::now();
            let outcome = exporter.export(&batch);
            let micros = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
            c.last_latency_us.store(micros, Relaxed);
            c.exported.fetch_add(outcome.exported, Relaxed);
            c.failed.fetch_add(outcome.failed, Relaxed);
            let requests = exporter.requests();
            c.attempts.store(requests.attempts, Relaxed);
            c.retries.store(requests.retries, Relaxed);
            if outcome.failed == 0 && outcome.error.is_none() {
                c.batches_ok.fetch_add(1, Relaxed);
            } else {
                c.batches_failed.fetch_add(1, Relaxed);
                tracing::warn!(
                    exporter = exporter.name(),
                    failed = outcome.failed,
                    "export failed: {}",
                    outcome.error.as_deref().unwrap_or("unknown error")
                );
            }
        }
        buffer
    }

    /// The status line, and the loss line when samples were dropped or not delivered this period.
    fn log_period(&mut self) {
        let now = self.shared.counters.snapshot();
        let prev = &self.last_status;
        let dropped = now.dropped - prev.dropped;
        if dropped > 0 {
            tracing::warn!(
                dropped,
                "LOSS OF PROFILING DATA: dropped {dropped} samples in the last period because both \
                 sample buffers were full (the exporter was still busy with the previous one)"
            );
        }
        for (e, p) in now.exporters.iter().zip(&prev.exporters) {
            let failed = e.failed - p.failed;
            if failed > 0 {
                tracing::warn!(
                    exporter = e.name.as_str(),
                    failed,
                    "LOSS OF PROFILING DATA: {failed} samples could not be delivered by {} in the \
                     last period (see the export errors above)",
                    e.name
                );
            }
        }
        let module_limited = now.module_limited - prev.module_limited;
        if module_limited > 0 {
            tracing::warn!(
                module_limited,
                "{module_limited} stacks in the last period end at {}: binaries \
                 or JIT tables did not fit modules.byte_budget ({} MiB); raise it for whole stacks",
                TruncateReason::ModuleMemoryLimit.frame_name(),
                self.module_budget >> 20
            );
        }
        let export_latency_ms = now
            .exporters
            .iter()
            .map(|e| e.last_latency_us)
            .max()
            .unwrap_or(0) as f64
            / 1000.0;
        let export_failed: u64 = now.exporters.iter().map(|e| e.failed).sum();
        let rss_bytes = crate::process::own_rss_bytes().unwrap_or(0);
        // Unwind tables and symbols of the binaries being profiled (`modules.byte_budget`).
        let module_bytes = self.modules.as_ref().map_or(0, |m| m.live_bytes());
        tracing::info!(
            samples = now.captured,
            lost = now.lost,
            dropped = now.dropped,
            ignored = now.ignored,
            cache_hits = now.cache.hits,
            cache_misses = now.cache.misses,
            cache_evictions = now.cache.evictions,
            cache_entries = now.cache.entries,
            cache_bytes = now.cache.bytes,
            export_latency_ms,
            export_failed,
            rss_bytes,
            module_bytes,
            "status: {} modules_mib={:.1} rss_mib={:.1}",
            now.status_line(),
            module_bytes as f64 / (1 << 20) as f64,
            rss_bytes as f64 / (1 << 20) as f64
        );
        // Each exporter's counters as fields, for log pipelines that read JSON.
        for e in &now.exporters {
            tracing::info!(
                exporter = e.name.as_str(),
                exported = e.exported,
                failed = e.failed,
                batches_ok = e.batches_ok,
                batches_failed = e.batches_failed,
                latency_ms = e.last_latency_us as f64 / 1000.0,
                requests = e.attempts,
                retries = e.retries,
                "exporter status: {}",
                e.name
            );
        }
        self.last_status = now;
    }
}
