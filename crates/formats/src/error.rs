//! The error type every reader and writer returns, with the position of the problem.

use std::fmt;

/// Where in an input a problem was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// A 1-based line number (text formats).
    Line(u64),
    /// A 1-based line and column (JSON).
    LineColumn {
        /// 1-based line.
        line: u64,
        /// 1-based column.
        column: u64,
    },
    /// A 0-based byte offset (binary formats).
    Byte(u64),
    /// The input as a whole (e.g. an empty file).
    Input,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Position::Line(line) => write!(f, "line {line}"),
            Position::LineColumn { line, column } => write!(f, "line {line}, column {column}"),
            Position::Byte(offset) => write!(f, "byte offset {offset}"),
            Position::Input => f.write_str("input"),
        }
    }
}

/// An error reading or writing a profile format.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The underlying reader or writer failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The input is not valid for the format.
    #[error("{position}: {message}")]
    Invalid {
        /// Where the problem is.
        position: Position,
        /// What is wrong, in words a user can act on.
        message: String,
    },
    /// The format does not support this direction.
    #[error("the {format} format can't be {action} by rootline")]
    Unsupported {
        /// The format's name.
        format: &'static str,
        /// `read` or `written`.
        action: &'static str,
    },
}

impl FormatError {
    /// An [`FormatError::Invalid`] at `position`.
    pub fn invalid(position: Position, message: impl Into<String>) -> FormatError {
        FormatError::Invalid {
            position,
            message: message.into(),
        }
    }
}
