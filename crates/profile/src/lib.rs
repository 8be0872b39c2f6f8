//! The data model every rootline tool shares, and its native `.rlp` file.
//!
//! A [`Profile`] is a set of append-only interned tables — strings, mappings, functions, frames and a
//! stack trie — plus columnar samples (time, thread, stack and one value per [`SampleType`]). Every
//! table is indexed by a dense `u32` id ([`StringId`], [`FrameId`], [`StackId`], …), and every table
//! interns by the *full* key of its rows through a hash map, so two rows are the same only when all of
//! their fields are equal — identity never rests on a hash alone.
//!
//! The stack trie stores each distinct call stack once: a [`StackId`] names a node `(parent, frame)`,
//! where the parent is the caller's node and the root node has no parent. A sample refers to the node
//! of its leaf frame, so a sample costs a few bytes however deep its stack is.
//!
//! What the caller does: feed the tables through the `intern_*` methods and [`Profile::push_sample`]
//! (amortised O(1), no allocation per sample once a stack is known). What this crate does: keep the
//! tables consistent, answer queries (frames of a stack, names), and read/write the chunked `.rlp`
//! file. It has no I/O policy and no platform code.
//!
//! The `.rlp` file is written while recording: [`RlpWriter::write_chunk`] appends what is new in the
//! profile since the previous call as one self-checking chunk, and [`Profile::take_samples`] then
//! keeps memory bounded. [`read_rlp`] (or [`RlpReader`], chunk by chunk) gives back every complete
//! chunk and reports a torn or corrupt tail as an [`RlpTailError`] value rather than failing. The
//! byte layout is in `docs/rlp-format.md`.

#![forbid(unsafe_code)]

mod ids;
mod metadata;
mod model;
mod profile;
pub mod pseudo;
pub mod rlp;
mod truncation;

pub use ids::{FrameId, FunctionId, MappingId, StackId, StringId, ThreadId};
pub use metadata::Metadata;
pub use model::{Frame, FrameKind, Function, Mapping, Process, SampleType, StackNode, Thread};
pub use profile::{Profile, ProfileError, Samples, StackFrames};
pub use rlp::{
    CHUNK_HEADER_LEN, ChunkInfo, MAX_CHUNK_LEN, MAX_DECOMPRESSED_LEN, RLP_HEADER_LEN, RLP_MAGIC,
    RLP_OLDEST_VERSION, RLP_VERSION, RlpError, RlpRead, RlpReader, RlpTailError, RlpWriter,
    TailReason, read_rlp, write_rlp,
};
pub use truncation::TruncateReason;
