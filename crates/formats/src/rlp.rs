//! The native `.rlp` file through the common format interface (the file itself lives in
//! [`rootline_profile::rlp`]).
//!
//! A torn or corrupt tail is not an error here: every complete chunk is returned, and the tail is
//! reported as a warning in the profile's metadata (see [`crate::WARNING_PREFIX`]).

use std::io::{BufRead, Write};

use rootline_profile::Profile;
use rootline_profile::rlp::{RlpError, read_rlp, write_rlp};

use crate::error::{FormatError, Position};

fn convert(err: RlpError) -> FormatError {
    match err {
        RlpError::BadMagic { offset } => FormatError::invalid(
            Position::Byte(offset),
            "not a rootline .rlp file (bad magic)",
        ),
        RlpError::UnsupportedVersion { offset, version } => FormatError::invalid(
            Position::Byte(offset),
            format!("unsupported .rlp version {version}; a newer rootline wrote it"),
        ),
        RlpError::Io { source, .. } => FormatError::Io(source),
        other => FormatError::invalid(Position::Input, other.to_string()),
    }
}

/// Reads an `.rlp` file: every complete chunk, with a torn tail reported as a warning.
pub fn read(reader: impl BufRead) -> Result<Profile, FormatError> {
    let read = read_rlp(reader).map_err(convert)?;
    let mut profile = read.profile;
    if let Some(tail) = read.tail {
        profile.metadata.extra.insert(
            format!("{}rlp.tail", crate::WARNING_PREFIX),
            format!(
                "the file is torn or corrupt at byte {} ({}); read the {} complete chunks before it",
                tail.offset, tail.reason, read.chunks
            ),
        );
    }
    Ok(profile)
}

/// Writes `profile` as a complete `.rlp` file (one chunk, or several if it is large).
pub fn write(profile: &Profile, writer: impl Write) -> Result<(), FormatError> {
    write_rlp(writer, profile).map_err(convert)?;
    Ok(())
}
