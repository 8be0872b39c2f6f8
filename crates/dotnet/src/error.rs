//! The reader's error: what went wrong and at which byte of the stream.

use std::fmt;

/// An error reading a `.nettrace` stream, with the byte offset (from the start of the stream) where
/// the problem was found.
#[derive(Debug, thiserror::Error)]
#[error("nettrace: at byte {offset}: {kind}")]
pub struct NetTraceError {
    /// Byte offset from the start of the stream.
    pub offset: u64,
    /// What went wrong.
    pub kind: ErrorKind,
}

impl NetTraceError {
    /// An error of `kind` at `offset`.
    pub fn new(offset: u64, kind: ErrorKind) -> NetTraceError {
        NetTraceError { offset, kind }
    }

    /// True when the stream ended early (a truncated file or a cut-off stream).
    pub fn is_truncated(&self) -> bool {
        matches!(self.kind, ErrorKind::UnexpectedEof { .. })
    }
}

/// What went wrong reading a `.nettrace` stream.
#[derive(Debug)]
pub enum ErrorKind {
    /// The underlying reader failed.
    Io(std::io::Error),
    /// The stream ended while `what` was being read.
    UnexpectedEof {
        /// The structure being read.
        what: &'static str,
    },
    /// The stream does not start with the `Nettrace` magic.
    BadMagic,
    /// The format version is not one this reader understands.
    Unsupported(String),
    /// A structure holds a value that cannot be right.
    Malformed(String),
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Io(e) => write!(f, "read failed: {e}"),
            ErrorKind::UnexpectedEof { what } => {
                write!(f, "stream ends inside {what} (truncated file?)")
            }
            ErrorKind::BadMagic => write!(f, "not a .nettrace stream (no `Nettrace` magic)"),
            ErrorKind::Unsupported(s) => write!(f, "unsupported: {s}"),
            ErrorKind::Malformed(s) => write!(f, "malformed: {s}"),
        }
    }
}
