//! Linux sampling for rootline: `perf_event_open` sampling, process and mapping tracking,
//! unwinding and symbolization, feeding a [`rootline_profile::Profile`]. JIT code (.NET, Mono,
//! Node, the JVM) is named and unwound through the runtimes' perf maps and jitdump files
//! ([`jit`]).

pub mod jit;
pub mod perf_event;
pub mod process;
pub mod recorder;
pub mod symbolize;
pub mod unwind;
