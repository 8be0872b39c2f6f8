//! The agent's counters: shared atomics written by the two threads, read as a [`Stats`] snapshot.
//!
//! Accounting is exact. Every sample of a target process that the source delivers is *captured*;
//! it is then either *dropped* by the escape hatch (both buffers full) or *handed* to the exporter
//! thread, and every handed sample is, for each exporter, either *exported* or *failed*. So, once
//! the agent has stopped, `captured = dropped + exported + failed` holds for each exporter.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::cache::CacheStats;
use crate::source::KernelWalkCounts;

/// Counters of one exporter.
#[derive(Debug, Default)]
pub(crate) struct ExporterCounters {
    pub name: String,
    pub exported: AtomicU64,
    pub failed: AtomicU64,
    pub batches_ok: AtomicU64,
    pub batches_failed: AtomicU64,
    pub last_latency_us: AtomicU64,
    pub attempts: AtomicU64,
    pub retries: AtomicU64,
}

/// All counters of a running agent.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub captured: AtomicU64,
    pub truncated: AtomicU64,
    pub module_limited: AtomicU64,
    pub lost: AtomicU64,
    pub dropped: AtomicU64,
    pub ignored: AtomicU64,
    pub handed: AtomicU64,
    pub exports: AtomicU64,
    pub unresolved: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    pub cache_evictions: AtomicU64,
    pub cache_rundown: AtomicU64,
    pub cache_entries: AtomicU64,
    pub cache_bytes: AtomicU64,
    /// The sampler's in-kernel walk, when it runs.
    pub kernel_walk: std::sync::Mutex<Option<KernelWalkCounts>>,
    pub exporters: Vec<ExporterCounters>,
}

/// A snapshot of one exporter's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExporterStats {
    /// The exporter's name.
    pub name: String,
    /// Samples delivered.
    pub exported: u64,
    /// Samples given up on after retries.
    pub failed: u64,
    /// Exports (batches) fully delivered.
    pub batches_ok: u64,
    /// Exports with at least one failed process.
    pub batches_failed: u64,
    /// Duration of the last export, microseconds.
    pub last_latency_us: u64,
    /// Requests sent to a receiver (first tries and retries; 0 for file exporters).
    pub attempts: u64,
    /// Requests that repeated a failed one.
    pub retries: u64,
}

/// A snapshot of the agent's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Samples of target processes received from the source.
    pub captured: u64,
    /// Of those, stacks that end in an explicit `[truncated: reason]` frame.
    pub truncated: u64,
    /// Of those, stacks cut at `[truncated: module-memory-limit]`: code whose tables did not
    /// fit `modules.byte_budget`.
    pub module_limited: u64,
    /// Samples the source or kernel lost before the agent saw them.
    pub lost: u64,
    /// Samples dropped by the escape hatch because both buffers were full.
    pub dropped: u64,
    /// Samples of processes that are not targets.
    pub ignored: u64,
    /// Samples handed to the exporter thread.
    pub handed: u64,
    /// Batches exported.
    pub exports: u64,
    /// Samples whose stack definition was missing (0 unless something is broken).
    pub unresolved: u64,
    /// Stack cache counters.
    pub cache: CacheStats,
    /// The sampler's in-kernel stack walk (None: off or unavailable).
    pub kernel_walk: Option<KernelWalkCounts>,
    /// Per-exporter counters.
    pub exporters: Vec<ExporterStats>,
}

impl Counters {
    pub fn new(exporter_names: Vec<String>) -> Counters {
        Counters {
            exporters: exporter_names
                .into_iter()
                .map(|name| ExporterCounters {
                    name,
                    ..ExporterCounters::default()
                })
                .collect(),
            ..Counters::default()
        }
    }

    pub fn publish_cache(&self, stats: &CacheStats) {
        self.cache_hits.store(stats.hits, Relaxed);
        self.cache_misses.store(stats.misses, Relaxed);
        self.cache_evictions.store(stats.evictions, Relaxed);
        self.cache_rundown.store(stats.rundown, Relaxed);
        self.cache_entries.store(stats.entries, Relaxed);
        self.cache_bytes.store(stats.bytes, Relaxed);
    }

    pub fn snapshot(&self) -> Stats {
        Stats {
            captured: self.captured.load(Relaxed),
            truncated: self.truncated.load(Relaxed),
            module_limited: self.module_limited.load(Relaxed),
            lost: self.lost.load(Relaxed),
            dropped: self.dropped.load(Relaxed),
            ignored: self.ignored.load(Relaxed),
            handed: self.handed.load(Relaxed),
            exports: self.exports.load(Relaxed),
            unresolved: self.unresolved.load(Relaxed),
            cache: CacheStats {
                hits: self.cache_hits.load(Relaxed),
                misses: self.cache_misses.load(Relaxed),
                evictions: self.cache_evictions.load(Relaxed),
                rundown: self.cache_rundown.load(Relaxed),
                entries: self.cache_entries.load(Relaxed),
                bytes: self.cache_bytes.load(Relaxed),
            },
            kernel_walk: *self.kernel_walk.lock().unwrap_or_else(|e| e.into_inner()),
            exporters: self
                .exporters
                .iter()
                .map(|e| ExporterStats {
                    name: e.name.clone(),
                    exported: e.exported.load(Relaxed),
                    failed: e.failed.load(Relaxed),
                    batches_ok: e.batches_ok.load(Relaxed),
                    batches_failed: e.batches_failed.load(Relaxed),
                    last_latency_us: e.last_latency_us.load(Relaxed),
                    attempts: e.attempts.load(Relaxed),
                    retries: e.retries.load(Relaxed),
                })
                .collect(),
        }
    }
}

impl Stats {
    /// The one-line status the agent logs every period.
    pub fn status_line(&self) -> String {
        let mut line = format!(
            "samples={} truncated={} lost={} dropped={} ignored={} cache: hits={} misses={} \
             evictions={} entries={} bytes={}",
            self.captured,
            self.truncated,
            self.lost,
            self.dropped,
            self.ignored,
            self.cache.hits,
            self.cache.misses,
            self.cache.evictions,
            self.cache.entries,
            self.cache.bytes
        );
        if let Some(w) = &self.kernel_walk {
            line.push_str(&format!(
                " kernel_walk: walks={} unwound={} fell_back={} no_walk={} in_copy={} lost_chunks={} \
                 rows={} binaries_refused={}",
                w.walks,
                w.unwound,
                w.fell_back,
                w.no_walk,
                w.in_copy,
                w.lost_chunks,
                w.rows_used,
                w.binaries_refused
            ));
        }
        for e in &self.exporters {
            line.push_str(&format!(
                " {}: exported={} failed={} latency_ms={:.1}",
                e.name,
                e.exported,
                e.failed,
                e.last_latency_us as f64 / 1000.0
            ));
            if e.attempts > 0 {
                line.push_str(&format!(" requests={} retries={}", e.attempts, e.retries));
            }
        }
        line
    }
}
