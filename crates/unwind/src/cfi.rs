//! An index of one CFI section's FDEs (`.eh_frame` or `.debug_frame`), built once when a module
//! loads: which addresses an FDE covers and where that FDE lies in the section; and, for each
//! FDE the first time an address in it is looked up, which of its rows framehop cannot evaluate
//! exactly.
//!
//! framehop tracks only rip, rsp and rbp, and when a row needs anything else (a CFA based on rbx,
//! a CFA expression, rbp restored from another register, …) it silently falls back to a
//! frame-pointer walk. Every row an unwind reaches is therefore classified here ([`RowClass`]):
//! rows framehop turns into one of its exact rules go to framehop; rows it cannot encode that
//! still need only rip, rsp and rbp (a CFA beyond framehop's reach: rustc's driver has a 527 KiB
//! frame) go to the evaluator ([`crate::full`]) for that one frame; all others to the
//! full-register evaluator, from the leaf. A row that cannot be parsed counts as "not exact" too,
//! so that evaluator reports it instead of framehop guessing.
//!
//! Classifying is per FDE and lazy: a large binary has hundreds of thousands of FDEs, of which a
//! recording reaches a few thousand, and reading every row at load took most of a module's load
//! time. Each FDE's outcome is one byte ([`CfiIndex::heap_bytes`] counts them); the few FDEs
//! with rows framehop cannot encode keep those rows' ranges in a map.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EndianSlice, LittleEndian, RegisterRule, UnwindContext,
    UnwindSection, UnwindTableRow, X86_64,
};

/// One FDE: the link-time address range it covers and its offset in the section.
#[derive(Debug, Clone, Copy)]
struct Fde {
    start: u64,
    end: u64,
    offset: usize,
}

/// The longest CFI gap taken for the child's side of `clone`/`clone3` (glibc's is 10 bytes:
/// `syscall`, `test`, `jl`, `je`, `ret`).
pub const CLONE_GAP: u64 = 16;

/// How the unwinder may evaluate the CFI row at an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowClass {
    /// framehop encodes it exactly.
    Exact,
    /// framehop cannot encode it, but it needs only rip, rsp and rbp: the evaluator unwinds
    /// that one frame in the fast walk.
    FrameRegistersOnly,
    /// It needs registers framehop does not track (or could not be parsed): only the
    /// full-register evaluator may unwind it.
    FullRegisters,
}

/// A run of an FDE's rows that are not [`RowClass::Exact`]: start, end, and their class.
type InexactRows = (u64, u64, RowClass);

/// An FDE's classification byte: not yet classified (0), or `CLASSIFIED` with the others.
const CLASSIFIED: u8 = 1;
/// Its first row marks the return address undefined: a thread's first frame (e.g. glibc's
/// `thread_start` inside `clone3`).
const OUTERMOST: u8 = 2;
/// Some of its rows are not [`RowClass::Exact`]: their ranges are in [`CfiIndex::inexact`].
const INEXACT: u8 = 4;

/// The FDEs of one section, sorted by start address, and what is known of their rows.
#[derive(Debug, Default)]
pub struct CfiIndex {
    fdes: Vec<Fde>,
    /// One classification byte per FDE (same order), written once when it is first looked up.
    classes: Vec<AtomicU8>,
    /// For FDEs with `INEXACT` rows: each such row's range and class, by FDE position.
    inexact: Mutex<HashMap<usize, Box<[InexactRows]>>>,
    /// Addresses past a nested FDE's end, inside the FDE around it (see [`CfiIndex::build`]).
    past_nested: Vec<(u64, u64)>,
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
                // The caller of a signal trampoline is an interrupted instruction, which framehop
                // would treat as a return address.
                index.signal.push((start, end));
            }
        }
        index.fdes.sort_unstable_by_key(|f| (f.start, f.end));
        // Where FDEs overlap, an address past a nested FDE's end is covered only by the outer
        // one, while framehop's lookup (the last FDE starting at or before the address) finds
        // the nested one and falls back to frame pointers: those addresses go the full way.
        let mut reach = 0;
        for f in &index.fdes {
            if reach > f.end {
                index.past_nested.push((f.end, reach));
            }
            reach = reach.max(f.end);
        }
        index.past_nested.sort_unstable();
        index.signal.sort_unstable();
        index.classes = (0..index.fdes.len()).map(|_| AtomicU8::new(0)).collect();
        index
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
        if in_ranges(&self.past_nested, svma) || in_ranges(&self.signal, svma) {
            return Some(RowClass::FullRegisters);
        }
        if self.class_of(i, section, bases) & INEXACT == 0 {
            return Some(RowClass::Exact);
        }
        let inexact = self.inexact.lock().unwrap_or_else(|e| e.into_inner());
        let class = inexact
            .get(&i)
            .and_then(|rows| rows.iter().find(|r| r.0 <= svma && svma < r.1))
            .map_or(RowClass::Exact, |r| r.2);
        Some(class)
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

    /// The FDE start addresses, sorted.
    pub fn starts(&self) -> Vec<u64> {
        self.fdes.iter().map(|f| f.start).collect()
    }

    /// Number of FDEs.
    pub fn len(&self) -> usize {
        self.fdes.len()
    }

    /// Memory the index holds on the heap, in bytes, when built (the ranges of rows found
    /// inexact later are few: a handful of FDEs a binary).
    pub fn heap_bytes(&self) -> usize {
        self.fdes.capacity() * std::mem::size_of::<Fde>()
            + self.classes.capacity()
            + (self.past_nested.capacity() + self.signal.capacity()) * 16
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

    /// Position of the FDE covering `svma` (the latest-starting one when FDEs nest).
    fn fde_index_at(&self, svma: u64) -> Option<usize> {
        // Ranges may nest or overlap (rare); check the few that start at or before `svma`.
        let i = self.fdes.partition_point(|f| f.start <= svma);
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
        let mut ranges = self.past_nested.clone();
        ranges.extend_from_slice(&self.signal);
        for i in 0..self.fdes.len() {
            if self.class_of(i, section, bases) & INEXACT == 0 {
                continue;
            }
            let inexact = self.inexact.lock().unwrap_or_else(|e| e.into_inner());
            for &(start, end, class) in inexact.get(&i).into_iter().flatten() {
                if class == RowClass::FullRegisters {
                    ranges.push((start, end));
                }
            }
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
            let mut inexact = self.inexact.lock().unwrap_or_else(|e| e.into_inner());
            inexact.insert(i, rows.into_boxed_slice());
        }
        // Two threads classifying one FDE at once store the same outcome.
        byte.store(class, Ordering::Release);
        class
    }
}

/// Reads FDE `f`'s rows: its classification byte and the ranges of its rows that are not
/// [`RowClass::Exact`] (the whole FDE when its rows cannot be read).
fn classify_rows<'a, S>(section: &S, bases: &BaseAddresses, f: Fde) -> (u8, Vec<InexactRows>)
where
    S: UnwindSection<Slice<'a>>,
{
    let unreadable = (
        CLASSIFIED | INEXACT,
        vec![(f.start, f.end, RowClass::FullRegisters)],
    );
    let Ok(fde) = section.fde_from_offset(bases, S::Offset::from(f.offset), S::cie_from_offset)
    else {
        return unreadable;
    };
    let mut ctx = UnwindContext::new();
    let Ok(mut table) = fde.rows(section, bases, &mut ctx) else {
        return unreadable;
    };
    let mut class = CLASSIFIED;
    let mut ranges: Vec<InexactRows> = Vec::new();
    let mut first_row = true;
    loop {
        match table.next_row() {
            Ok(Some(row)) => {
                if first_row && matches!(row.register(X86_64::RA), Some(RegisterRule::Undefined)) {
                    class |= OUTERMOST;
                }
                first_row = false;
                if framehop_exact(row) {
                    continue;
                }
                let kind = if needs_frame_registers_only(row) {
                    RowClass::FrameRegistersOnly
                } else {
                    RowClass::FullRegisters
                };
                match ranges.last_mut() {
                    Some(last) if last.1 == row.start_address() && last.2 == kind => {
                        last.1 = row.end_address();
                    }
                    _ => ranges.push((row.start_address(), row.end_address(), kind)),
                }
            }
            Ok(None) => break,
            Err(_) => {
                ranges.clear();
                ranges.push((f.start, f.end, RowClass::FullRegisters));
                break;
            }
        }
    }
    if !ranges.is_empty() {
        class |= INEXACT;
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

/// Whether framehop turns this row into one of its exact (cacheable) rules: the return address
/// at CFA-8 or undefined, the CFA at rsp+8n, and rbp kept or saved at CFA+8n; or the standard
/// frame-pointer frame (CFA = rbp+16, rbp at CFA-16). Anything else framehop either evaluates
/// with only rip/rsp/rbp known or replaces by a frame-pointer guess.
pub fn framehop_exact<T: gimli::ReaderOffset, S: gimli::UnwindContextStorage<T>>(
    row: &UnwindTableRow<T, S>,
) -> bool {
    match row.register(X86_64::RA) {
        Some(RegisterRule::Undefined) => return true,
        Some(RegisterRule::Offset(-8)) => {}
        _ => return false,
    }
    let bp = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue) => None,
        Some(RegisterRule::Offset(o)) => Some(o),
        Some(_) => return false,
    };
    match *row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } if register == X86_64::RSP => {
            let fits = offset >= 0 && offset % 8 == 0 && offset / 8 <= i64::from(u16::MAX);
            fits && bp.is_none_or(|o| {
                let at = offset + o;
                at % 8 == 0 && i16::try_from(at / 8).is_ok()
            })
        }
        CfaRule::RegisterAndOffset { register, offset } if register == X86_64::RBP => {
            offset == 16 && bp == Some(-16)
        }
        _ => false,
    }
}

/// Whether a row framehop does not encode needs only rip, rsp and rbp: the return address at
/// CFA-8, the CFA at rsp or rbp plus an offset, rbp kept or saved at an offset from the CFA.
/// (Rules for other registers only say where their values are; the walk does not need them.)
fn needs_frame_registers_only<T: gimli::ReaderOffset, S: gimli::UnwindContextStorage<T>>(
    row: &UnwindTableRow<T, S>,
) -> bool {
    let ra_at_cfa = matches!(row.register(X86_64::RA), Some(RegisterRule::Offset(-8)));
    let bp_simple = matches!(
        row.register(X86_64::RBP),
        None | Some(RegisterRule::SameValue) | Some(RegisterRule::Offset(_))
    );
    let cfa_simple = matches!(*row.cfa(),
        CfaRule::RegisterAndOffset { register, .. } if register == X86_64::RSP || register == X86_64::RBP);
    ra_at_cfa && bp_simple && cfa_simple
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

        fn needs_frame_registers_only(&self, svma: u64) -> bool {
            self.idx.row_class(&self.section, &self.bases, svma)
                == Some(RowClass::FrameRegistersOnly)
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
    fn rows_framehop_cannot_evaluate_are_marked() {
        let bytes = eh_frame(&[
            // A plain frame-pointer function: exact throughout.
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
            // A CFA offset framehop would round, and one past its reach (a 600 KB frame): the
            // evaluator unwinds them from rip, rsp and rbp alone.
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
        assert!(!idx.needs_full_registers(0x1304) && idx.needs_frame_registers_only(0x1304));
        assert!(!idx.needs_frame_registers_only(0x1303));
        assert!(!idx.needs_frame_registers_only(0x140b));
        assert!(!idx.needs_full_registers(0x140c) && idx.needs_frame_registers_only(0x140c));
        assert!(!idx.needs_frame_registers_only(0x1204) && !idx.needs_frame_registers_only(0x1110));
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
        assert_eq!(idx.inexact.lock().expect("not poisoned").len(), 1);
    }

    #[test]
    fn addresses_past_a_nested_fde_go_the_full_way() {
        // framehop looks up the last FDE starting at or before an address; past the nested FDE's
        // end that one does not cover it, and framehop would guess frame pointers.
        let bytes = eh_frame_at(&[(0x1000, 0x100, vec![]), (0x1010, 0x10, vec![])]);
        let idx = index(&bytes);
        assert_eq!(idx.full_register_ranges(), [(0x1020, 0x1100)]);
        assert!(idx.covers(0x1050) && idx.needs_full_registers(0x1050));
        assert!(!idx.needs_full_registers(0x1018) && !idx.needs_full_registers(0x1008));
    }
}
