//! The messages of pprof's `profile.proto` (package `perftools.profiles`), written out by hand.
//!
//! Field numbers and types follow the upstream schema exactly; every id and string index is kept as
//! the wire gives it, so the reader can check it before use.

/// `perftools.profiles.Profile`: the whole file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    /// What each sample value measures.
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    /// The samples.
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    /// Address-space mappings; ids are 1-based.
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    /// Program locations; ids are 1-based.
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    /// Functions; ids are 1-based.
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// All strings; entry 0 is always "".
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    /// Regex (string index) of frames to drop.
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    /// Regex (string index) of frames to keep.
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    /// Collection time, nanoseconds since the Unix epoch.
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    /// Collection duration in nanoseconds.
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    /// What the period measures.
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    /// Events between sampled occurrences.
    #[prost(int64, tag = "12")]
    pub period: i64,
    /// Free-form comments (string indexes).
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    /// Index of the sample type shown by default (string index of its type).
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
    /// Documentation link (string index).
    #[prost(int64, tag = "15")]
    pub doc_url: i64,
}

/// `ValueType`: a type and a unit, both string indexes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct ValueType {
    /// e.g. `cpu`.
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// e.g. `nanoseconds`.
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// `Sample`: a stack (leaf first) with values and labels.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// Location ids, leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    /// One value per sample type.
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    /// Labels (thread, pid, …).
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// `Label`: a key with a string or a numeric value.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct Label {
    /// Key (string index).
    #[prost(int64, tag = "1")]
    pub key: i64,
    /// String value (string index), or 0.
    #[prost(int64, tag = "2")]
    pub str: i64,
    /// Numeric value.
    #[prost(int64, tag = "3")]
    pub num: i64,
    /// Unit of `num` (string index).
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// `Mapping`: a loaded binary.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct Mapping {
    /// 1-based id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// First address.
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    /// One past the last address.
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    /// File offset of `memory_start`.
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    /// File name (string index).
    #[prost(int64, tag = "5")]
    pub filename: i64,
    /// Build id (string index).
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    /// Symbolization flags.
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    /// Symbolization flags.
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    /// Symbolization flags.
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    /// Symbolization flags.
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// `Location`: one address, with one `Line` per inlined function (innermost first).
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct Location {
    /// 1-based id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Mapping id, or 0.
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    /// Instruction address.
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// Lines, innermost inlined function first, the physical caller last.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    /// The location is a fold of several frames.
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

/// `Line`: a function and a line number.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct Line {
    /// Function id.
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    /// Line number, 0 when unknown.
    #[prost(int64, tag = "2")]
    pub line: i64,
    /// Column number, 0 when unknown.
    #[prost(int64, tag = "3")]
    pub column: i64,
}

/// `Function`: names and a source file, all string indexes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct Function {
    /// 1-based id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Display name (string index).
    #[prost(int64, tag = "2")]
    pub name: i64,
    /// Mangled name (string index).
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    /// Source file (string index).
    #[prost(int64, tag = "4")]
    pub filename: i64,
    /// First line of the function.
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}
