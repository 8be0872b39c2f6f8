//! rootline's continuous profiler: sample a host (or some of its processes) for weeks without
//! hurting it, and ship the profiles to an OpenTelemetry Collector, a pprof directory or `.rlp` files.
//!
//! What the caller does: load an [`AgentConfig`] (TOML), pick a [`SampleSource`] (the capture side:
//! `rootline-capture` in production, [`SyntheticSource`] in tests), build the exporters (see
//! [`build_exporters`]) and call [`Agent::start`]; later [`Agent::stop`] (e.g. on SIGTERM) flushes
//! both buffers through a final export. What this crate does:
//!
//! - a capture thread that filters samples to the targets ([`Targets`]: host, PIDs, name/command-line
//!   regex, cgroup), keys each stack (by its id in the source's shared [`StackTable`]) in a bounded, ETW-style
//!   [`StackCache`] and writes keyed
//!   records into the active one of two [`SampleBuffer`]s;
//! - an exporter thread that, every `export_interval`, swaps buffers, resolves keys into one
//!   [`rootline_profile::Profile`] per process and runs every [`Exporter`] on them;
//! - the escape hatch: when both buffers are full, new samples are dropped and counted exactly, and
//!   one log line per period says how many and why;
//! - [`Stats`] with exact accounting (`captured = dropped + exported + failed` per exporter) and a
//!   status line per period.
//!
//! Memory is capped: the cache and the buffers have byte budgets, the exporter's mirror of the cache
//! is bounded by them, the binaries being profiled are held to `modules.byte_budget` (their unwind
//! and symbol tables, .NET images' method tables, JIT symbols; a binary past it is not loaded and
//! its frames end stacks explicitly),
//! and [`AgentConfig::validate`] refuses budgets whose sum with the sampler's working set exceeds
//! `memory_limit`.

mod batch;
mod buffer;
mod cache;
pub mod capture_source;
mod capture_thread;
pub mod config;
mod dotnet_ticks;
pub mod export;
mod handoff;
pub mod logging;
mod pipeline;
mod process;
mod source;
mod stacks;
mod stats;
mod synthetic;
mod targets;

pub use batch::{ExportBatch, ProcessProfile};
pub use buffer::{Record, SampleBuffer, SampleRecord};
pub use cache::{CacheLimits, CacheStats, StackCache, StackKey};
pub use capture_source::default_source;
pub use config::{AgentConfig, ConfigError};
pub use export::{ExportError, ExportOutcome, Exporter, RequestCounts, build_exporters};
pub use pipeline::{Agent, AgentError};
pub use process::ProcessInfo;
pub use source::{KernelWalkCounts, PollStats, RawSample, SampleSource, SourceError};
pub use stacks::{CodeDetail, FrameDesc, StackRef, StackTable, StackView};
pub use stats::{ExporterStats, Stats};
pub use synthetic::{SyntheticConfig, SyntheticCounters, SyntheticSource};
pub use targets::{TargetConfig, TargetError, Targets};

/// Nanoseconds since the Unix epoch, now.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// This host's name, from `/proc/sys/kernel/hostname`.
pub fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}
