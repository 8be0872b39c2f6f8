//! Linux sampling for rootline: whole, true stacks from live processes.
//!
//! What the caller does: pick a [`recorder::Target`] (running PIDs, every CPU, or a command to
//! launch), set [`recorder::RecordOptions`] (frequency, duration, stack bytes per sample, kernel
//! frames), optionally give a [`recorder::ChunkSink`] (the `.rlp` writer) and a stop flag, and
//! call [`recorder::record`]. It returns the [`rootline_profile::Profile`] and counts (samples,
//! threads, lost, truncated by reason).
//!
//! What this crate does: opens `perf_event_open` events ([`perf_event`]: `cpu-clock` when there is
//! no hardware PMU; per thread and CPU with inherit for PIDs, per CPU for the whole system,
//! enable-on-exec for launched commands), drains their ring buffers on a reader thread, tracks
//! mappings and threads ([`process`]: `/proc` plus MMAP2/COMM/FORK/EXIT records), unwinds every
//! sample to its thread root ([`unwind`]: framehop over `.eh_frame` and `.debug_frame`,
//! instruction analysis and frame pointers for code without CFI, every step validated, and an
//! explicit `[truncated: reason]` frame — decided in [`unwind::policy`] — where a stack cannot be
//! read further; past the copied stack it continues from the live process's memory, but only
//! above a stack slot a hardware write watchpoint has guarded since before the sample, and
//! cross-checks those frames against the kernel's frame-pointer callchain), and symbolizes each
//! distinct address once, on a builder thread
//! ([`symbolize`]: ELF symbols, DWARF inlined frames and lines, demangling, kallsyms). JIT code
//! (.NET, Mono, Node, the JVM) is named and unwound through the runtimes' perf maps and jitdump
//! files ([`jit`]). The target is never stopped.

pub mod import;
pub mod jit;
pub mod perf_event;
pub mod process;
pub mod recorder;
pub mod symbolize;
pub mod unwind;
