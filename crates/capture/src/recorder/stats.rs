//! The counts a recording keeps while it runs, handed to the caller with the profile.

use std::collections::HashMap;

use crate::unwind::TruncateReason;

use super::outer_cache::OuterCacheStats;

/// Counts kept while recording.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Samples taken.
    pub samples: u64,
    /// Samples the kernel dropped (`PERF_RECORD_LOST`).
    pub lost: u64,
    /// Samples whose stack ends in a `[truncated: …]` frame, by reason.
    pub truncated: HashMap<TruncateReason, u64>,
    /// Distinct threads seen.
    pub threads: u64,
    /// Reads of live process memory past the copied stacks.
    pub live: crate::live::live_memory::LiveStats,
    /// Samples unwound with every register tracked (CFI that needs more than rip/rsp/rbp).
    pub full_register_unwinds: u64,
    /// Cross-checks of live frames against the kernel's frame-pointer callchain.
    pub callchain: CallchainStats,
    /// Reuse of the outer part of deep stacks.
    pub outer_cache: OuterCacheStats,
    /// Times a sample was set aside to wait for a binary's parse (a sample may count more than
    /// once if it needed several).
    pub deferred: u64,
    /// Distinct JIT frames left without a name, by why.
    pub jit_unnamed: std::collections::BTreeMap<String, u64>,
    /// Off-CPU intervals (with `--off-cpu`).
    pub off_cpu: super::off_cpu::OffCpuStats,
    /// Allocation samples (with `--alloc`).
    pub alloc: super::alloc::AllocStats,
    /// Why runtimes were not asked for their JIT maps (a JVM with attach off), one line each.
    pub jit_notes: Vec<String>,
    /// The in-kernel stack walk, when it runs.
    pub kernel_walk: Option<KernelWalkUse>,
}

/// How samples used the in-kernel stack walk ([`crate::kernel_walk`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelWalkUse {
    /// The walk's own counts.
    pub walk: crate::kernel_walk::KernelWalkStats,
    /// Samples unwound with their walk's words (whatever the end).
    pub unwound: u64,
    /// Samples whose unwind needed a word the walk had not read, and were unwound again the
    /// usual way (copy, then live reads with a proof).
    pub fell_back: u64,
    /// Samples of tracked processes that found no walk (the program had not yet seen their
    /// process's mappings, or the walk was lost).
    pub no_walk: u64,
    /// Samples the program did not walk because their copy reached their thread's outermost
    /// frame: unwound from the copy alone.
    pub in_copy: u64,
    /// Samples set aside whose walk's stack dump was dropped because the dumps kept already
    /// held their limit ([`crate::recorder::RecordOptions::kernel_walk_kept_dumps`]).
    pub dumps_dropped: u64,
    /// Samples whose outer frames were those of their thread's last whole sample, its walk
    /// having read the same words there (see `recorder::walk_memo`).
    pub outer_reused: u64,
    /// Frames those samples reused.
    pub frames_reused: u64,
}

/// Counts of the kernel callchain cross-check (see [`crate::live::callchain`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallchainStats {
    /// The most entries a callchain may hold (`sample_max_stack`); 0 when not requested.
    pub max_entries: u16,
    /// Samples with frames from live memory that were cross-checked.
    pub checked: u64,
    /// Live-memory frames confirmed by the kernel's return address at the same stack slot.
    pub confirmed_frames: u64,
    /// Samples cut as `stack-changed` because a live frame disagreed with the kernel's.
    pub mismatches: u64,
    /// Samples whose callchain was cut at `max_entries` while the stack went deeper.
    pub capped: u64,
}

impl Stats {
    /// Total truncated samples.
    pub fn truncated_total(&self) -> u64 {
        self.truncated.values().sum()
    }
}
