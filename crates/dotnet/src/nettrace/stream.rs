//! The stream's outer framing: the `Nettrace` header, then FastSerialization objects (V4/V5) or
//! plain blocks (V6). Hands each object's payload to the reader as one [`Block`].

use std::io::{BufReader, Read};

use super::bytes::Result;
use crate::error::{ErrorKind, NetTraceError};

const MAGIC: &[u8; 8] = b"Nettrace";
const FAST_SERIALIZATION: &[u8] = b"!FastSerialization.1";
const TAG_NULL: u8 = 1;
const TAG_BEGIN_PRIVATE_OBJECT: u8 = 5;
const TAG_END_OBJECT: u8 = 6;
/// Size of the V4/V5 Trace object's fields.
const TRACE_OBJECT_SIZE: u64 = 48;

/// What a block holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BlockKind {
    Trace,
    Event,
    Metadata,
    SequencePoint,
    Stack,
    Thread,
    RemoveThread,
    LabelList,
    Other,
}

/// One object's or block's payload and where it starts in the stream.
#[derive(Debug)]
pub(crate) struct Block {
    pub(crate) kind: BlockKind,
    pub(crate) base: u64,
    pub(crate) data: Vec<u8>,
}

/// A reader that counts the bytes it has consumed.
struct Counting<R: Read> {
    inner: BufReader<R>,
    offset: u64,
}

impl<R: Read> Counting<R> {
    fn error(&self, kind: ErrorKind) -> NetTraceError {
        NetTraceError::new(self.offset, kind)
    }

    /// Reads exactly `n` bytes, allocating only as the data actually arrives.
    fn read_vec(&mut self, n: u64, what: &'static str) -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        let got = (&mut self.inner)
            .take(n)
            .read_to_end(&mut buf)
            .map_err(|e| self.error(ErrorKind::Io(e)))?;
        self.offset += got as u64;
        if (got as u64) < n {
            return Err(self.error(ErrorKind::UnexpectedEof { what }));
        }
        Ok(buf)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let v = self.read_vec(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(&v);
        Ok(a)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn expect_tag(&mut self, tag: u8, what: &'static str) -> Result<()> {
        let at = self.offset;
        let got = self.u8(what)?;
        if got != tag {
            return Err(NetTraceError::new(
                at,
                ErrorKind::Malformed(format!("expected tag {tag} ({what}), found {got}")),
            ));
        }
        Ok(())
    }
}

/// The outer framing of a stream, V4/V5 or V6.
pub(crate) struct Framing<R: Read> {
    src: Counting<R>,
    v6: bool,
    trace_read: bool,
}

impl<R: Read> Framing<R> {
    /// Reads the stream header; returns the framing and the format version.
    pub(crate) fn open(source: R) -> Result<(Framing<R>, u32)> {
        let mut src = Counting {
            inner: BufReader::with_capacity(64 * 1024, source),
            offset: 0,
        };
        let magic: [u8; 8] = src.array("magic")?;
        if &magic != MAGIC {
            return Err(NetTraceError::new(0, ErrorKind::BadMagic));
        }
        let word = src.u32("stream header")?;
        let mut framing = Framing {
            src,
            v6: word == 0,
            trace_read: false,
        };
        if word == 0 {
            let major = framing.src.u32("major version")?;
            let _minor = framing.src.u32("minor version")?;
            if major != 6 {
                return Err(NetTraceError::new(
                    12,
                    ErrorKind::Unsupported(format!("nettrace major version {major}")),
                ));
            }
            return Ok((framing, 6));
        }
        if word as usize != FAST_SERIALIZATION.len() {
            return Err(NetTraceError::new(
                8,
                ErrorKind::Malformed(format!("serializer name length {word}, expected 20")),
            ));
        }
        let name = framing.src.read_vec(word.into(), "serializer name")?;
        if name != FAST_SERIALIZATION {
            return Err(NetTraceError::new(
                12,
                ErrorKind::Unsupported(format!("serializer {:?}", String::from_utf8_lossy(&name))),
            ));
        }
        // The format version is the Trace object's type version, read with the first object.
        let trace = framing.peek_trace_version()?;
        Ok((framing, trace))
    }

    /// An error at the current offset.
    pub(crate) fn error(&self, kind: ErrorKind) -> NetTraceError {
        self.src.error(kind)
    }

    /// Reads the Trace object's type header so the format version is known up front.
    fn peek_trace_version(&mut self) -> Result<u32> {
        self.src
            .expect_tag(TAG_BEGIN_PRIVATE_OBJECT, "begin Trace object")?;
        let (version, name) = self.read_type()?;
        if name != "Trace" {
            return Err(self.src.error(ErrorKind::Malformed(format!(
                "first object is {name:?}, expected \"Trace\""
            ))));
        }
        if !(4..=5).contains(&version) {
            return Err(self.src.error(ErrorKind::Unsupported(format!(
                "Trace object version {version} (this reader knows 4 and 5; version 3 is the \
                 older .netperf format)"
            ))));
        }
        Ok(version)
    }

    /// Reads a type object: `5 1 version minVersion name 6`.
    fn read_type(&mut self) -> Result<(u32, String)> {
        self.src
            .expect_tag(TAG_BEGIN_PRIVATE_OBJECT, "begin type object")?;
        self.src.expect_tag(TAG_NULL, "type of type")?;
        let version = self.src.u32("type version")?;
        let at = self.src.offset;
        let min_reader = self.src.u32("type minimum reader version")?;
        if min_reader > 5 {
            return Err(NetTraceError::new(
                at,
                ErrorKind::Unsupported(format!("object needs reader version {min_reader}")),
            ));
        }
        let at = self.src.offset;
        let len = self.src.u32("type name length")?;
        if len > 256 {
            return Err(NetTraceError::new(
                at,
                ErrorKind::Malformed(format!("type name length {len}")),
            ));
        }
        let name = self.src.read_vec(len.into(), "type name")?;
        self.src.expect_tag(TAG_END_OBJECT, "end type object")?;
        Ok((version, String::from_utf8_lossy(&name).into_owned()))
    }

    /// The next block, or `None` at the end-of-stream marker.
    pub(crate) fn next_block(&mut self) -> Result<Option<Block>> {
        if self.v6 {
            return self.next_block_v6();
        }
        if !self.trace_read {
            self.trace_read = true;
            let base = self.src.offset;
            let data = self.src.read_vec(TRACE_OBJECT_SIZE, "Trace object")?;
            self.src.expect_tag(TAG_END_OBJECT, "end Trace object")?;
            return Ok(Some(Block {
                kind: BlockKind::Trace,
                base,
                data,
            }));
        }
        let at = self.src.offset;
        match self.src.u8("next object tag")? {
            TAG_NULL => return Ok(None),
            TAG_BEGIN_PRIVATE_OBJECT => {}
            t => {
                return Err(NetTraceError::new(
                    at,
                    ErrorKind::Malformed(format!(
                        "expected an object (tag 5) or the end (1), found {t}"
                    )),
                ));
            }
        }
        let (_version, name) = self.read_type()?;
        let kind = match name.as_str() {
            "EventBlock" => BlockKind::Event,
            "MetadataBlock" => BlockKind::Metadata,
            "StackBlock" => BlockKind::Stack,
            "SPBlock" => BlockKind::SequencePoint,
            "Trace" => BlockKind::Trace,
            _ => BlockKind::Other,
        };
        let size = self.src.u32("block size")?;
        let padding = (4 - self.src.offset % 4) % 4;
        self.src.read_vec(padding, "block alignment")?;
        let base = self.src.offset;
        let data = self.src.read_vec(size.into(), "block")?;
        self.src.expect_tag(TAG_END_OBJECT, "end of block object")?;
        Ok(Some(Block { kind, base, data }))
    }

    fn next_block_v6(&mut self) -> Result<Option<Block>> {
        let header = self.src.u32("block header")?;
        let size = header & 0x00ff_ffff;
        let kind = match header >> 24 {
            0 => return Ok(None),
            1 => BlockKind::Trace,
            2 => BlockKind::Event,
            3 => BlockKind::Metadata,
            4 => BlockKind::SequencePoint,
            5 => BlockKind::Stack,
            6 => BlockKind::Thread,
            7 => BlockKind::RemoveThread,
            8 => BlockKind::LabelList,
            _ => BlockKind::Other,
        };
        let base = self.src.offset;
        let data = self.src.read_vec(size.into(), "block")?;
        Ok(Some(Block { kind, base, data }))
    }
}
