//! .NET support for rootline: read EventPipe `.nettrace` traces and collect them from live processes.
//!
//! What the caller does: hand [`read_profile`] a `.nettrace` byte stream (a file, or what a
//! collection saved) and get a [`rootline_profile::Profile`] back; or drive the lower layer
//! itself: [`NetTraceReader`] streams events one at a time with metadata and stacks already
//! resolved. To trace a live process, [`collect::collect`] finds its diagnostics socket
//! ([`discover`]), starts an EventPipe session ([`ipc`]), streams the trace into a writer and stops
//! the session cleanly at a deadline or on request. Before sampling a .NET process with perf
//! events, [`perfmap::PerfMapGuard`] switches its perf map on (.NET 8+) and off again afterwards.
//!
//! What this crate does: parse the format (V4/V5 FastSerialization objects, V6 blocks, compressed
//! event headers, per-region stack interning, sequence points) with a positioned error for any
//! truncated or corrupt input; turn thread samples and GC allocation ticks into samples named
//! `Module!Namespace.Method(params)` through the JIT and rundown method events; and record
//! EventPipe's 100-frame depth cap in the profile metadata, so that repair can find cut stacks.
//! The parser has no platform code; the IPC client is Unix-only.

#![forbid(unsafe_code)]

#[cfg(unix)]
pub mod alloc_ticks;
#[cfg(unix)]
pub mod collect;
pub mod convert;
#[cfg(unix)]
pub mod discover;
mod error;
pub mod events;
pub mod image;
#[cfg(unix)]
pub mod ipc;
pub mod names;
pub mod nettrace;
#[cfg(unix)]
pub mod perfmap;

pub use convert::{ConvertStats, EVENTPIPE_DEPTH_CAP, read_profile, read_profile_with_stats};
pub use error::{ErrorKind, NetTraceError};
pub use nettrace::{Event, EventMetadata, NetTraceReader, TraceInfo};
