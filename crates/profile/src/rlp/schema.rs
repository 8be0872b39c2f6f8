//! The protobuf messages of one `.rlp` chunk, written by hand with `prost` derives.
//!
//! `docs/rlp-format.md` lists the same schema as a `.proto` file; keep the two in step. Field numbers
//! are part of the file format and never change meaning; new fields take new numbers.

use std::collections::BTreeMap;

/// One chunk: the rows added to each table since the previous chunk, plus its samples.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Chunk {
    /// Sample value types; only in the first chunk of a file.
    #[prost(message, repeated, tag = "1")]
    pub sample_types: Vec<SampleType>,
    /// Profile metadata; when present it replaces all earlier metadata (last one wins).
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<Metadata>,
    /// Id of the first string in `strings` (= strings already in the file).
    #[prost(uint32, tag = "3")]
    pub first_string: u32,
    /// New strings, in id order.
    #[prost(string, repeated, tag = "4")]
    pub strings: Vec<String>,
    /// Id of the first mapping in `mappings`.
    #[prost(uint32, tag = "5")]
    pub first_mapping: u32,
    /// New mappings, in id order.
    #[prost(message, repeated, tag = "6")]
    pub mappings: Vec<Mapping>,
    /// Id of the first function in `functions`.
    #[prost(uint32, tag = "7")]
    pub first_function: u32,
    /// New functions, in id order.
    #[prost(message, repeated, tag = "8")]
    pub functions: Vec<Function>,
    /// Id of the first frame in `frames`.
    #[prost(uint32, tag = "9")]
    pub first_frame: u32,
    /// New frames, in id order.
    #[prost(message, repeated, tag = "10")]
    pub frames: Vec<Frame>,
    /// Id of the first stack node in `stack_parents` / `stack_frames`.
    #[prost(uint32, tag = "11")]
    pub first_stack: u32,
    /// For each new stack node `id`: 0 for a root node, else `id - parent` (always ≥ 1).
    #[prost(uint32, repeated, tag = "12")]
    pub stack_parents: Vec<u32>,
    /// For each new stack node: its frame id. Same length as `stack_parents`.
    #[prost(uint32, repeated, tag = "13")]
    pub stack_frames: Vec<u32>,
    /// Threads that are new or changed since they were last written, in id order.
    #[prost(message, repeated, tag = "14")]
    pub threads: Vec<Thread>,
    /// Processes that are new or changed since they were last written, in first-seen order.
    #[prost(message, repeated, tag = "15")]
    pub processes: Vec<Process>,
    /// The samples pushed since the previous chunk.
    #[prost(message, optional, tag = "16")]
    pub samples: Option<Samples>,
}

/// A sample value type.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SampleType {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub unit: String,
}

/// Profile metadata; strings inline (it is small and written rarely).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Metadata {
    #[prost(string, tag = "1")]
    pub producer: String,
    #[prost(uint64, tag = "2")]
    pub start_time_ns: u64,
    #[prost(uint64, tag = "3")]
    pub end_time_ns: u64,
    #[prost(string, optional, tag = "4")]
    pub host: Option<String>,
    #[prost(string, optional, tag = "5")]
    pub command_line: Option<String>,
    #[prost(uint32, optional, tag = "6")]
    pub sample_rate_hz: Option<u32>,
    #[prost(uint32, optional, tag = "7")]
    pub depth_cap: Option<u32>,
    #[prost(uint64, tag = "8")]
    pub lost_samples: u64,
    #[prost(uint64, tag = "9")]
    pub dropped_samples: u64,
    #[prost(uint64, tag = "10")]
    pub truncated_samples: u64,
    #[prost(btree_map = "string, string", tag = "11")]
    pub extra: BTreeMap<String, String>,
}

/// A mapping row; string fields are string ids.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Mapping {
    #[prost(uint64, tag = "1")]
    pub start: u64,
    #[prost(uint64, tag = "2")]
    pub end: u64,
    #[prost(uint64, tag = "3")]
    pub file_offset: u64,
    #[prost(uint32, tag = "4")]
    pub path: u32,
    #[prost(uint32, optional, tag = "5")]
    pub build_id: Option<u32>,
}

/// A function row.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Function {
    #[prost(uint32, tag = "1")]
    pub name: u32,
    #[prost(uint32, optional, tag = "2")]
    pub file: Option<u32>,
    /// The runtime's own name (string id); since version 2.
    #[prost(uint32, optional, tag = "3")]
    pub system_name: Option<u32>,
    /// The code tier (string id); since version 2.
    #[prost(uint32, optional, tag = "4")]
    pub tier: Option<u32>,
}

/// A frame row.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Frame {
    #[prost(uint32, tag = "1")]
    pub function: u32,
    #[prost(uint32, optional, tag = "2")]
    pub mapping: Option<u32>,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(uint32, optional, tag = "4")]
    pub line: Option<u32>,
    /// 0..=255.
    #[prost(uint32, tag = "5")]
    pub inline_depth: u32,
    /// `FrameKind` discriminant, 0..=5.
    #[prost(uint32, tag = "6")]
    pub kind: u32,
    /// The frame was read from live process memory (absent in older files: false).
    #[prost(bool, tag = "7")]
    pub from_live_memory: bool,
}

/// A thread row with its explicit id (threads may be re-sent when renamed).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Thread {
    #[prost(uint32, tag = "1")]
    pub id: u32,
    #[prost(uint32, tag = "2")]
    pub pid: u32,
    #[prost(uint32, tag = "3")]
    pub tid: u32,
    #[prost(uint32, optional, tag = "4")]
    pub name: Option<u32>,
}

/// A process row, keyed by pid (may be re-sent when renamed).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Process {
    #[prost(uint32, tag = "1")]
    pub pid: u32,
    #[prost(uint32, optional, tag = "2")]
    pub name: Option<u32>,
    #[prost(uint32, optional, tag = "3")]
    pub command_line: Option<u32>,
}

/// Columnar samples. All columns have the same length.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Samples {
    /// Each time minus the previous sample's time (wrapping, as i64); the first is relative to 0.
    #[prost(sint64, repeated, tag = "1")]
    pub time_deltas: Vec<i64>,
    /// Thread id of each sample.
    #[prost(uint32, repeated, tag = "2")]
    pub threads: Vec<u32>,
    /// Leaf stack node id of each sample.
    #[prost(uint32, repeated, tag = "3")]
    pub stacks: Vec<u32>,
    /// One column per sample type.
    #[prost(message, repeated, tag = "4")]
    pub values: Vec<ValueColumn>,
}

/// One sample value column, delta-encoded like the times.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ValueColumn {
    /// Each value minus the previous value in the column (wrapping); the first is relative to 0.
    #[prost(sint64, repeated, tag = "1")]
    pub deltas: Vec<i64>,
}
