//! pprof (`.pb.gz`, `.pprof`): Google's `profile.proto`, as written by Go, pprof-rs, pyroscope and
//! read by `go tool pprof` and most profile viewers.
//!
//! The reader also takes the legacy binary CPU profiles of gperftools and old Go (see the `legacy`
//! module), as `go tool pprof` does. It takes the file gzipped or not (gzip is recognised by its magic bytes), caps the
//! decompressed size at [`MAX_DECODED_BYTES`] so a gzip bomb ends in an error rather than in memory
//! exhaustion, and checks every id and string index before use. Errors carry the byte offset (in the
//! decompressed protobuf) of the top-level field at fault.
//!
//! Mapping to the rootline model:
//! - each pprof `Location` becomes one frame per `Line`: the last line is the physical frame
//!   (`inline_depth` 0), the earlier lines are the functions inlined into it; a location without
//!   lines becomes a frame named by its address (`0x…`);
//! - `thread_id`/`tid`, `thread_name` and `pid` labels (numeric or string) pick the thread; a
//!   `timestamp_ns` label gives the sample's time, else the profile's start time is used; the keys
//!   of other labels, which the model has no place for, are listed in the metadata's
//!   `pprof.dropped_label_keys`;
//! - frame kinds are not stored by pprof: frames in a `[kernel.kallsyms]`/`vmlinux` mapping read back
//!   as kernel frames, `[truncated: …]` names as truncation markers, everything else as native;
//! - a sample without locations gets a `[truncated: …]` frame saying so, so its value is kept;
//! - a function's `system_name`, when set and not its name, is kept as the function's system name.
//!
//! The writer emits one gzipped `Profile` with the profile's sample types, one `Mapping` and
//! `Function` per distinct row, one `Location` per distinct (mapping, address, inline chain) — the
//! frames inlined at one address grouped into one location with the innermost line first — and
//! address-0 (name-only) frames each in a location of their own. Samples are summed per
//! (thread, stack) and carry `thread_id`, `pid` and `thread_name` labels, and an allocation's (a
//! stack whose leaf is `[alloc: TYPE]`) an `allocated_type` label, TYPE (the reader knows the key
//! and leaves the type to the frame). A `Function`'s
//! `system_name` is the name its runtime wrote (a CoreCLR perf map's whole line, code tier
//! included), else its name; pprof has no other place for the code tier.

mod decode;
pub(crate) mod encode;
mod legacy;
pub mod proto;

use std::io::{BufRead, Read, Write};

use flate2::Compression;
use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use prost::Message;
use rootline_profile::Profile;

use crate::error::{FormatError, Position};

/// Largest decompressed (or raw) protobuf the reader accepts: 1 GiB.
pub const MAX_DECODED_BYTES: u64 = 1 << 30;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Reads a pprof profile (gzipped or not), decompressing at most [`MAX_DECODED_BYTES`].
pub fn read(reader: impl BufRead) -> Result<Profile, FormatError> {
    read_with_limit(reader, MAX_DECODED_BYTES)
}

/// Reads a pprof profile, refusing input whose (decompressed) protobuf exceeds `limit` bytes.
pub fn read_with_limit(reader: impl BufRead, limit: u64) -> Result<Profile, FormatError> {
    let bytes = load(reader, limit)?;
    decode::profile_from_bytes(&bytes)
}

/// True when a file's first bytes look like pprof: gzip (how pprof files are almost always stored;
/// rootline writes no other gzipped format) or a legacy CPU profile header. Raw, uncompressed
/// protobuf has no signature and is recognised by its extension only.
pub fn looks_like(head: &[u8]) -> bool {
    head.starts_with(&GZIP_MAGIC) || legacy::is_legacy(head)
}

/// Decodes the raw `profile.proto` message (not gzipped) without converting it.
pub fn decode_message(bytes: &[u8]) -> Result<proto::Profile, FormatError> {
    decode::message_from_bytes(bytes).map(|(message, _)| message)
}

/// Reads the input and, when it is gzipped, decompresses it, keeping at most `limit` bytes.
fn load(reader: impl BufRead, limit: u64) -> Result<Vec<u8>, FormatError> {
    let mut raw = Vec::new();
    reader.take(limit.saturating_add(1)).read_to_end(&mut raw)?;
    if raw.len() as u64 > limit {
        return Err(FormatError::invalid(
            Position::Byte(limit),
            format!("the input is larger than the {limit}-byte limit for pprof files"),
        ));
    }
    if raw.is_empty() {
        return Err(FormatError::invalid(
            Position::Input,
            "the input is empty, not a pprof profile",
        ));
    }
    if !raw.starts_with(&GZIP_MAGIC) {
        return Ok(raw);
    }
    let mut decoder = MultiGzDecoder::new(&raw[..]);
    let mut out = Vec::new();
    let result = (&mut decoder)
        .take(limit.saturating_add(1))
        .read_to_end(&mut out);
    let consumed = (raw.len() - decoder.get_ref().len()) as u64;
    if let Err(e) = result {
        return Err(FormatError::invalid(
            Position::Byte(consumed),
            format!("the gzip stream is damaged or cut short: {e}"),
        ));
    }
    if out.len() as u64 > limit {
        return Err(FormatError::invalid(
            Position::Byte(consumed),
            format!(
                "the gzip stream decompresses to more than {limit} bytes; refusing it as a \
                 possible gzip bomb"
            ),
        ));
    }
    Ok(out)
}

/// Writes `profile` as a gzipped pprof `Profile`.
pub fn write(profile: &Profile, writer: impl Write) -> Result<(), FormatError> {
    let message = encode::to_message(profile);
    let mut encoder = GzEncoder::new(writer, Compression::default());
    encoder.write_all(&message.encode_to_vec())?;
    encoder.finish()?.flush()?;
    Ok(())
}

/// Builds the (uncompressed) pprof message for `profile`, for callers that frame it themselves.
pub fn to_message(profile: &Profile) -> proto::Profile {
    encode::to_message(profile)
}
