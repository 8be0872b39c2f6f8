//! What a recording is asked for and what it gives back: the target, the options, the sink
//! that receives flushed chunks (and how long samples are retained), errors and the result.

use rootline_image::ModuleBudget;
use std::ffi::OsString;
use std::process::ExitStatus;
use std::time::Duration;

use rootline_profile::Profile;

use super::stats::Stats;
use crate::perf_event::{EventKind, OpenError};

/// What to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Running processes (all their threads, and threads they create later).
    Pids(Vec<u32>),
    /// Every process on every CPU.
    System,
    /// Launch this command (program and arguments) and record it from its `exec`.
    Command(Vec<OsString>),
}

/// How to record.
#[derive(Debug, Clone)]
pub struct RecordOptions {
    /// What to record.
    pub target: Target,
    /// Samples per second of CPU time (per thread).
    pub frequency_hz: u32,
    /// Stop after this long (None: until stopped or the target ends).
    pub duration: Option<Duration>,
    /// Bytes of user stack copied per sample.
    pub stack_bytes: u32,
    /// Record kernel frames too.
    pub kernel: bool,
    /// How often the profile is flushed to the sink.
    pub flush_interval: Duration,
    /// Bytes of live process memory that may be read per sample to continue a stack past its
    /// copy (0: never read live memory; the stack ends at the copy with an explicit truncation).
    /// Default [`DEFAULT_LIVE_STACK_BUDGET`].
    pub live_stack_budget: usize,
    /// Ask the kernel for its frame-pointer walk of the user stack with each sample (up to
    /// [`MAX_USER_CALLCHAIN`] entries, capped by `kernel.perf_event_max_stack`) and cross-check
    /// frames read from live memory against it (see [`crate::live::callchain`]).
    pub user_callchain: bool,
    /// Most memory the loaded binaries (ELF unwind tables and symbols, .NET ReadyToRun images'
    /// method tables, JIT runtimes' symbols) may hold (None: no limit). A binary that does not fit is not loaded; stacks
    /// end at its frames with `[truncated: module-memory-limit]` until there is room (see
    /// [`crate::process::Processes::set_module_budget`], [`crate::jit::ImageCache`]).
    pub module_budget: Option<usize>,
    /// Where the recording's binaries, .NET images and JIT tables are counted: the caller owns
    /// it (and may read its [`ModuleBudget::live_bytes`] while recording); each recording gets a
    /// fresh one by default.
    pub modules: ModuleBudget,
    /// Leave the recording process's own samples out, unread (for a host-wide profiler that
    /// should not spend time and memory unwinding itself).
    pub skip_own_process: bool,
    /// Most memory the symbolizer's parsed DWARF may take at once, estimated from each binary's
    /// debug sections (None: no limit). Binaries past it are named from their symbol tables,
    /// without inlined frames or source lines.
    pub dwarf_budget: Option<usize>,
    /// Keep the demangled names of binaries without DWARF in the cache directory between
    /// recordings (`symbol-names/`), so that a later recording of the same binaries reads and
    /// demangles only functions it has not met before. On by default.
    pub keep_symbol_names: bool,
    /// Measure the in-kernel walk's time in the sampled threads (see
    /// [`crate::kernel_walk::KernelWalkOptions::run_time_stats`]: it turns the kernel's BPF
    /// run-time statistics on for the host while recording). On by default.
    pub kernel_walk_run_time: bool,
    /// Ask HotSpot JVMs among the targets to write their perf maps, over their attach protocol
    /// (see [`crate::jit::hotspot`]): before sampling a JVM given by pid, and whenever code of a
    /// JVM has no name. On by default.
    pub ask_jvms: bool,
    /// Environment variables added to a launched command ([`Target::Command`]), e.g. the ones
    /// that make a runtime write its perf map from the start.
    pub launch_env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    /// Also record where threads wait: every time a thread of a command or `-p` target leaves
    /// the CPU its stack is taken and weighed by the nanoseconds until it runs again (value
    /// columns `off_cpu` and `wall` = cpu + off_cpu). Intervals shorter than the given
    /// nanoseconds are counted and summed per thread but not unwound. None: off.
    pub off_cpu_min_ns: Option<u64>,
    /// Value columns appended after the recorder's own, for samples the caller adds to the
    /// recording from another source (e.g. .NET allocation ticks): the recorder's samples carry 0
    /// there.
    pub extra_columns: Vec<rootline_profile::SampleType>,
    /// Set to the launched command's pid once it runs ([`Target::Command`]), for a caller that
    /// attaches to it by other means while recording.
    pub launched_pid: Option<std::sync::Arc<std::sync::atomic::AtomicU32>>,
    /// Adds samples from another source (e.g. .NET allocation ticks) to the profile before each
    /// flush, and once more when recording ends.
    pub injector: Option<std::sync::Arc<dyn SampleInjector>>,
    /// Whether the user stack is also walked in the kernel at each sample
    /// ([`crate::kernel_walk`]).
    pub kernel_walk: KernelWalkMode,
    /// Bytes of the in-kernel walk's ring buffer (a power of two; in this process's memory once
    /// read). A recording drained every few milliseconds (the agent) needs a few MiB.
    pub kernel_walk_ring_bytes: u32,
    /// Most bytes of stack dumps held by the walks of samples set aside until their binaries
    /// are read (see [`crate::kernel_walk::KernelWalkOptions::pending_dump_bytes`]); past it,
    /// further samples set aside keep their walks without the dumps, counted.
    pub kernel_walk_kept_dumps: usize,
    /// The size of the in-kernel walk's rules table, and what counts it.
    pub kernel_walk_table: KernelWalkTable,
    /// Also record where memory is allocated (malloc, calloc, realloc, the aligned variants and
    /// large anonymous mmaps), sampled by bytes at a mean of this many bytes between samples
    /// (value columns `alloc-bytes` and `alloc-count`, estimates of every allocation). A command
    /// or `-p` target only. None: off.
    pub alloc_rate: Option<u64>,
    /// With [`RecordOptions::alloc_rate`]: the smallest anonymous mapping a program makes with
    /// `mmap` that counts as an allocation, in bytes (file mappings never count).
    pub alloc_mmap_min: u64,
    /// Processes of a `-p` target whose allocations another source records (e.g. a .NET
    /// process's GC allocation ticks): with [`RecordOptions::alloc_rate`], their libc is not
    /// probed.
    pub alloc_skip_pids: Vec<u32>,
    /// With off-CPU recording: most switch-outs per second whose stacks the kernel copies, over
    /// all recorded threads (the copy is the cost; see `switch_cap`); the time of the others is
    /// kept, counted under `[off-cpu: over the rate cap, not unwound]`. 0: every switch.
    pub off_cpu_max_rate: u32,
}

/// Adds samples from another source to a recording's profile (into its
/// [`RecordOptions::extra_columns`]), on the thread that builds the profile.
pub trait SampleInjector: Send + Sync + std::fmt::Debug {
    /// Called before each flush: append what arrived since the last call.
    fn inject(&self, profile: &mut Profile);
    /// Called once after the last flush: end the other source and append what it still holds.
    fn finish(&self, profile: &mut Profile);
}

/// The in-kernel walk's rules table: rows of 16 bytes that the kernel allocates whole and this
/// process maps whole, so all of it is resident from the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KernelWalkTable {
    /// 4 Mi rows (64 MiB), no larger than [`RecordOptions::module_budget`]; placed rows are
    /// counted in [`RecordOptions::modules`].
    #[default]
    Default,
    /// This many rows (at least 64 Ki) where no [`RecordOptions::module_budget`] bounds the
    /// table, placed rows counted in [`RecordOptions::modules`].
    Rows(u32),
    /// This many rows, counted by the caller: binaries' rows are placed while they fit it, and
    /// not counted in [`RecordOptions::modules`]; a binary with more rows than half the table
    /// is refused, so that one waiting to be placed takes at most that.
    Counted(u32),
}

/// Whether to walk user stacks in the kernel at sample time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KernelWalkMode {
    /// Never: frames past each sample's copy come from live reads with a proof.
    Off,
    /// When the BPF program loads; otherwise say why once and record without it.
    #[default]
    Auto,
    /// Always: recording fails when the program cannot load.
    On,
}

/// Default [`RecordOptions::off_cpu_max_rate`]: switch-outs unwound per second.
pub const DEFAULT_OFF_CPU_MAX_RATE: u32 = 1000;

/// Most callchain entries requested per sample: 4 KiB, a quarter of the default stack copy.
pub const MAX_USER_CALLCHAIN: u16 = 512;

/// Default per-sample budget for live stack reads: room for a 10,000-deep recursion with 1 KiB
/// of locals per frame, and more than the default 8 MiB main-thread and thread stack sizes.
pub const DEFAULT_LIVE_STACK_BUDGET: usize = 32 * 1024 * 1024;

impl RecordOptions {
    /// Defaults: 999 Hz, 16 KiB of stack copied, up to [`DEFAULT_LIVE_STACK_BUDGET`] read live,
    /// user frames, flush every second.
    pub fn new(target: Target) -> RecordOptions {
        RecordOptions {
            target,
            frequency_hz: 999,
            duration: None,
            stack_bytes: 16 * 1024,
            kernel: false,
            flush_interval: Duration::from_secs(1),
            live_stack_budget: DEFAULT_LIVE_STACK_BUDGET,
            user_callchain: true,
            module_budget: None,
            modules: ModuleBudget::new(),
            skip_own_process: false,
            dwarf_budget: None,
            keep_symbol_names: true,
            kernel_walk_run_time: true,
            ask_jvms: true,
            launch_env: Vec::new(),
            off_cpu_min_ns: None,
            kernel_walk: KernelWalkMode::Auto,
            kernel_walk_ring_bytes: crate::kernel_walk::DEFAULT_RING_BYTES,
            kernel_walk_kept_dumps: super::KEPT_DUMP_BYTES,
            kernel_walk_table: KernelWalkTable::Default,
            extra_columns: Vec::new(),
            launched_pid: None,
            injector: None,
            alloc_rate: None,
            alloc_mmap_min: super::alloc::DEFAULT_ALLOC_MMAP_MIN,
            alloc_skip_pids: Vec::new(),
            off_cpu_max_rate: DEFAULT_OFF_CPU_MAX_RATE,
        }
    }
}

/// What a recording keeps of what it has handed to its [`ChunkSink`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Retention {
    /// Keep everything: the profile grows with every sample, and the finished [`Recording`] holds
    /// them all (`rootline record`).
    #[default]
    KeepAll,
    /// Hand each flush's samples over and drop them, for recordings that run for weeks (the
    /// agent): every [`ChunkSink::write_chunk`] sees only the samples taken since the previous
    /// call. Once the tables (distinct frames plus stack nodes) grow past `max_entries`, the
    /// recording starts over with an empty profile after that flush ([`ChunkSink::started_over`]);
    /// frames are then defined again as they recur. The finished [`Recording`] holds the last
    /// tables and no samples.
    HandOver {
        /// Distinct frames plus stack nodes kept before starting over.
        max_entries: usize,
    },
}

/// Where the profile goes while recording, e.g. an appendable `.rlp` writer.
pub trait ChunkSink: Send {
    /// Called after each flush with the profile so far; writes what is new since the last call.
    fn write_chunk(&mut self, profile: &Profile) -> std::io::Result<()>;

    /// What the recording keeps once a flush has been written (asked once, at the start).
    fn retention(&self) -> Retention {
        Retention::KeepAll
    }

    /// With [`Retention::HandOver`]: the next [`ChunkSink::write_chunk`] gets a new profile whose
    /// ids start again from zero; forget anything keyed by the old ids.
    fn started_over(&mut self) {}
}

/// Why recording failed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The kernel refused perf events (the message names the setting to change).
    #[error(transparent)]
    Permission(OpenError),
    /// A target process does not exist or exited before recording started.
    #[error("process {0} does not exist (or exited before recording started)")]
    TargetGone(u32),
    /// The command could not be started (no such program, not executable, …).
    #[error("cannot run {command}: {source}")]
    Launch {
        /// The program.
        command: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Any other failure while opening events.
    #[error(transparent)]
    Open(OpenError),
    /// Writing a chunk failed.
    #[error("writing the profile failed: {0}")]
    Sink(#[source] std::io::Error),
    /// The in-kernel stack walk was required and could not run.
    #[error("{0} (record without it: --kernel-walk off)")]
    KernelWalk(#[source] crate::kernel_walk::KernelWalkError),
    /// A thread of the recorder panicked: a defect in rootline, not in the target or the setup.
    #[error("the recorder's {0} thread panicked (a bug in rootline; its message is above)")]
    Panicked(&'static str),
}

impl RecordError {
    /// Process exit code for this error: 2 permission, 3 target gone, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            RecordError::Permission(_) => 2,
            RecordError::TargetGone(_) => 3,
            _ => 1,
        }
    }
}

/// A finished recording.
pub struct Recording {
    /// The profile.
    pub profile: Profile,
    /// Counts.
    pub stats: Stats,
    /// The event used.
    pub event: EventKind,
    /// The launched command's exit status (command mode).
    pub exit_status: Option<ExitStatus>,
}
