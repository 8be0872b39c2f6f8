//! Facts about a whole profile: where it came from and what was lost.

use std::collections::BTreeMap;

/// Facts about a whole profile: its producer, time span, sampling setup and loss accounting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    /// The tool that produced the data, e.g. `rootline record`, `dotnet-trace`, `speedscope file`.
    pub producer: String,
    /// Start of the profile, nanoseconds (monotonic clock of the producer, or Unix time when known).
    pub start_time_ns: u64,
    /// End of the profile, nanoseconds, same clock as `start_time_ns`.
    pub end_time_ns: u64,
    /// Host name where the data was captured, if known.
    pub host: Option<String>,
    /// Command line of the profiled program, if known.
    pub command_line: Option<String>,
    /// Sampling frequency in Hz, if the producer sampled at a fixed rate.
    pub sample_rate_hz: Option<u32>,
    /// The producer's stack depth cap (EventPipe 100, perf 127), if it has one.
    pub depth_cap: Option<u32>,
    /// Samples the kernel or producer lost (e.g. `PERF_RECORD_LOST`).
    pub lost_samples: u64,
    /// Samples deliberately dropped (escape hatch when export stalls).
    pub dropped_samples: u64,
    /// Samples whose stack ends in an explicit `[truncated: …]` frame.
    pub truncated_samples: u64,
    /// Free-form key/value facts (format-specific tags, per-reason truncation counts, …).
    pub extra: BTreeMap<String, String>,
}
