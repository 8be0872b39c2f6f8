//! Chromium trace-event JSON (`.json`, `.chromium.json`), as written by dotnet-trace and read by
//! Perfetto, `chrome://tracing` and speedscope.
//!
//! **Reading** accepts both top levels (a bare event array, which may be cut short, and an object
//! with `traceEvents`) and these dialects:
//! - dotnet-trace's `convert --format chromium`: `B`/`E` events with `"cat": "sampleEvent"` and an
//!   `sf` id into a `stackFrames` dictionary (`{"name", "category", "parent"}`), where the category
//!   holds the module of a `Module!Method` name. TraceEvent writes its *relative milliseconds* into
//!   `ts` (not microseconds as the format says), so when a file's first slice event has this shape
//!   its `ts` values are read as milliseconds, the producer is `dotnet-trace (chromium)`, and the
//!   EventPipe depth cap of 100 frames is recorded in the metadata for stack repair.
//! - `B`/`E` and `X` (complete) slices of any producer, `ts`/`dur` in microseconds.
//! - the `samples` + `stackFrames` dialect: point samples whose stack is the `sf` entry's parent
//!   chain; each counts its `weight` in a `samples` column and, as in speedscope, lasts until the
//!   next sample on its thread in the `wall` column (the last one on a thread weighs 0 ns).
//!
//! Slices rebuild samples per thread: every `B`, `E` or `X` boundary is a stack transition, and the
//! stack of open slices after it lasts until that thread's next event — one sample whose weight is
//! that duration in wall-clock nanoseconds. The number of transitions, slices left open at the end
//! (closed at the trace's last timestamp and listed per thread), unmatched ends and out-of-order
//! events are recorded in [`rootline_profile::Metadata::extra`] under `chromium.*`. `M` metadata
//! events name processes and threads; other phases and unknown fields are skipped.
//!
//! The reader streams: it scans the text in 1 MiB blocks with a small JSON scanner and never holds
//! the text or an event object, so memory grows with distinct frames and stacks, the samples it
//! produces, and a bounded reorder window per thread. Errors name a byte offset.
//!
//! **Writing** produces what dotnet-trace writes — per thread, `B`/`E` events derived from the
//! samples (each sample lasts until the next sample on its thread), frames interned in
//! `stackFrames` with `name`/`category`/`parent` — plus `M` events naming processes and threads so
//! Perfetto shows named tracks. Unlike dotnet-trace, `ts` is in microseconds as the format
//! specifies, `stackFrames` has one entry per distinct stack node (so an `sf`'s parent chain is the
//! exact stack), and names are JSON-escaped; `otherData` says so (`"tsUnit": "us"`) and carries the
//! profile's depth cap. A sample sharing its timestamp with the next one on its thread has no length
//! and leaves no slice; samples without distinct times (e.g. from collapsed stacks) are laid end to
//! end, each lasting its time value (or 1 ms when the profile has no time column). A `B` event of a
//! function with a code tier or a runtime's own name carries them as `args`
//! (`{"tier": "OptimizedTier1", "system_name": "int32 [Calls] Calls::Spin(int32)[OptimizedTier1]"}`),
//! which trace viewers show beside the slice. An allocation sample (a value in `alloc-bytes`, no
//! time) is no slice but a thread-scoped instant event (`"ph": "i", "s": "t"`, category
//! `allocation`) named by its `[alloc: TYPE]` leaf, with its stack in `sf` and
//! `"args": {"allocated_type": TYPE, "bytes": N}`; the reader skips them.
//!
//! Limits: strings are at most 1 MiB, nesting at most 128 levels, and the JSON must be valid (a
//! dotnet-trace export whose names hold unescaped `"` or `\`, which TraceEvent does not escape, is
//! reported as an error at the offending byte).

mod decimal;
mod reader;
mod scan;
mod timeline;
mod writer;

use std::io::BufRead;

use rootline_profile::Profile;

use crate::error::FormatError;

pub(crate) use writer::time_column;
pub use writer::write;

/// The depth cap of EventPipe stacks, recorded for files that look like dotnet-trace output.
pub const DOTNET_DEPTH_CAP: u32 = 100;

/// Reads a Chromium trace-event JSON file. See the module documentation for the dialects.
pub fn read(reader: impl BufRead) -> Result<Profile, FormatError> {
    let mut scanner = scan::Scanner::new(reader);
    let mut state = reader::TraceReader::default();
    state.read_document(&mut scanner)?;
    state.finish()
}
