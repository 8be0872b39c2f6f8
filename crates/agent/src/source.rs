//! The capture side of the agent: where samples come from.
//!
//! A [`SampleSource`] hands the agent already-unwound, already-symbolized samples; the agent never
//! looks at registers or raw stack memory. The real source wraps `rootline-capture`; tests use
//! [`crate::SyntheticSource`], which is deterministic.

use std::sync::Arc;
use std::time::Duration;

use rootline_profile::FrameKind;

/// One frame of a captured stack, already symbolized.
///
/// Names and module paths are `Arc<str>` so a source can intern them once and hand out cheap
/// clones; equality still compares the text, so identity never rests on a pointer or a hash.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FrameDesc {
    /// Display name of the function (or `[truncated: reason]`, or `0x…` when unnamed).
    pub name: Arc<str>,
    /// Path of the module (binary, library, `[kernel.kallsyms]`, JIT region) holding the address.
    pub module: Option<Arc<str>>,
    /// Instruction address, 0 when the source only has a name.
    pub address: u64,
    /// 0 for a physical frame, n > 0 for the n-th inlined frame at the same address.
    pub inline_depth: u8,
    /// Where the code comes from.
    pub kind: FrameKind,
}

impl FrameDesc {
    /// Bytes this frame costs in the stack cache: the struct itself; strings are the source's.
    pub const COST: usize = std::mem::size_of::<FrameDesc>();

    /// A native frame with a name and an address, without a module.
    pub fn native(name: &str, address: u64) -> FrameDesc {
        FrameDesc {
            name: Arc::from(name),
            module: None,
            address,
            inline_depth: 0,
            kind: FrameKind::Native,
        }
    }
}

/// A sample as a source delivers it.
#[derive(Debug, Clone, Copy)]
pub struct RawSample<'a> {
    /// Process id (host PID namespace).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Time of the sample, nanoseconds since the Unix epoch.
    pub time_ns: u64,
    /// CPU time this sample stands for, nanoseconds (the sampling period).
    pub weight_ns: u64,
    /// The stack, root (outermost caller) first, leaf last.
    pub frames: &'a [FrameDesc],
}

/// What a source reports about one poll, besides the samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollStats {
    /// Samples the kernel (or the source) lost before the agent saw them (e.g. `PERF_RECORD_LOST`).
    pub lost: u64,
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
/// `timeout` for data and passes every sample to `sink`. The samples' frame slices only need to live
/// for the call. Targets are the source's business: it is told which processes to follow through
/// [`SampleSource::set_targets`] whenever the set changes (processes appear and disappear).
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

/// The production source for `config`: rootline-capture's sampler on every CPU.
pub fn default_source(config: &crate::AgentConfig) -> Result<Box<dyn SampleSource>, SourceError> {
    Ok(Box::new(crate::capture_source::CaptureSource::start(
        config,
    )?))
}
