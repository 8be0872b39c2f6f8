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
//! mappings and threads ([`process`]: `/proc` plus MMAP2/COMM/FORK/EXIT records, binaries loaded
//! with `rootline-image` and counted in the recording's module budget), unwinds every sample to
//! its thread root ([`unwind`]: the pure `rootline-unwind` walk, which ends a stack at its root or
//! with an explicit reason, never silently), continues past the copied stack from the live
//! process's memory only above a stack slot a hardware write watchpoint has guarded since before
//! the sample ([`live`], cross-checked against the kernel's frame-pointer callchain), and
//! symbolizes each distinct address once, on a builder thread ([`symbolize`]: ELF symbols, DWARF
//! inlined frames and lines, demangling, kallsyms). JIT code (.NET, Mono, Node, the JVM) is named
//! and unwound through the runtimes' perf maps, jitdump files and ReadyToRun images ([`jit`]). The
//! target is never stopped.

pub mod cache_dir;
pub mod import;
pub mod jit;
pub mod kernel_walk;
pub mod live;
pub mod perf_event;
pub mod process;
pub mod recorder;
pub mod symbolize;
pub mod unwind;
