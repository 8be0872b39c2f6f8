//! Event headers: the compressed (delta and varint) and plain encodings of formats V4–V6.

use super::bytes::{Bytes, Result};
use crate::error::{ErrorKind, NetTraceError};

/// Header fields decoded so far in the current block (compressed headers are deltas against them).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct HeaderState {
    pub(crate) metadata_id: u32,
    pub(crate) sequence: u32,
    pub(crate) capture_thread: u64,
    pub(crate) processor: u32,
    pub(crate) thread: u64,
    pub(crate) stack_id: u32,
    pub(crate) timestamp: u64,
    pub(crate) payload_size: u32,
}

/// A decoded event header, with the payload's place in the current block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decoded {
    pub(crate) h: HeaderState,
    pub(crate) sorted: bool,
    pub(crate) payload: (usize, usize),
    pub(crate) offset: u64,
}

/// Decodes one event header and locates its payload. `block_pos` is the cursor's start within the
/// block, so the payload range can be given in block coordinates.
pub(crate) fn decode_header(
    b: &mut Bytes<'_>,
    s: &mut HeaderState,
    compressed: bool,
    version: u32,
    block_pos: usize,
) -> Result<Decoded> {
    let offset = b.offset();
    let sorted;
    if compressed {
        let flags = b.u8("event header flags")?;
        if flags & 1 != 0 {
            s.metadata_id = b.varuint32("event metadata id")?;
        }
        if flags & 2 != 0 {
            s.sequence = s
                .sequence
                .wrapping_add(b.varuint32("event sequence number")?);
            s.capture_thread = b.varuint64("event capture thread")?;
            s.processor = b.varuint32("event processor")?;
        }
        if version >= 6 || s.metadata_id != 0 {
            s.sequence = s.sequence.wrapping_add(1);
        }
        if flags & 4 != 0 {
            s.thread = b.varuint64("event thread")?;
        }
        if flags & 8 != 0 {
            s.stack_id = b.varuint32("event stack id")?;
        }
        s.timestamp = s.timestamp.wrapping_add(b.varuint64("event timestamp")?);
        if version >= 6 {
            if flags & 16 != 0 {
                b.varuint32("event label list id")?;
            }
        } else {
            if flags & 16 != 0 {
                b.guid("event activity id")?;
            }
            if flags & 32 != 0 {
                b.guid("event related activity id")?;
            }
        }
        sorted = flags & 64 != 0;
        if flags & 128 != 0 {
            s.payload_size = b.varuint32("event payload size")?;
        }
        let start = block_pos + b.pos();
        b.skip(s.payload_size as usize, "event payload")?;
        return Ok(Decoded {
            h: *s,
            sorted,
            payload: (start, start + s.payload_size as usize),
            offset,
        });
    }
    let event_size = b.u32("event size")? as usize;
    let body_start = b.pos();
    let meta = b.u32("event metadata id")?;
    sorted = meta & 0x8000_0000 != 0;
    s.metadata_id = meta & 0x7fff_ffff;
    s.sequence = b.u32("event sequence number")?;
    s.thread = b.u64("event thread")?;
    s.capture_thread = b.u64("event capture thread")?;
    s.processor = b.u32("event processor")?;
    s.stack_id = b.u32("event stack id")?;
    s.timestamp = b.u64("event timestamp")?;
    if version >= 6 {
        b.u32("event label list id")?;
    } else {
        b.guid("event activity id")?;
        b.guid("event related activity id")?;
    }
    s.payload_size = b.u32("event payload size")?;
    let start = block_pos + b.pos();
    b.skip(s.payload_size as usize, "event payload")?;
    let used = b.pos() - body_start;
    if used > event_size {
        return Err(NetTraceError::new(
            offset,
            ErrorKind::Malformed(format!(
                "event size {event_size} is smaller than its header and payload ({used})"
            )),
        ));
    }
    b.skip(event_size - used, "event")?;
    Ok(Decoded {
        h: *s,
        sorted,
        payload: (start, start + s.payload_size as usize),
        offset,
    })
}
