//! The capture side of the agent: where samples come from.
//!
//! A [`SampleSource`] hands the agent already-unwound, already-symbolized samples; the agent never
//! looks at registers or raw stack memory. The real source wraps `rootline-capture`; tests use
//! [`crate::SyntheticSource`], which is deterministic.

use std::time::Duration;

use rootline_profile::StackId;

use crate::stacks::StackTable;

/// A sample as a source delivers it: its stack by id in a shared [`StackTable`], never copied.
#[derive(Debug, Clone, Copy)]
pub struct RawSample<'a> {
    /// Process id (host PID namespace).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Time of the sample, nanoseconds since the Unix epoch.
    pub time_ns: u64,
    /// CPU time this sample stands for, nanoseconds (the sampling period); for an off-CPU
    /// sample, the time its thread stayed off the CPU.
    pub weight_ns: u64,
    /// Bytes allocated, for an allocation sample (a .NET GC allocation tick, whose stack ends in
    /// `[alloc: TYPE]`); 0 for a CPU sample.
    pub alloc_bytes: u64,
    /// An off-CPU sample: taken as the thread left the CPU, weighed by the time it was off.
    pub off_cpu: bool,
    /// The stack: the node of its leaf frame in `stacks`.
    pub stack: StackId,
    /// The interned stacks `stack` belongs to (the source's, shared with the agent).
    pub stacks: &'a StackTable,
    /// The process's name as the source knew it (its `exec`, or `/proc` when first sampled):
    /// a process that lived a few milliseconds is gone from `/proc` before the agent looks.
    pub process_name: Option<&'a str>,
}

/// What a source reports about one poll, besides the samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollStats {
    /// Samples the kernel (or the source) lost before the agent saw them (e.g. `PERF_RECORD_LOST`).
    pub lost: u64,
    /// The in-kernel stack walk's counts so far (None: the source has none, or the walk is off).
    pub kernel_walk: Option<KernelWalkCounts>,
}

/// How the sampler's in-kernel stack walk went since the agent started (totals).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelWalkCounts {
    /// Walks the BPF program made.
    pub walks: u64,
    /// Samples unwound with their walk's words.
    pub unwound: u64,
    /// Samples whose unwind needed more than their walk read, unwound again the usual way.
    pub fell_back: u64,
    /// Samples of tracked processes that found no walk.
    pub no_walk: u64,
    /// Samples not walked: their copy reached their thread's outermost frame.
    pub in_copy: u64,
    /// Walk chunks lost because the ring buffer was full.
    pub lost_chunks: u64,
    /// Rows in the shared table (16 bytes each, counted in `modules.byte_budget`).
    pub rows_used: u64,
    /// Binaries whose rows did not fit `modules.byte_budget` (their frames are unwound the usual
    /// way).
    pub binaries_refused: u64,
}

/// A failure of the capture side.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The source cannot go on (perf events closed, the sampler thread ended, …).
    #[error("sample source failed: {0}")]
    Failed(String),
    /// The kernel refused perf events; the message names the setting or capability to change.
    #[error("{0}")]
    Permission(String),
}

/// The capture side of the pipeline.
///
/// The agent's capture thread calls [`SampleSource::poll`] in a loop; each call waits at most
/// `timeout` for data and passes every sample to `sink`. A sample names its stack in a
/// [`StackTable`] the source interns into (and may replace by a new one, e.g. when its tables
/// start over); the agent keeps a handle to each table it still refers to, so rows once appended
/// must not change. Targets are the source's business: it is told which processes to follow
/// through [`SampleSource::set_targets`] whenever the set changes (processes appear and disappear).
pub trait SampleSource: Send {
    /// Waits up to `timeout` for samples and passes each one to `sink`.
    fn poll(
        &mut self,
        timeout: Duration,
        sink: &mut dyn FnMut(&RawSample<'_>),
    ) -> Result<PollStats, SourceError>;

    /// Called once when the agent stops: stop sampling and pass every sample still in flight to
    /// `sink`, so the final export has them.
    fn finish(&mut self, _sink: &mut dyn FnMut(&RawSample<'_>)) -> Result<PollStats, SourceError> {
        Ok(PollStats::default())
    }

    /// The processes to sample now (`None`: every process on the host).
    fn set_targets(&mut self, _pids: Option<&[u32]>) -> Result<(), SourceError> {
        Ok(())
    }

    /// Where the source counts the binaries, images and JIT tables it loads (None: it loads
    /// none).
    fn modules(&self) -> Option<rootline_image::ModuleBudget> {
        None
    }
}
