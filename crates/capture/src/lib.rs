//! Linux sampling for rootline: `perf_event_open` sampling, process and mapping tracking,
//! unwinding and symbolization, feeding a [`rootline_profile::Profile`].

pub mod jit;
pub mod perf_event;
pub mod process;
pub mod recorder;
pub mod symbolize;
pub mod unwind;
