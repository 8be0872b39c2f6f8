//! [`RlpReader`]: reads chunks one at a time, merging each into a [`Profile`], and stops at the
//! first torn or corrupt chunk with an [`RlpTailError`] instead of failing.

use std::io::Read;

use prost::Message;

use super::apply::apply_chunk;
use super::schema;
use super::{
    CHUNK_HEADER_LEN, MAX_CHUNK_LEN, MAX_DECOMPRESSED_LEN, RLP_HEADER_LEN, RLP_MAGIC,
    RLP_OLDEST_VERSION, RLP_VERSION, RlpError, RlpTailError, TailReason,
};
use crate::profile::{Profile, Samples};

/// Everything [`read_rlp`] could read from a file.
#[derive(Debug)]
pub struct RlpRead {
    /// Every complete chunk merged. An empty `Profile::new(vec![])` when no chunk was readable.
    pub profile: Profile,
    /// Number of chunks merged.
    pub chunks: usize,
    /// Bytes of the file that were read and are intact: header plus complete chunks. A file cut to
    /// this length reads back the same profile with no tail error.
    pub valid_len: u64,
    /// Why reading stopped before the end of the input, if it did.
    pub tail: Option<RlpTailError>,
}

/// What [`RlpReader::next_chunk`] merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkInfo {
    /// Byte offset of the chunk's frame (its length field).
    pub offset: u64,
    /// Compressed payload bytes.
    pub len: u32,
    /// Samples the chunk added.
    pub samples: usize,
}

/// Reads an `.rlp` stream chunk by chunk.
///
/// [`RlpReader::next_chunk`] merges one chunk into the reader's profile and returns `Ok(None)` at the
/// end of the input *or* at the first chunk that cannot be read; [`RlpReader::tail`] then tells which.
/// A chunk is merged completely or not at all. Between chunks the caller may look at
/// [`RlpReader::profile`] and drop the samples read so far with [`RlpReader::take_samples`], so a
/// long recording can be processed in bounded memory.
pub struct RlpReader<R> {
    input: R,
    offset: u64,
    profile: Option<Profile>,
    chunks: usize,
    tail: Option<RlpTailError>,
    done: bool,
    payload: Vec<u8>,
    decompressed: Vec<u8>,
}

impl<R: Read> RlpReader<R> {
    /// Reads and checks the file header. Bad magic or an unknown version is an error; a file that
    /// ends inside the header (a recorder killed at once) gives a reader with no chunks and a
    /// [`TailReason::TruncatedFileHeader`] tail.
    pub fn new(mut input: R) -> Result<Self, RlpError> {
        let mut header = [0u8; RLP_HEADER_LEN];
        let have = read_full(&mut input, &mut header)
            .map_err(|source| RlpError::Io { offset: 0, source })?;
        let magic_have = have.min(RLP_MAGIC.len());
        if let Some(i) = (0..magic_have).find(|&i| header[i] != RLP_MAGIC[i]) {
            return Err(RlpError::BadMagic { offset: i as u64 });
        }
        let mut reader = RlpReader {
            input,
            offset: 0,
            profile: None,
            chunks: 0,
            tail: None,
            done: false,
            payload: Vec::new(),
            decompressed: Vec::new(),
        };
        if have < RLP_HEADER_LEN {
            reader.fail(TailReason::TruncatedFileHeader { have });
            return Ok(reader);
        }
        let version = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
        if !(RLP_OLDEST_VERSION..=RLP_VERSION).contains(&version) {
            return Err(RlpError::UnsupportedVersion {
                offset: RLP_MAGIC.len() as u64,
                version,
            });
        }
        reader.offset = RLP_HEADER_LEN as u64;
        Ok(reader)
    }

    /// Reads the next chunk and merges it into the profile. `Ok(None)` at the end of the input or at
    /// a torn or corrupt chunk (see [`RlpReader::tail`]); `Err` only when the input itself fails.
    pub fn next_chunk(&mut self) -> Result<Option<ChunkInfo>, RlpError> {
        if self.done {
            return Ok(None);
        }
        let offset = self.offset;
        let io = |source| RlpError::Io { offset, source };
        let mut frame = [0u8; CHUNK_HEADER_LEN];
        let have = read_full(&mut self.input, &mut frame).map_err(io)?;
        if have == 0 {
            self.done = true;
            return Ok(None);
        }
        if have < CHUNK_HEADER_LEN {
            return Ok(self.fail(TailReason::TruncatedHeader { have }));
        }
        let len = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]);
        let stored = u32::from_le_bytes([frame[4], frame[5], frame[6], frame[7]]);
        if len > MAX_CHUNK_LEN {
            return Ok(self.fail(TailReason::ChunkTooLarge { len }));
        }
        self.payload.clear();
        // `take` + `read_to_end` grows the buffer with the data actually present, so a corrupt
        // length field near the limit costs no large allocation on a short file.
        (&mut self.input)
            .take(u64::from(len))
            .read_to_end(&mut self.payload)
            .map_err(io)?;
        if self.payload.len() < len as usize {
            let have = self.payload.len() as u32;
            return Ok(self.fail(TailReason::TruncatedPayload {
                expected: len,
                have,
            }));
        }
        let computed = crc32fast::hash(&self.payload);
        if computed != stored {
            return Ok(self.fail(TailReason::CrcMismatch { stored, computed }));
        }
        if let Err(reason) = decompress(&self.payload, &mut self.decompressed) {
            return Ok(self.fail(reason));
        }
        let chunk = match schema::Chunk::decode(self.decompressed.as_slice()) {
            Ok(chunk) => chunk,
            Err(e) => return Ok(self.fail(TailReason::Decode(e.to_string()))),
        };
        let samples = match apply_chunk(&mut self.profile, chunk) {
            Ok(samples) => samples,
            Err(message) => return Ok(self.fail(TailReason::Inconsistent(message))),
        };
        self.offset += (CHUNK_HEADER_LEN as u64) + u64::from(len);
        self.chunks += 1;
        Ok(Some(ChunkInfo {
            offset,
            len,
            samples,
        }))
    }

    /// The profile merged so far; `None` before the first chunk (it carries the sample types).
    pub fn profile(&self) -> Option<&Profile> {
        self.profile.as_ref()
    }

    /// Removes and returns the samples merged so far (see [`Profile::take_samples`]).
    pub fn take_samples(&mut self) -> Samples {
        self.profile
            .as_mut()
            .map(Profile::take_samples)
            .unwrap_or_default()
    }

    /// Chunks merged so far.
    pub fn chunks_read(&self) -> usize {
        self.chunks
    }

    /// Bytes read and intact so far: the header plus the chunks merged.
    pub fn valid_len(&self) -> u64 {
        self.offset
    }

    /// Why reading stopped early, once [`RlpReader::next_chunk`] has returned `Ok(None)`.
    pub fn tail(&self) -> Option<&RlpTailError> {
        self.tail.as_ref()
    }

    /// The merged profile (an empty `Profile::new(vec![])` if no chunk was read) and the tail.
    pub fn finish(self) -> RlpRead {
        RlpRead {
            profile: self.profile.unwrap_or_else(|| Profile::new(Vec::new())),
            chunks: self.chunks,
            valid_len: self.offset,
            tail: self.tail,
        }
    }

    fn fail(&mut self, reason: TailReason) -> Option<ChunkInfo> {
        self.tail = Some(RlpTailError {
            offset: self.offset,
            reason,
        });
        self.done = true;
        None
    }
}

/// Reads a whole `.rlp` stream: every complete chunk merged into one profile, plus the reason reading
/// stopped early, if it did. Errors only for input that is not an `.rlp` file (bad magic, unknown
/// version) or when reading `input` fails.
pub fn read_rlp<R: Read>(input: R) -> Result<RlpRead, RlpError> {
    let mut reader = RlpReader::new(input)?;
    while reader.next_chunk()?.is_some() {}
    Ok(reader.finish())
}

/// Fills `buf` from `input` until it is full or the input ends; returns the bytes read.
fn read_full<R: Read>(input: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut have = 0;
    while have < buf.len() {
        match input.read(&mut buf[have..]) {
            Ok(0) => break,
            Ok(n) => have += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(have)
}

/// Decompresses one zstd payload into `out`, refusing more than [`MAX_DECOMPRESSED_LEN`] bytes.
fn decompress(payload: &[u8], out: &mut Vec<u8>) -> Result<(), TailReason> {
    out.clear();
    if payload.is_empty() {
        return Err(TailReason::Zstd("empty payload".into()));
    }
    let zstd_error = |e: std::io::Error| TailReason::Zstd(e.to_string());
    let mut decoder = zstd::stream::read::Decoder::with_buffer(payload).map_err(zstd_error)?;
    (&mut decoder)
        .take(MAX_DECOMPRESSED_LEN as u64 + 1)
        .read_to_end(out)
        .map_err(zstd_error)?;
    if out.len() > MAX_DECOMPRESSED_LEN {
        out.clear();
        out.shrink_to(MAX_DECOMPRESSED_LEN / 4);
        return Err(TailReason::DecompressedTooLarge);
    }
    Ok(())
}
