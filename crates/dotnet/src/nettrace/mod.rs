//! Streaming `.nettrace` reader: formats V4/V5 (FastSerialization objects, what .NET Core 3.0 to
//! .NET 9 write) and V6 (plain blocks).
//!
//! [`NetTraceReader::next_event`] returns one event at a time. Metadata, stack, thread and
//! sequence-point blocks are consumed on the way: an event comes back with its metadata and its
//! stack already resolved (stack ids are interned per sequence-point region, so they are resolved
//! when the event is read, never later). Memory is bounded by one block plus the current region's
//! stacks plus the metadata table.

mod bytes;
mod metadata;
mod stream;

use std::collections::HashMap;
use std::io::Read;

use crate::error::{ErrorKind, NetTraceError};
pub(crate) use bytes::Bytes;
use bytes::Result;
pub use metadata::{EventMetadata, FieldInfo};
use stream::{Block, BlockKind, Framing};

/// Facts about the whole trace, from its Trace object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceInfo {
    /// Format version: 4 and 5 (FastSerialization framing) or 6.
    pub format_version: u32,
    /// Wall-clock time of `sync_time_qpc`, as `[year, month, day_of_week, day, hour, minute,
    /// second, millisecond]` in UTC.
    pub sync_time_utc: [u16; 8],
    /// Timestamp (ticks) taken at `sync_time_utc`.
    pub sync_time_qpc: u64,
    /// Ticks per second of event timestamps.
    pub qpc_frequency: u64,
    /// Pointer size of the traced process in bytes (4 or 8); stack IPs use this size.
    pub pointer_size: u8,
    /// The traced process id (0 when unknown).
    pub process_id: u32,
    /// Logical processors of the machine.
    pub processor_count: u32,
    /// The runtime's CPU sampling period in nanoseconds (0 when not given).
    pub sampling_period_ns: u32,
    /// Free-form key/value pairs (format V6).
    pub key_values: Vec<(String, String)>,
}

impl TraceInfo {
    /// The sync time as nanoseconds since the Unix epoch, if the date is plausible.
    pub fn sync_time_unix_ns(&self) -> Option<u64> {
        let [year, month, _, day, hour, minute, second, ms] = self.sync_time_utc;
        if !(1970..=9999).contains(&year) || !(1..=12).contains(&month) || !(1..=31).contains(&day)
        {
            return None;
        }
        let days = days_from_civil(i64::from(year), i64::from(month), i64::from(day));
        let secs =
            days * 86_400 + i64::from(hour) * 3600 + i64::from(minute) * 60 + i64::from(second);
        u64::try_from(secs)
            .ok()?
            .checked_mul(1_000_000_000)?
            .checked_add(u64::from(ms) * 1_000_000)
    }

    /// Converts an event timestamp (ticks) to nanoseconds since the Unix epoch (or, when the sync
    /// date is unusable, to nanoseconds since `sync_time_qpc`). Saturates instead of overflowing.
    pub fn timestamp_ns(&self, ticks: u64) -> u64 {
        let base = i128::from(self.sync_time_unix_ns().unwrap_or(0));
        let freq = i128::from(self.qpc_frequency.max(1));
        let delta = i128::from(ticks) - i128::from(self.sync_time_qpc);
        let ns = base + delta * 1_000_000_000 / freq;
        ns.clamp(0, i128::from(u64::MAX)) as u64
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

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

/// Header fields decoded so far in the current block (compressed headers are deltas against them).
#[derive(Debug, Clone, Copy, Default)]
struct HeaderState {
    metadata_id: u32,
    sequence: u32,
    capture_thread: u64,
    processor: u32,
    thread: u64,
    stack_id: u32,
    timestamp: u64,
    payload_size: u32,
}

/// A decoded event header, with the payload's place in the current block.
#[derive(Debug, Clone, Copy)]
struct Decoded {
    h: HeaderState,
    sorted: bool,
    payload: (usize, usize),
    offset: u64,
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

fn parse_trace(block: &Block, format_version: u32) -> Result<TraceInfo> {
    let mut b = Bytes::new(&block.data, block.base);
    let mut info = TraceInfo {
        format_version,
        ..TraceInfo::default()
    };
    for v in &mut info.sync_time_utc {
        *v = b.u16("trace sync time")?;
    }
    info.sync_time_qpc = b.u64("trace sync timestamp")?;
    info.qpc_frequency = b.u64("trace timestamp frequency")?;
    let pointer_size = b.u32("trace pointer size")?;
    if pointer_size != 4 && pointer_size != 8 {
        return Err(b.malformed(format!("pointer size {pointer_size} (expected 4 or 8)")));
    }
    info.pointer_size = pointer_size as u8;
    if format_version >= 6 {
        let count = b.u32("trace key/value count")?;
        for _ in 0..count {
            let k = b.utf8_varlen("trace key")?;
            let v = b.utf8_varlen("trace value")?;
            let number = v.parse::<u32>().ok();
            match k.as_str() {
                "ProcessId" => info.process_id = number.unwrap_or(0),
                "HardwareThreadCount" => info.processor_count = number.unwrap_or(0),
                "ExpectedCPUSamplingRate" => info.sampling_period_ns = number.unwrap_or(0),
                _ => {}
            }
            info.key_values.push((k, v));
        }
    } else {
        info.process_id = b.u32("trace process id")?;
        info.processor_count = b.u32("trace processor count")?;
        info.sampling_period_ns = b.u32("trace sampling rate")?;
    }
    Ok(info)
}

/// Decodes one event header and locates its payload. `block_pos` is the cursor's start within the
/// block, so the payload range can be given in block coordinates.
fn decode_header(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_time_converts_to_unix() {
        let info = TraceInfo {
            sync_time_utc: [2021, 6, 3, 9, 9, 48, 25, 902],
            sync_time_qpc: 1000,
            qpc_frequency: 10_000_000,
            ..TraceInfo::default()
        };
        // 2021-06-09T09:48:25.902Z
        assert_eq!(info.sync_time_unix_ns(), Some(1_623_232_105_902_000_000));
        assert_eq!(info.timestamp_ns(1010), 1_623_232_105_902_001_000);
        assert_eq!(info.timestamp_ns(0), 1_623_232_105_901_900_000);
    }
}
