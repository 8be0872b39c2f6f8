//! The native `.rlp` file: a header, then a stream of self-checking chunks.
//!
//! ```text
//! file   = magic(8) version(u32 LE) chunk*
//! chunk  = len(u32 LE) crc32(u32 LE) payload(len bytes)     crc32 (IEEE) covers the payload
//! payload = zstd(protobuf Chunk)
//! ```
//!
//! Each chunk carries only what is new since the previous one: the rows appended to the interned
//! tables, the threads and processes that are new or renamed, metadata when it changed, and the
//! samples pushed since. A recorder therefore calls [`RlpWriter::write_chunk`] every few seconds and a
//! killed recorder still leaves every chunk it wrote readable; [`read_rlp`] returns all complete chunks
//! merged into one [`crate::Profile`] and reports a torn or corrupt tail as a value ([`RlpTailError`])
//! instead of failing. `docs/rlp-format.md` describes the layout byte by byte.

mod apply;
mod reader;
mod schema;
mod writer;

#[cfg(test)]
mod tests;

pub use reader::{ChunkInfo, RlpRead, RlpReader, read_rlp};
pub use writer::{RlpWriter, write_rlp};

/// The 8 magic bytes at the start of every `.rlp` file (PNG-style: a high byte, the name, CR LF,
/// Ctrl-Z, LF, so text-mode mangling and truncated transfers are caught).
pub const RLP_MAGIC: [u8; 8] = *b"\x89RLP\r\n\x1a\n";

/// The file format version this crate writes. Version 2 added a function's system name and code
/// tier: a version-1 reader would take two functions that differ only there for a repeated row, so
/// the version changed; this crate reads every version from [`RLP_OLDEST_VERSION`] on.
pub const RLP_VERSION: u32 = 2;

/// The oldest file format version this crate reads (version-1 functions have no system name or
/// tier).
pub const RLP_OLDEST_VERSION: u32 = 1;

/// Bytes before the first chunk: magic and version.
pub const RLP_HEADER_LEN: usize = 12;

/// Bytes of a chunk's frame before its payload: length and crc32.
pub const CHUNK_HEADER_LEN: usize = 8;

/// Largest compressed payload a reader accepts (a larger length field means corruption).
pub const MAX_CHUNK_LEN: u32 = 64 << 20;

/// Largest decompressed payload a reader accepts (guards against zstd bombs).
pub const MAX_DECOMPRESSED_LEN: usize = 64 << 20;

/// Hard errors: the input is not an `.rlp` file at all, I/O failed, or the writer was misused.
#[derive(Debug, thiserror::Error)]
pub enum RlpError {
    /// The file does not start with [`RLP_MAGIC`].
    #[error("byte {offset}: not a rootline .rlp file (bad magic)")]
    BadMagic {
        /// Byte offset of the first byte that differs.
        offset: u64,
    },
    /// The file is an `.rlp` of a version this reader does not know.
    #[error(
        "byte {offset}: unsupported .rlp version {version} (this reader knows {RLP_OLDEST_VERSION} to {RLP_VERSION})"
    )]
    UnsupportedVersion {
        /// Byte offset of the version field.
        offset: u64,
        /// The version found.
        version: u32,
    },
    /// Reading or writing the underlying stream failed.
    #[error("byte {offset}: I/O error: {source}")]
    Io {
        /// Byte offset in the file where the operation failed.
        offset: u64,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The profile given to [`RlpWriter::write_chunk`] has fewer rows than already written: it is not
    /// the profile the writer started with.
    #[error(
        "{table} table has {len} rows but {written} were already written: not the same profile"
    )]
    ProfileMismatch {
        /// Which table shrank.
        table: &'static str,
        /// Rows in the profile now.
        len: u64,
        /// Rows already written.
        written: u64,
    },
    /// Samples were taken from the profile ([`crate::Profile::take_samples`]) before they were
    /// written. Nothing was written by this call; the writer continues with the samples the profile
    /// holds now, so the next call succeeds.
    #[error("{count} samples were taken from the profile before they were written; they are lost")]
    SamplesLost {
        /// Number of samples never written.
        count: u64,
    },
    /// A single row (in practice a string) is too large to fit in one chunk.
    #[error(
        "a {table} row of {bytes} bytes does not fit in a chunk (limit {MAX_DECOMPRESSED_LEN})"
    )]
    RowTooLarge {
        /// Which table.
        table: &'static str,
        /// Approximate encoded size of the row.
        bytes: usize,
    },
}

/// Why the chunk at [`RlpTailError::offset`] could not be read. Chunks before it are intact.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TailReason {
    /// The file ends inside the magic/version header.
    #[error("file header truncated after {have} of {RLP_HEADER_LEN} bytes")]
    TruncatedFileHeader {
        /// Header bytes present.
        have: usize,
    },
    /// The file ends inside a chunk's 8-byte length/crc frame.
    #[error("chunk header truncated after {have} of {CHUNK_HEADER_LEN} bytes")]
    TruncatedHeader {
        /// Frame bytes present.
        have: usize,
    },
    /// The length field exceeds [`MAX_CHUNK_LEN`].
    #[error("chunk length {len} exceeds the limit of {MAX_CHUNK_LEN} bytes")]
    ChunkTooLarge {
        /// The length field.
        len: u32,
    },
    /// The file ends inside a chunk's payload.
    #[error("chunk payload truncated after {have} of {expected} bytes")]
    TruncatedPayload {
        /// Payload bytes the length field promised.
        expected: u32,
        /// Payload bytes present.
        have: u32,
    },
    /// The payload's crc32 differs from the stored one.
    #[error("crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch {
        /// The crc in the chunk frame.
        stored: u32,
        /// The crc of the payload read.
        computed: u32,
    },
    /// The payload is not a valid zstd frame.
    #[error("zstd: {0}")]
    Zstd(String),
    /// The payload decompresses to more than [`MAX_DECOMPRESSED_LEN`] bytes.
    #[error("payload decompresses to more than {MAX_DECOMPRESSED_LEN} bytes")]
    DecompressedTooLarge,
    /// The decompressed payload is not a valid protobuf `Chunk`.
    #[error("protobuf: {0}")]
    Decode(String),
    /// The chunk decodes but refers to rows that do not exist, repeats rows, or contradicts earlier
    /// chunks.
    #[error("inconsistent chunk: {0}")]
    Inconsistent(String),
}

/// A torn or corrupt tail: the chunk starting at `offset` could not be read, for `reason`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("byte {offset}: {reason}")]
pub struct RlpTailError {
    /// Byte offset of the start of the chunk (its length field) that failed; 0 for the file header.
    pub offset: u64,
    /// What was wrong with it.
    pub reason: TailReason,
}
