//! Streaming `.nettrace` reader: formats V4/V5 (FastSerialization objects, what .NET Core 3.0 to
//! .NET 9 write) and V6 (plain blocks).
//!
//! [`NetTraceReader::next_event`] returns one event at a time. Metadata, stack, thread and
//! sequence-point blocks are consumed on the way: an event comes back with its metadata and its
//! stack already resolved (stack ids are interned per sequence-point region, so they are resolved
//! when the event is read, never later). Memory is bounded by one block plus the current region's
//! stacks plus the metadata table.

mod bytes;
mod header;
mod metadata;
mod stream;
mod trace;

use std::collections::HashMap;
use std::io::Read;

use crate::error::{ErrorKind, NetTraceError};
pub(crate) use bytes::Bytes;
use bytes::Result;
use header::{HeaderState, decode_header};
pub use metadata::{EventMetadata, FieldInfo};
use stream::{Block, BlockKind, Framing};
pub use trace::TraceInfo;
use trace::parse_trace;

/// One event, with its metadata and stack resolved. Borrows from the reader until the next call.
#[derive(Debug, Clone, Copy)]
pub struct Event<'a> {
    /// The event's kind.
    pub metadata: &'a EventMetadata,
    /// Per-capture-thread sequence number.
    pub sequence_number: u32,
    /// OS id of the thread the event describes (for V6, the thread table's OS id, or the thread
    /// index when the table gives none).
    pub thread_id: u64,
    /// OS id of the thread that wrote the event.
    pub capture_thread_id: u64,
    /// OS process id from the V6 thread table, when given.
    pub process_id: Option<u64>,
    /// Processor the capture thread ran on.
    pub processor: u32,
    /// Timestamp in ticks (see [`TraceInfo::timestamp_ns`]).
    pub timestamp: u64,
    /// The writer marked everything after this event as not earlier than it.
    pub is_sorted: bool,
    /// The event's stack, leaf first.
    pub stack: Stack<'a>,
    /// The payload bytes, laid out as the metadata (or the runtime's manifest) says.
    pub payload: &'a [u8],
    /// Stream offset of the event's header.
    pub offset: u64,
}

/// A stack as the trace stores it: pointer-sized instruction pointers, leaf first.
#[derive(Debug, Clone, Copy)]
pub struct Stack<'a> {
    bytes: &'a [u8],
    pointer_size: u8,
}

impl<'a> Stack<'a> {
    /// Number of frames.
    pub fn len(&self) -> usize {
        self.bytes.len() / usize::from(self.pointer_size.max(1))
    }

    /// True when the event has no stack.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The instruction pointers, leaf first.
    pub fn ips(&self) -> impl Iterator<Item = u64> + 'a {
        let size = usize::from(self.pointer_size.max(1));
        self.bytes.chunks_exact(size).map(move |c| {
            let mut a = [0u8; 8];
            a[..c.len().min(8)].copy_from_slice(&c[..c.len().min(8)]);
            u64::from_le_bytes(a)
        })
    }
}

/// Counts the reader keeps while it reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReaderStats {
    /// Events returned.
    pub events: u64,
    /// Events the writer dropped, from gaps in per-thread sequence numbers and sequence points.
    pub dropped_events: u64,
    /// Events whose stack id was not defined in the current sequence-point region.
    pub missing_stacks: u64,
    /// Events whose metadata id was never defined.
    pub unknown_metadata: u64,
    /// Blocks read, by kind.
    pub blocks: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct ThreadRow {
    os_tid: Option<u64>,
    os_pid: Option<u64>,
}

/// A streaming `.nettrace` reader. See the [module docs](self).
pub struct NetTraceReader<R: Read> {
    framing: Framing<R>,
    info: TraceInfo,
    metadata: HashMap<u32, EventMetadata>,
    unknown: EventMetadata,
    stack_arena: Vec<u8>,
    stacks: HashMap<u32, (usize, usize)>,
    threads: HashMap<u64, ThreadRow>,
    last_sequence: HashMap<u64, u32>,
    block: Vec<u8>,
    block_base: u64,
    block_pos: usize,
    compressed: bool,
    state: HeaderState,
    done: bool,
    stats: ReaderStats,
}

impl<R: Read> NetTraceReader<R> {
    /// Reads the stream header and the Trace object. `source` is read sequentially (wrap a file in
    /// nothing: the reader buffers).
    pub fn new(source: R) -> std::result::Result<NetTraceReader<R>, NetTraceError> {
        let (mut framing, format_version) = Framing::open(source)?;
        let block = framing
            .next_block()?
            .ok_or_else(|| framing.error(ErrorKind::Malformed("no Trace object".into())))?;
        if block.kind != BlockKind::Trace {
            return Err(NetTraceError::new(
                block.base,
                ErrorKind::Malformed("the first object is not the Trace object".into()),
            ));
        }
        let info = parse_trace(&block, format_version)?;
        Ok(NetTraceReader {
            framing,
            info,
            metadata: HashMap::new(),
            unknown: EventMetadata {
                provider: "<unknown metadata>".into(),
                ..EventMetadata::default()
            },
            stack_arena: Vec::new(),
            stacks: HashMap::new(),
            threads: HashMap::new(),
            last_sequence: HashMap::new(),
            block: Vec::new(),
            block_base: 0,
            block_pos: 0,
            compressed: false,
            state: HeaderState::default(),
            done: false,
            stats: ReaderStats::default(),
        })
    }

    /// Facts about the whole trace.
    pub fn info(&self) -> &TraceInfo {
        &self.info
    }

    /// Counts so far.
    pub fn stats(&self) -> &ReaderStats {
        &self.stats
    }

    /// Metadata seen so far, by id.
    pub fn metadata(&self) -> &HashMap<u32, EventMetadata> {
        &self.metadata
    }

    /// The next event, or `None` at the end of the stream.
    pub fn next_event(&mut self) -> std::result::Result<Option<Event<'_>>, NetTraceError> {
        let decoded = loop {
            if self.done {
                return Ok(None);
            }
            if self.block_pos < self.block.len() {
                let mut b = Bytes::new(&self.block[self.block_pos..], self.block_base);
                let d = decode_header(
                    &mut b,
                    &mut self.state,
                    self.compressed,
                    self.info.format_version,
                    self.block_pos,
                )?;
                self.block_pos += b.pos();
                if self.info.format_version < 6 && !self.compressed {
                    // Uncompressed V4/V5 events are padded to a 4-byte stream offset.
                    let abs = self.block_base + self.block_pos as u64;
                    self.block_pos += ((4 - abs % 4) % 4) as usize;
                    self.block_pos = self.block_pos.min(self.block.len());
                }
                break d;
            }
            self.read_block()?;
        };
        self.account_sequence(&decoded.h);
        self.stats.events += 1;
        let metadata = match self.metadata.get(&decoded.h.metadata_id) {
            Some(m) => m,
            None => {
                self.stats.unknown_metadata += 1;
                &self.unknown
            }
        };
        let stack_bytes = match decoded.h.stack_id {
            0 => &[][..],
            id => match self.stacks.get(&id) {
                Some(&(start, end)) => &self.stack_arena[start..end],
                None => {
                    self.stats.missing_stacks += 1;
                    &[][..]
                }
            },
        };
        let (thread_id, capture_thread_id, process_id) = if self.info.format_version >= 6 {
            let t = self
                .threads
                .get(&decoded.h.thread)
                .copied()
                .unwrap_or_default();
            let c = self.threads.get(&decoded.h.capture_thread).copied();
            (
                t.os_tid.unwrap_or(decoded.h.thread),
                c.and_then(|c| c.os_tid).unwrap_or(decoded.h.capture_thread),
                t.os_pid,
            )
        } else {
            (decoded.h.thread, decoded.h.capture_thread, None)
        };
        Ok(Some(Event {
            metadata,
            sequence_number: decoded.h.sequence,
            thread_id,
            capture_thread_id,
            process_id,
            processor: decoded.h.processor,
            timestamp: decoded.h.timestamp,
            is_sorted: decoded.sorted,
            stack: Stack {
                bytes: stack_bytes,
                pointer_size: self.info.pointer_size,
            },
            payload: &self.block[decoded.payload.0..decoded.payload.1],
            offset: decoded.offset,
        }))
    }

    fn account_sequence(&mut self, h: &HeaderState) {
        if self.info.format_version < 6 && h.metadata_id == 0 {
            return;
        }
        if let Some(last) = self.last_sequence.insert(h.capture_thread, h.sequence) {
            let expected = last.wrapping_add(1);
            // A reset to 1 is a new thread reusing the id, not a loss.
            if h.sequence != expected && h.sequence != 1 {
                let gap = h.sequence.wrapping_sub(expected);
                if gap < 1 << 31 {
                    self.stats.dropped_events += u64::from(gap);
                }
            }
        }
    }

    /// Reads the next block and consumes it unless it is an event block.
    fn read_block(&mut self) -> Result<()> {
        let Some(block) = self.framing.next_block()? else {
            self.done = true;
            return Ok(());
        };
        self.stats.blocks += 1;
        let v6 = self.info.format_version >= 6;
        match block.kind {
            BlockKind::Event => {
                let mut b = Bytes::new(&block.data, block.base);
                let header_size = usize::from(b.u16("event block header size")?);
                let flags = b.u16("event block flags")?;
                if header_size < 4 {
                    return Err(b.malformed(format!("event block header size {header_size}")));
                }
                b.skip(header_size - 4, "event block header")?;
                self.compressed = flags & 1 != 0;
                self.block_pos = b.pos();
                self.block_base = block.base;
                self.block = block.data;
                self.state = HeaderState::default();
            }
            BlockKind::Metadata if v6 => self.read_metadata_v6(&block)?,
            BlockKind::Metadata => self.read_metadata_v5(&block)?,
            BlockKind::Stack => self.read_stacks(&block)?,
            BlockKind::SequencePoint => self.read_sequence_point(&block, v6)?,
            BlockKind::Thread => self.read_threads(&block)?,
            BlockKind::Trace => {
                return Err(NetTraceError::new(
                    block.base,
                    ErrorKind::Malformed("a second Trace object".into()),
                ));
            }
            BlockKind::RemoveThread | BlockKind::LabelList | BlockKind::Other => {}
        }
        Ok(())
    }

    fn read_metadata_v5(&mut self, block: &Block) -> Result<()> {
        let mut b = Bytes::new(&block.data, block.base);
        let header_size = usize::from(b.u16("metadata block header size")?);
        let flags = b.u16("metadata block flags")?;
        if header_size < 4 {
            return Err(b.malformed(format!("metadata block header size {header_size}")));
        }
        b.skip(header_size - 4, "metadata block header")?;
        let mut state = HeaderState::default();
        while !b.is_empty() {
            // `b` spans the whole block, so payload ranges come out in block coordinates.
            let d = decode_header(&mut b, &mut state, flags & 1 != 0, 5, 0)?;
            if flags & 1 == 0 {
                let abs = b.offset();
                b.skip(
                    ((4 - abs % 4) % 4).min(b.remaining() as u64) as usize,
                    "padding",
                )?;
            }
            let payload = &block.data[d.payload.0..d.payload.1];
            let mut p = Bytes::new(payload, block.base + d.payload.0 as u64);
            let m = metadata::parse_v5(&mut p)?;
            self.metadata.insert(m.id, m);
        }
        Ok(())
    }

    fn read_metadata_v6(&mut self, block: &Block) -> Result<()> {
        let mut b = Bytes::new(&block.data, block.base);
        let header_size = usize::from(b.u16("metadata block header size")?);
        b.skip(header_size, "metadata block header")?;
        while !b.is_empty() {
            let size = usize::from(b.u16("metadata row size")?);
            let row = b.take(size, "metadata row")?;
            let mut r = Bytes::new(row, b.offset() - size as u64);
            let m = metadata::parse_v6(&mut r)?;
            self.metadata.insert(m.id, m);
        }
        Ok(())
    }

    fn read_stacks(&mut self, block: &Block) -> Result<()> {
        let mut b = Bytes::new(&block.data, block.base);
        let first = b.u32("stack block first id")?;
        let count = b.u32("stack block count")?;
        for i in 0..count {
            let size = b.u32("stack size")? as usize;
            let bytes = b.take(size, "stack")?;
            if !size.is_multiple_of(usize::from(self.info.pointer_size)) {
                return Err(b.malformed(format!(
                    "stack of {size} bytes is not a whole number of {}-byte pointers",
                    self.info.pointer_size
                )));
            }
            let start = self.stack_arena.len();
            self.stack_arena.extend_from_slice(bytes);
            self.stacks
                .insert(first.wrapping_add(i), (start, self.stack_arena.len()));
        }
        Ok(())
    }

    fn read_sequence_point(&mut self, block: &Block, v6: bool) -> Result<()> {
        let mut b = Bytes::new(&block.data, block.base);
        b.u64("sequence point timestamp")?;
        let flags = if v6 {
            b.u32("sequence point flags")?
        } else {
            0
        };
        let count = b.u32("sequence point thread count")?;
        for _ in 0..count {
            let (thread, seq) = if v6 {
                (
                    b.varuint64("sequence point thread")?,
                    b.varuint32("sequence point sequence number")?,
                )
            } else {
                (
                    b.u64("sequence point thread")?,
                    b.u32("sequence point sequence number")?,
                )
            };
            match self.last_sequence.get(&thread) {
                Some(&last) => {
                    let gap = seq.wrapping_sub(last);
                    if gap != 0 && gap < 1 << 31 {
                        self.stats.dropped_events += u64::from(gap);
                        self.last_sequence.insert(thread, seq);
                    }
                }
                None => {
                    self.last_sequence.insert(thread, seq);
                }
            }
        }
        // Stack ids are only valid up to the next sequence point.
        self.stacks.clear();
        self.stack_arena.clear();
        if flags & 1 != 0 {
            self.threads.clear();
        }
        if flags & 2 != 0 {
            self.metadata.clear();
        }
        Ok(())
    }

    fn read_threads(&mut self, block: &Block) -> Result<()> {
        let mut b = Bytes::new(&block.data, block.base);
        while !b.is_empty() {
            let size = usize::from(b.u16("thread row size")?);
            let row = b.take(size, "thread row")?;
            let mut r = Bytes::new(row, b.offset() - size as u64);
            let index = r.varuint64("thread index")?;
            let mut t = ThreadRow::default();
            while !r.is_empty() {
                match r.u8("thread info kind")? {
                    1 => {
                        r.utf8_varlen("thread name")?;
                    }
                    2 => t.os_pid = Some(r.varuint64("thread process id")?),
                    3 => t.os_tid = Some(r.varuint64("thread OS id")?),
                    4 => {
                        r.utf8_varlen("thread key")?;
                        r.utf8_varlen("thread value")?;
                    }
                    k => return Err(r.malformed(format!("unknown thread info kind {k}"))),
                }
            }
            self.threads.insert(index, t);
        }
        Ok(())
    }
}
