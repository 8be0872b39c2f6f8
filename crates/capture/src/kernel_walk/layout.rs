//! The BPF program's map layouts (`crates/capture/bpf/stack_walk.bpf.c`), mirrored field for
//! field.

use rootline_unwind::kernel_rows::{KernelRow, RowKind};

/// Mappings per process the program searches (its `MAX_MAPPINGS`).
pub(super) const MAX_MAPPINGS: usize = 512;
/// `struct mapping.kind` of a mapping whose rows are in the table.
pub(super) const MAPPING_TABLE: u32 = RowKind::Rsp as u32;
/// `struct mapping.kind` of a mapping walked by frame pointers throughout (`ROW_FP`).
pub(super) const MAPPING_FRAME_POINTERS: u32 = 6;
/// `struct mapping.kind` of a mapping without rules: the walk ends there.
pub(super) const MAPPING_NONE: u32 = RowKind::None as u32;
/// `struct mapping.kind` of a mapping whose binary is still being read (`ROW_PENDING`): the
/// walk ends there and sends the stack above it (`struct config.dump_bytes`).
pub(super) const MAPPING_PENDING: u32 = 7;
/// `struct mapping.flags` of a mapping whose code may change after a sample (JIT code): the
/// walk sends the 8 code bytes before each return address into it (`MAPPING_CODE_MOVES`).
pub(super) const MAPPING_CODE_MOVES: u32 = 1;
/// Bytes of one CPU's `struct row_memo` (`ROW_MEMO` entries of 32 bytes).
pub(super) const ROW_MEMO_BYTES: usize = 512 * 32;

/// `struct row` (plain bytes: kept rows are read from a file straight into the table).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct Row {
    pub pc: u32,
    pub cfa: i32,
    pub rbp: i16,
    pub kind: u8,
    pub arg: u8,
    pub pad: u32,
}

impl Row {
    /// The row for `r`, its address relative to `base`.
    pub fn new(r: &KernelRow, base: u64) -> Row {
        Row {
            pc: u32::try_from(r.svma - base).unwrap_or(u32::MAX),
            cfa: r.cfa_offset,
            rbp: r.rbp_offset,
            kind: r.kind as u8,
            arg: r.arg,
            pad: 0,
        }
    }
}

/// `struct mapping`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Mapping {
    pub start: u64,
    pub end: u64,
    pub bias: u64,
    pub base: u64,
    pub row_start: u32,
    pub row_count: u32,
    pub kind: u32,
    pub flags: u32,
    /// Entries of the rows' page index, in the table right after the rows (0: none).
    pub page_count: u32,
    /// Bits of a relative address below its page number in that index.
    pub page_shift: u32,
}

/// `struct proc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct Proc {
    pub count: u32,
    /// Different at every write of any process's entry: the walk's row memo holds for one
    /// entry as written. 0 only once the memo is off (never looked up there; see
    /// `KernelWalk::next_generation`).
    pub generation: u32,
    pub m: [Mapping; MAX_MAPPINGS],
}

impl Default for Proc {
    fn default() -> Proc {
        Proc {
            count: 0,
            generation: 0,
            m: [Mapping::default(); MAX_MAPPINGS],
        }
    }
}

/// `struct config`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Config {
    pub copy_bytes: u32,
    pub max_frames: u32,
    pub dump_bytes: u32,
    pub dump_rate: u32,
}

/// `struct task_walk`, a thread's walk going on as task work: only ever removed from user space,
/// so held as its bytes (taking the map checks their count against the object's).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub(super) struct TaskWalkSlot(pub [u8; TASK_WALK_BYTES]);

/// Bytes of `struct task_walk`.
pub(super) const TASK_WALK_BYTES: usize = 4360;

// SAFETY: plain bytes, any value is valid.
unsafe impl aya::Pod for TaskWalkSlot {}

/// `struct stats` (one per CPU).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Counters {
    pub walks: u64,
    pub frames: u64,
    pub chunks: u64,
    pub lost_chunks: u64,
}

/// `struct chunk_header`, as read from the ring buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ChunkHeader {
    pub time: u64,
    pub pid: u32,
    pub tid: u32,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub seq: u32,
    pub words: u16,
    pub last: bool,
    pub stop: u8,
    pub frames: u32,
    /// The words are values of consecutive stack words from `end_sp` (a dump), not pairs.
    pub span: bool,
    pub end_ip: u64,
    pub end_sp: u64,
}

/// Bytes of `struct chunk_header`.
pub(super) const CHUNK_HEADER_BYTES: usize = 72;

impl ChunkHeader {
    /// Reads a chunk's header; None when `b` is too short.
    pub fn parse(b: &[u8]) -> Option<ChunkHeader> {
        let u64_at = |o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
        let u32_at = |o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
        Some(ChunkHeader {
            time: u64_at(0)?,
            pid: u32_at(8)?,
            tid: u32_at(12)?,
            ip: u64_at(16)?,
            sp: u64_at(24)?,
            bp: u64_at(32)?,
            seq: u32_at(40)?,
            words: u16::from_le_bytes(b.get(44..46)?.try_into().ok()?),
            last: *b.get(46)? != 0,
            stop: *b.get(47)?,
            frames: u32_at(48)?,
            span: u32_at(52)? != 0,
            end_ip: u64_at(56)?,
            end_sp: u64_at(64)?,
        })
    }
}

// SAFETY: plain `repr(C)` structs of integers with no padding the kernel could not fill (the
// explicit `pad` fields are zero), so any bytes are valid values and they can cross the map
// boundary as bytes.
unsafe impl aya::Pod for Proc {}
// SAFETY: as above.
unsafe impl aya::Pod for Config {}
// SAFETY: as above.
unsafe impl aya::Pod for Counters {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_bpf_programs() {
        assert_eq!(std::mem::size_of::<Row>(), 16);
        assert_eq!(std::mem::size_of::<Mapping>(), 56);
        assert_eq!(std::mem::size_of::<Proc>(), 8 + 56 * MAX_MAPPINGS);
        assert_eq!(std::mem::size_of::<Counters>(), 32);
        assert_eq!(std::mem::size_of::<Config>(), 16);
        assert_eq!(std::mem::size_of::<TaskWalkSlot>(), TASK_WALK_BYTES);
    }

    #[test]
    fn a_header_reads_back() {
        let mut b = vec![0u8; CHUNK_HEADER_BYTES];
        b[0..8].copy_from_slice(&7u64.to_le_bytes());
        b[12..16].copy_from_slice(&42u32.to_le_bytes());
        b[44..46].copy_from_slice(&3u16.to_le_bytes());
        b[46] = 1;
        b[47] = 2;
        let h = ChunkHeader::parse(&b).expect("parses");
        assert_eq!(
            (h.time, h.tid, h.words, h.last, h.stop),
            (7, 42, 3, true, 2)
        );
        assert!(!h.span);
        b[52] = 1;
        assert!(ChunkHeader::parse(&b).expect("parses").span);
        assert!(ChunkHeader::parse(&b[..40]).is_none());
    }
}
