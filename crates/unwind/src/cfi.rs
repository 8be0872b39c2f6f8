//! An index of one CFI section's FDEs (`.eh_frame` or `.debug_frame`), built once when a module
//! loads: which addresses an FDE covers and where that FDE lies in the section; and, for each
//! FDE the first time an address in it is looked up, which of its rows need more than rip, rsp
//! and rbp.
//!
//! The fast walk tracks only rip, rsp and rbp (a row of that shape runs as a
//! [`crate::frame_rule::FrameRule`]). A row that needs anything else (a CFA based on rbx, a CFA
//! expression, rbp restored from another register, …) must go to the full-register evaluator
//! ([`crate::full`]), from the leaf ([`RowClass`]). A row that cannot be parsed needs full
//! registers too, so that the evaluator reports it instead of the fast walk guessing. The walk
//! itself finds the same answer in the rules it keeps per FDE ([`crate::fde_rules`]: a row
//! without a frame rule is one that needs full registers); the classification here serves the
//! `clone` gap (an FDE that starts a thread), diagnostics and tests.
//!
//! Classifying is per FDE and lazy: a large binary has hundreds of thousands of FDEs, of which a
//! recording reaches a few thousand, and reading every row at load took most of a module's load
//! time. Each FDE's outcome is one byte ([`CfiIndex::heap_bytes`] counts them); the few FDEs
//! with rows that need full registers keep those rows' ranges in a map.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};

use gimli::{
    BaseAddresses, CieOrFde, EndianSlice, LittleEndian, RegisterRule, UnwindContext, UnwindSection,
    X86_64,
};

use crate::frame_rule::FrameRule;

/// One FDE: the link-time address range it covers and its offset in the section.
#[derive(Debug, Clone, Copy)]
struct Fde {
    start: u64,
    end: u64,
    offset: usize,
}

/// Bytes of code one entry of [`CfiIndex`]'s page table covers.
const PAGE: u64 = 4096;

/// The longest CFI gap taken for the child's side of `clone`/`clone3` (glibc's is 10 bytes:
/// `syscall`, `test`, `jl`, `je`, `ret`).
pub const CLONE_GAP: u64 = 16;

/// How the unwinder may evaluate the CFI row at an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowClass {
    /// It needs only rip, rsp and rbp (or marks the return address undefined): the fast walk
    /// runs it.
    FrameRegisters,
    /// It needs registers the fast walk does not track (or could not be parsed): only the
    /// full-register evaluator may unwind it.
    FullRegisters,
}

/// A run of an FDE's rows that need full registers: start and end.
type FullRows = (u64, u64);

/// An FDE's classification byte: not yet classified (0), or `CLASSIFIED` with the others.
const CLASSIFIED: u8 = 1;
/// Its first row marks the return address undefined: a thread's first frame (e.g. glibc's
/// `thread_start` inside `clone3`).
const OUTERMOST: u8 = 2;
/// Some of its rows need full registers: their ranges are in [`CfiIndex::full_rows`].
const FULL_ROWS: u8 = 4;

/// What an FDE index is made of, to be kept (e.g. on disk with the binary's layout) and given
/// back to [`CfiIndex::from_parts`] instead of reading every FDE's header again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CfiIndexParts {
    /// Each FDE's covered range and its offset in its section: `(start, end, offset)`.
    pub fdes: Vec<(u64, u64, u64)>,
    /// The ranges of FDEs that are signal trampolines.
    pub signal: Vec<(u64, u64)>,
}

/// The FDEs of one section, sorted by start address, and what is known of their rows.
#[derive(Debug, Default)]
pub struct CfiIndex {
    fdes: Vec<Fde>,
    /// One classification byte per FDE (same order), written once when it is first looked up.
    classes: Vec<AtomicU8>,
    /// For FDEs with `FULL_ROWS`: those rows' ranges, by FDE position.
    full_rows: Mutex<HashMap<usize, Box<[FullRows]>>>,
    /// Where each [`PAGE`] of the covered addresses begins in `fdes`: `pages[p]` FDEs start
    /// below `first_page + p * PAGE`. A lookup searches only its page's FDEs instead of all of
    /// them (hundreds of thousands in a compiler, one cache miss per step of a binary search).
    pages: Vec<u32>,
    /// The address `pages` starts from (the first FDE's start, rounded down to a page).
    first_page: u64,
    signal: Vec<(u64, u64)>,
}

type Slice<'a> = EndianSlice<'a, LittleEndian>;

impl CfiIndex {
    /// Reads every FDE's header in `section`: the ranges they cover and which are signal
    /// trampolines. Their rows are read later, per FDE ([`CfiIndex::row_class`]). A malformed
    /// entry ends the walk; the FDEs read so far stay usable.
    pub fn build<'a, S>(section: &S, bases: &BaseAddresses) -> CfiIndex
    where
        S: UnwindSection<Slice<'a>>,
    {
        let mut index = CfiIndex::default();
        let mut entries = section.entries(bases);
        // FDEs come in long runs sharing one CIE: it is parsed once a run.
        let mut last_cie = None;
        while let Ok(Some(entry)) = entries.next() {
            let CieOrFde::Fde(partial) = entry else {
                continue;
            };
            let Ok(fde) = partial.parse(|section, bases, offset| match &last_cie {
                Some((at, cie)) if *at == offset => Ok(Clone::clone(cie)),
                _ => {
                    let cie = S::cie_from_offset(section, bases, offset)?;
                    last_cie = Some((offset, cie.clone()));
                    Ok(cie)
                }
            }) else {
                continue;
            };
            if fde.len() == 0 {
                continue;
            }
            let (start, end) = (fde.initial_address(), fde.end_address());
            index.fdes.push(Fde {
                start,
                end,
                offset: fde.offset(),
            });
            if fde.is_signal_trampoline() {
                // The caller of a signal trampoline is an interrupted instruction, whose
                // registers all matter: the full-register evaluator unwinds it.
                index.signal.push((start, end));
            }
        }
        index.finish();
        index
    }

    /// The index `parts` describe (as [`CfiIndex::parts`] gave them for the same section). An
    /// offset that does not lead to an FDE only makes that FDE's rows unreadable.
    pub fn from_parts(parts: CfiIndexParts) -> CfiIndex {
        let mut index = CfiIndex {
            fdes: parts
                .fdes
                .into_iter()
                .filter_map(|(start, end, offset)| {
                    Some(Fde {
                        start,
                        end,
                        offset: usize::try_from(offset).ok()?,
                    })
                })
                .collect(),
            signal: parts.signal,
            ..CfiIndex::default()
        };
        index.finish();
        index
    }

    /// What the index is made of.
    pub fn parts(&self) -> CfiIndexParts {
        CfiIndexParts {
            fdes: self
                .fdes
                .iter()
                .map(|f| (f.start, f.end, f.offset as u64))
                .collect(),
            signal: self.signal.clone(),
        }
    }

    /// Sorts the FDEs and the signal ranges, and builds the page table and the classes.
    /// The tables hold no spare capacity: an index read from its section and one made from its
    /// parts take the same memory (both are counted in the module budget).
    fn finish(&mut self) {
        self.fdes.sort_unstable_by_key(|f| (f.start, f.end));
        self.fdes.shrink_to_fit();
        self.signal.sort_unstable();
        self.signal.shrink_to_fit();
        self.index_pages();
        self.pages.shrink_to_fit();
        self.classes = (0..self.fdes.len()).map(|_| AtomicU8::new(0)).collect();
    }

    /// How the row at `svma` may be evaluated (`section` and `bases` are the ones the index was
    /// built from); None when no FDE covers it. The covering FDE's rows are read the first time
    /// one of its addresses is asked for.
    pub fn row_class<'a, S>(
        &self,
        section: &S,
        bases: &BaseAddresses,
        svma: u64,
    ) -> Option<RowClass>
    where
        S: UnwindSection<Slice<'a>>,
    {
        let i = self.fde_index_at(svma)?;
        if in_ranges(&self.signal, svma) {
            return Some(RowClass::FullRegisters);
        }
        if self.class_of(i, section, bases) & FULL_ROWS == 0 {
            return Some(RowClass::FrameRegisters);
        }
        let full_rows = self.full_rows.lock().unwrap_or_else(|e| e.into_inner());
        let full = full_rows
            .get(&i)
            .is_some_and(|rows| rows.iter().any(|r| r.0 <= svma && svma < r.1));
        Some(if full {
            RowClass::FullRegisters
        } else {
            RowClass::FrameRegisters
        })
    }

    /// When `svma` lies in a short gap in the CFI (at most [`CLONE_GAP`] bytes between one FDE's
    /// end and the next one's start) right before an FDE that starts a thread's outermost frame,
    /// the end of the FDE before the gap. That is the shape of glibc's `clone`/`clone3`: the
    /// parent's CFI ends at the system call, because it does not describe the child, and the
    /// child's `thread_start` begins a few instructions later; the instructions between
    /// (`test`, `jl`, `je`, `ret`) do not move the stack pointer.
    pub fn clone_gap<'a, S>(&self, section: &S, bases: &BaseAddresses, svma: u64) -> Option<u64>
    where
        S: UnwindSection<Slice<'a>>,
    {
        if self.covers(svma) {
            return None;
        }
        let i = self.fdes.partition_point(|f| f.start <= svma);
        let prev = self.fdes.get(i.checked_sub(1)?)?;
        let next = self.fdes.get(i)?;
        (prev.end <= svma
            && next.start - prev.end <= CLONE_GAP
            && self.class_of(i, section, bases) & OUTERMOST != 0)
            .then_some(prev.end)
    }

    /// Whether `svma` lies in a signal trampoline (an FDE whose CIE has the `S` augmentation,
    /// e.g. glibc's `__restore_rt`): its caller frame was interrupted, not calling.
    pub fn is_signal_trampoline(&self, svma: u64) -> bool {
        in_ranges(&self.signal, svma)
    }

    /// Number of FDEs.
    pub fn len(&self) -> usize {
        self.fdes.len()
    }

    /// Memory the index holds on the heap, in bytes, when built (the ranges of rows found
    /// to need full registers later are few: a handful of FDEs a binary).
    pub fn heap_bytes(&self) -> usize {
        self.fdes.capacity() * std::mem::size_of::<Fde>()
            + self.classes.capacity()
            + self.pages.capacity() * 4
            + self.signal.capacity() * 16
    }

    /// Whether the section has no FDE.
    pub fn is_empty(&self) -> bool {
        self.fdes.is_empty()
    }

    /// Whether an FDE covers the link-time address `svma`.
    pub fn covers(&self, svma: u64) -> bool {
        self.fde_index_at(svma).is_some()
    }

    /// Section offset of the FDE covering `svma` (the latest-starting one when FDEs nest).
    pub fn fde_at(&self, svma: u64) -> Option<usize> {
        self.fde_index_at(svma).map(|i| self.fdes[i].offset)
    }

    /// Link-time address where the FDE covering `svma` starts (the one [`CfiIndex::fde_at`]
    /// finds).
    pub fn fde_start_at(&self, svma: u64) -> Option<u64> {
        self.fde_index_at(svma).map(|i| self.fdes[i].start)
    }

    /// Fills the page table (see [`CfiIndex::pages`]); left empty when the FDEs span more
    /// pages than there are FDEs (sparse code), where a plain binary search costs as little.
    fn index_pages(&mut self) {
        let (Some(first), Some(last)) = (self.fdes.first(), self.fdes.last()) else {
            return;
        };
        self.first_page = first.start - first.start % PAGE;
        let count = (last.start - self.first_page) / PAGE + 2;
        if count > self.fdes.len() as u64 || u32::try_from(self.fdes.len()).is_err() {
            return;
        }
        let mut pages = Vec::with_capacity(count as usize);
        let mut i = 0;
        for p in 0..count {
            let page_start = self.first_page + p * PAGE;
            while i < self.fdes.len() && self.fdes[i].start < page_start {
                i += 1;
            }
            pages.push(i as u32);
        }
        self.pages = pages;
    }

    /// How many FDEs start at or before `svma` (a binary search, within its page when the page
    /// table has one).
    fn starting_at_or_before(&self, svma: u64) -> usize {
        let page = svma
            .checked_sub(self.first_page)
            .map(|offset| offset / PAGE)
            .and_then(|p| usize::try_from(p).ok());
        let bounds = page.and_then(|p| Some((*self.pages.get(p)?, *self.pages.get(p + 1)?)));
        match bounds {
            Some((lo, hi)) => {
                let (lo, hi) = (lo as usize, hi as usize);
                lo + self.fdes[lo..hi].partition_point(|f| f.start <= svma)
            }
            None => self.fdes.partition_point(|f| f.start <= svma),
        }
    }

    /// Position of the FDE covering `svma` (the latest-starting one when FDEs nest).
    fn fde_index_at(&self, svma: u64) -> Option<usize> {
        // Ranges may nest or overlap (rare); check the few that start at or before `svma`.
        let i = self.starting_at_or_before(svma);
        (i.saturating_sub(4)..i)
            .rev()
            .find(|&j| svma < self.fdes[j].end)
    }

    /// Address ranges whose rows need full-register evaluation (merged where adjacent). Reads
    /// every FDE's rows: for diagnostics and tests, not for unwinding.
    pub fn full_register_ranges<'a, S>(&self, section: &S, bases: &BaseAddresses) -> Vec<(u64, u64)>
    where
        S: UnwindSection<Slice<'a>>,
    {
        let mut ranges = self.signal.clone();
        for i in 0..self.fdes.len() {
            if self.class_of(i, section, bases) & FULL_ROWS == 0 {
                continue;
            }
            let full_rows = self.full_rows.lock().unwrap_or_else(|e| e.into_inner());
            ranges.extend(full_rows.get(&i).into_iter().flatten());
        }
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (start, end) in ranges {
            push_range(&mut merged, start, end);
        }
        merged
    }

    /// FDE `i`'s classification byte, reading its rows the first time.
    fn class_of<'a, S>(&self, i: usize, section: &S, bases: &BaseAddresses) -> u8
    where
        S: UnwindSection<Slice<'a>>,
    {
        let Some(byte) = self.classes.get(i) else {
            return CLASSIFIED;
        };
        let known = byte.load(Ordering::Acquire);
        if known & CLASSIFIED != 0 {
            return known;
        }
        let f = self.fdes[i];
        let (class, rows) = classify_rows(section, bases, f);
        if !rows.is_empty() {
            let mut full_rows = self.full_rows.lock().unwrap_or_else(|e| e.into_inner());
            full_rows.insert(i, rows.into_boxed_slice());
        }
        // Two threads classifying one FDE at once store the same outcome.
        byte.store(class, Ordering::Release);
        class
    }
}

/// Reads FDE `f`'s rows: its classification byte and the ranges of its rows that need full
/// registers (the whole FDE when its rows cannot be read).
fn classify_rows<'a, S>(section: &S, bases: &BaseAddresses, f: Fde) -> (u8, Vec<FullRows>)
where
    S: UnwindSection<Slice<'a>>,
{
    let unreadable = (CLASSIFIED | FULL_ROWS, vec![(f.start, f.end)]);
    let Ok(fde) = section.fde_from_offset(bases, S::Offset::from(f.offset), S::cie_from_offset)
    else {
        return unreadable;
    };
    let mut ctx = UnwindContext::new();
    let Ok(mut table) = fde.rows(section, bases, &mut ctx) else {
        return unreadable;
    };
    let mut class = CLASSIFIED;
    let mut ranges: Vec<FullRows> = Vec::new();
    let mut first_row = true;
    loop {
        match table.next_row() {
            Ok(Some(row)) => {
                if first_row && matches!(row.register(X86_64::RA), Some(RegisterRule::Undefined)) {
                    class |= OUTERMOST;
                }
                first_row = false;
                if FrameRule::of_row(row).is_some() {
                    continue;
                }
                match ranges.last_mut() {
                    Some(last) if last.1 == row.start_address() => last.1 = row.end_address(),
                    _ => ranges.push((row.start_address(), row.end_address())),
                }
            }
            Ok(None) => break,
            Err(_) => {
                ranges.clear();
                ranges.push((f.start, f.end));
                break;
            }
        }
    }
    if !ranges.is_empty() {
        class |= FULL_ROWS;
    }
    (class, ranges)
}

/// Whether one of `ranges` (sorted by start) holds `svma`. Ranges may nest or overlap (rare);
/// only the few that start at or before `svma` are checked.
fn in_ranges(ranges: &[(u64, u64)], svma: u64) -> bool {
    let i = ranges.partition_point(|r| r.0 <= svma);
    ranges[..i].iter().rev().take(4).any(|r| svma < r.1)
}

/// Appends `start..end`, merging it into the previous range when they touch or overlap.
fn push_range(ranges: &mut Vec<(u64, u64)>, start: u64, end: u64) {
    if let Some(last) = ranges.last_mut()
        && last.1 >= start
    {
        last.1 = last.1.max(end);
        return;
    }
    ranges.push((start, end));
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use gimli::write::{
        Address, CallFrameInstruction as I, CommonInformationEntry, EhFrame, EndianVec,
        FrameDescriptionEntry, FrameTable,
    };
    use gimli::{Encoding, Format};

    /// An `.eh_frame` with one FDE per instruction list (each 0x100 bytes from 0x1000 + 0x100·i,
    /// instructions at offsets 4, 8, …).
    fn eh_frame(fdes: &[Vec<I>]) -> Vec<u8> {
        let placed: Vec<(u64, u64, Vec<I>)> = fdes
            .iter()
            .enumerate()
            .map(|(i, v)| (0x1000 + 0x100 * i as u64, 0x100, v.clone()))
            .collect();
        eh_frame_at(&placed)
    }

    /// A test FDE: start, length, and each instruction with its offset from the start.
    pub(crate) type TestFde = (u64, u64, Vec<(u32, I)>);

    /// An `.eh_frame` with FDEs at the given (start, length), instructions at offsets 4, 8, ….
    fn eh_frame_at(fdes: &[(u64, u64, Vec<I>)]) -> Vec<u8> {
        let placed: Vec<TestFde> = fdes
            .iter()
            .map(|(start, len, instrs)| {
                let rows = (4..).step_by(4).zip(instrs.iter().cloned()).collect();
                (*start, *len, rows)
            })
            .collect();
        eh_frame_rows(&placed)
    }

    /// An `.eh_frame` whose CIE has the return address at CFA-8 (CFA = rsp+8), with FDEs at the
    /// given (start, length), each instruction at its offset from the start.
    pub(crate) fn eh_frame_rows(fdes: &[TestFde]) -> Vec<u8> {
        let encoding = Encoding {
            format: Format::Dwarf32,
            version: 1,
            address_size: 8,
        };
        let mut cie = CommonInformationEntry::new(encoding, 1, -8, X86_64::RA);
        cie.add_instruction(I::Cfa(X86_64::RSP, 8));
        cie.add_instruction(I::Offset(X86_64::RA, -8));
        let mut table = FrameTable::default();
        let cie_id = table.add_cie(cie);
        for (start, len, rows) in fdes {
            let mut fde = FrameDescriptionEntry::new(Address::Constant(*start), *len as u32);
            for (offset, ins) in rows {
                fde.add_instruction(*offset, ins.clone());
            }
            table.add_fde(cie_id, fde);
        }
        let mut out = EhFrame(EndianVec::new(LittleEndian));
        table.write_eh_frame(&mut out).expect("writes");
        out.0.into_vec()
    }

    /// An index over a test `.eh_frame`, with its section at hand for the lazy row lookups.
    struct TestIndex<'a> {
        section: gimli::EhFrame<Slice<'a>>,
        bases: BaseAddresses,
        idx: CfiIndex,
    }

    impl TestIndex<'_> {
        fn needs_full_registers(&self, svma: u64) -> bool {
            self.idx.row_class(&self.section, &self.bases, svma) == Some(RowClass::FullRegisters)
        }

        fn full_register_ranges(&self) -> Vec<(u64, u64)> {
            self.idx.full_register_ranges(&self.section, &self.bases)
        }
    }

    impl std::ops::Deref for TestIndex<'_> {
        type Target = CfiIndex;
        fn deref(&self) -> &CfiIndex {
            &self.idx
        }
    }

    fn index(bytes: &[u8]) -> TestIndex<'_> {
        let section = gimli::EhFrame::new(bytes, LittleEndian);
        let bases = BaseAddresses::default().set_eh_frame(0);
        let idx = CfiIndex::build(&section, &bases);
        TestIndex {
            section,
            bases,
            idx,
        }
    }

    #[test]
    fn the_page_table_finds_the_same_fdes_as_a_search_of_all() {
        // Dense runs of small FDEs across page boundaries, a nested one, gaps of whole pages.
        let mut fdes: Vec<(u64, u64, Vec<I>)> = (0..300u64)
            .map(|i| (0x10_0000 + i * 0x30, 0x30, vec![I::CfaOffset(16)]))
            .collect();
        fdes.push((0x10_0040, 0x8, vec![I::CfaOffset(24)]));
        fdes.extend((0..20u64).map(|i| (0x20_0000 + i * 0x1800, 0x1000, vec![])));
        let bytes = eh_frame_at(&fdes);
        let idx = index(&bytes);
        assert!(!idx.pages.is_empty(), "dense FDEs get a page table");
        let mut plain = CfiIndex {
            fdes: idx.fdes.clone(),
            ..CfiIndex::default()
        };
        plain.pages.clear();
        for svma in (0x0f_f000..0x22_0000).step_by(4) {
            assert_eq!(idx.fde_at(svma), plain.fde_at(svma), "at {svma:#x}");
        }
        assert_eq!(
            idx.fde_at(0x10_0044),
            Some(
                idx.fdes
                    .iter()
                    .find(|f| f.start == 0x10_0040)
                    .unwrap()
                    .offset
            ),
            "the nested FDE"
        );
    }

    #[test]
    fn rows_that_need_more_than_rip_rsp_and_rbp_are_marked() {
        let bytes = eh_frame(&[
            // A plain frame-pointer function: rip, rsp and rbp suffice throughout.
            vec![
                I::CfaOffset(16),
                I::Offset(X86_64::RBP, -16),
                I::CfaRegister(X86_64::RBP),
            ],
            // ld.so's trampoline: CFA based on rbx from the second row on.
            vec![
                I::CfaOffset(24),
                I::Offset(X86_64::RBX, -32),
                I::CfaRegister(X86_64::RBX),
            ],
            // rbp restored from another register.
            vec![I::Register(X86_64::RBP, X86_64::RBX)],
            // A CFA offset that is no multiple of 8, and a 600 KB frame: rip, rsp and rbp
            // suffice.
            vec![I::CfaOffset(12)],
            vec![
                I::CfaOffset(16),
                I::Offset(X86_64::RBP, -16),
                I::CfaOffset(600_016),
            ],
        ]);
        let idx = index(&bytes);
        assert_eq!(idx.len(), 5);
        assert!((0x1000..0x1100).all(|a| !idx.needs_full_registers(a)));
        assert!(!idx.needs_full_registers(0x1100 + 11));
        assert!(idx.needs_full_registers(0x1100 + 12));
        assert!(idx.needs_full_registers(0x11ff));
        assert!(!idx.needs_full_registers(0x1203));
        assert!(idx.needs_full_registers(0x1204));
        assert!(!idx.needs_full_registers(0x1303) && !idx.needs_full_registers(0x1304));
        assert!(!idx.needs_full_registers(0x140b) && !idx.needs_full_registers(0x140c));
        assert!(idx.covers(0x14ff) && !idx.covers(0x1500) && !idx.covers(0xfff));
        assert_eq!(
            idx.full_register_ranges(),
            [(0x110c, 0x1200), (0x1204, 0x1300)]
        );
    }

    #[test]
    fn rows_are_read_only_for_the_fdes_looked_up() {
        let bytes = eh_frame(&[
            vec![I::CfaOffset(16)],
            vec![I::CfaRegister(X86_64::RBX)],
            vec![I::CfaOffset(12)],
        ]);
        let idx = index(&bytes);
        let classified = |idx: &TestIndex<'_>| {
            idx.classes
                .iter()
                .map(|c| c.load(Ordering::Relaxed) & CLASSIFIED != 0)
                .collect::<Vec<_>>()
        };
        assert_eq!(classified(&idx), [false, false, false]);
        assert!(idx.needs_full_registers(0x1104));
        assert_eq!(classified(&idx), [false, true, false]);
        // Asked again, the answer comes from what was kept; other FDEs stay unread.
        assert!(idx.needs_full_registers(0x1104) && !idx.needs_full_registers(0x1100));
        assert!(!idx.needs_full_registers(0x1004));
        assert_eq!(classified(&idx), [true, true, false]);
        assert_eq!(idx.full_rows.lock().expect("not poisoned").len(), 1);
    }

    #[test]
    fn addresses_past_a_nested_fde_are_the_outer_fdes() {
        // The last FDE starting at or before 0x1050 is the nested one, which ends at 0x1020.
        let bytes = eh_frame_at(&[(0x1000, 0x100, vec![]), (0x1010, 0x10, vec![])]);
        let idx = index(&bytes);
        let outer = idx.fdes.iter().find(|f| f.start == 0x1000).unwrap().offset;
        let nested = idx.fdes.iter().find(|f| f.start == 0x1010).unwrap().offset;
        assert_eq!(idx.fde_at(0x1050), Some(outer));
        assert_eq!(idx.fde_at(0x1018), Some(nested));
        assert_eq!(idx.fde_at(0x1008), Some(outer));
        assert!(idx.full_register_ranges().is_empty());
        assert!(!idx.needs_full_registers(0x1050) && !idx.needs_full_registers(0x1018));
    }
}
