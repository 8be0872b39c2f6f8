//! CFI compiled for the in-kernel stack walk: one compact row per address range of a binary,
//! saying how to find the frame's CFA (canonical frame address) and where `rbp` was saved.
//!
//! The kernel walk (a BPF program in the capture layer) runs these rows while the sampled
//! thread is stopped, and sends the stack words it read to user space, where this crate's
//! unwinder decides the frames. The rows therefore need not be exact everywhere: where they
//! cannot express a rule (a CFA from another register, a signal frame), the row says
//! [`RowKind::Stop`] and the walk ends there, so the words past it are read no more; they never
//! decide a frame themselves.
//!
//! On x86_64 the return address always lies at CFA-8.

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EndianSlice, LittleEndian, RegisterRule, UnwindContext,
    UnwindSection, UnwindTableRow, X86_64,
};

use crate::sections::UnwindSections;

/// How a row finds its frame's CFA. The values are the BPF program's `enum row_kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RowKind {
    /// No rule covers the address: the walk ends (no unwind information).
    None = 0,
    /// CFA = rsp + offset.
    Rsp = 1,
    /// CFA = rbp + offset.
    Rbp = 2,
    /// A lazy-binding PLT entry: CFA = rsp + 8, plus 8 when `(ip & 15) >= arg`.
    Plt = 3,
    /// The return address is undefined: the thread's outermost frame.
    Root = 4,
    /// A rule the kernel walk does not evaluate (another register, an expression, a signal
    /// frame): the walk ends.
    Stop = 5,
}

/// One row: from `svma` up to the next row's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelRow {
    /// First link-time address the row covers.
    pub svma: u64,
    /// How the CFA is found.
    pub kind: RowKind,
    /// The CFA's offset from rsp or rbp.
    pub cfa_offset: i32,
    /// Where rbp was saved, relative to the CFA (0: rbp keeps its value).
    pub rbp_offset: i16,
    /// The PLT threshold for [`RowKind::Plt`], else 0.
    pub arg: u8,
}

impl KernelRow {
    fn same_rule(&self, other: &KernelRow) -> bool {
        (self.kind, self.cfa_offset, self.rbp_offset, self.arg)
            == (other.kind, other.cfa_offset, other.rbp_offset, other.arg)
    }
}

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// Compiles a binary's CFI into rows sorted by address: `.eh_frame` where it has FDEs, else
/// `.debug_frame`. Adjacent rows with the same rule are merged; gaps between FDEs get a
/// [`RowKind::None`] row. Malformed entries end the walk over the section (the rows so far
/// stay).
pub fn kernel_rows(sections: &UnwindSections) -> Vec<KernelRow> {
    let (eh, debug) = sections.fde_counts();
    let mut rows = Vec::new();
    if eh > 0
        && let Some(section) = sections.eh_frame_section()
    {
        collect(
            &section,
            &sections.cfi_bases(false),
            sections,
            false,
            &mut rows,
        );
    } else if debug > 0
        && let Some(section) = sections.debug_frame_section()
    {
        collect(
            &section,
            &sections.cfi_bases(true),
            sections,
            true,
            &mut rows,
        );
    }
    finish(rows)
}

/// Appends every FDE's rows (and a [`RowKind::None`] row at each FDE's end) to `out`.
fn collect<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    sections: &UnwindSections,
    debug: bool,
    out: &mut Vec<(u64, u64, KernelRow)>,
) where
    S: UnwindSection<Slice<'a>>,
{
    let index = sections.cfi(debug);
    let mut ctx = UnwindContext::new();
    let mut entries = section.entries(bases);
    let mut order = 0u64;
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(S::cie_from_offset) else {
            continue;
        };
        if fde.len() == 0 {
            continue;
        }
        let (start, end) = (fde.initial_address(), fde.end_address());
        order += 1;
        let stop = |svma| KernelRow {
            svma,
            kind: RowKind::Stop,
            cfa_offset: 0,
            rbp_offset: 0,
            arg: 0,
        };
        if index.is_signal_trampoline(start) {
            out.push((start, order, stop(start)));
        } else if let Ok(mut table) = fde.rows(section, bases, &mut ctx) {
            loop {
                match table.next_row() {
                    // A row that covers no address must not stand for the gap after its FDE
                    // (the toolchain's BOLT-built librustc_driver has thousands of FDEs whose
                    // instructions restore a state at the FDE's very end, after its `ret`).
                    Ok(Some(row)) if row.end_address() <= row.start_address() => {}
                    Ok(Some(row)) => {
                        let svma = row.start_address();
                        out.push((svma, order, compile(row, svma, section)));
                    }
                    Ok(None) => break,
                    Err(_) => {
                        out.push((start, order, stop(start)));
                        break;
                    }
                }
            }
        } else {
            out.push((start, order, stop(start)));
        }
        out.push((
            end,
            order,
            KernelRow {
                svma: end,
                kind: RowKind::None,
                cfa_offset: 0,
                rbp_offset: 0,
                arg: 0,
            },
        ));
    }
}

/// Sorts rows by address (at one address, a row that starts code wins over the end of the FDE
/// before it; among FDEs, the later-starting one, as the unwinder's lookup does) and merges
/// neighbours with the same rule.
fn finish(mut rows: Vec<(u64, u64, KernelRow)>) -> Vec<KernelRow> {
    rows.sort_by_key(|&(svma, order, row)| (svma, row.kind != RowKind::None, order));
    let mut out: Vec<KernelRow> = Vec::with_capacity(rows.len());
    for (_, _, row) in rows {
        if let Some(last) = out.last_mut() {
            if last.svma == row.svma {
                *last = row;
                continue;
            }
            if last.same_rule(&row) {
                continue;
            }
        }
        out.push(row);
    }
    // Merging replaced rows in place: merge again where that made neighbours equal.
    out.dedup_by(|next, prev| prev.same_rule(next));
    out
}

/// One CFI row as the kernel walk runs it.
fn compile<'a, S, C>(row: &UnwindTableRow<usize, C>, svma: u64, section: &S) -> KernelRow
where
    S: UnwindSection<Slice<'a>>,
    C: gimli::UnwindContextStorage<usize>,
{
    let mut out = KernelRow {
        svma,
        kind: RowKind::Stop,
        cfa_offset: 0,
        rbp_offset: 0,
        arg: 0,
    };
    match row.register(X86_64::RA) {
        Some(RegisterRule::Undefined) => {
            out.kind = RowKind::Root;
            return out;
        }
        Some(RegisterRule::Offset(-8)) => {}
        _ => return out,
    }
    let rbp = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue) => 0,
        Some(RegisterRule::Offset(o)) => match i16::try_from(o) {
            Ok(o) if o != 0 => o,
            _ => return out,
        },
        Some(_) => return out,
    };
    let (kind, offset) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } if *register == X86_64::RSP => {
            (RowKind::Rsp, *offset)
        }
        CfaRule::RegisterAndOffset { register, offset } if *register == X86_64::RBP => {
            (RowKind::Rbp, *offset)
        }
        CfaRule::Expression(e) => {
            match e.get(section).ok().and_then(|x| plt_threshold(x.0.slice())) {
                Some(k) => {
                    out.kind = RowKind::Plt;
                    out.arg = k;
                    out.rbp_offset = rbp;
                    return out;
                }
                None => return out,
            }
        }
        _ => return out,
    };
    let Ok(offset) = i32::try_from(offset) else {
        return out;
    };
    out.kind = kind;
    out.cfa_offset = offset;
    out.rbp_offset = rbp;
    out
}

/// The threshold `k` of the CFA expression the linker writes for lazy-binding PLT entries:
/// `rsp + 8 + (((rip & 15) >= k) << 3)`, as `DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15;
/// DW_OP_and; DW_OP_litK; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus`.
fn plt_threshold(e: &[u8]) -> Option<u8> {
    match e {
        [
            0x77,
            0x08,
            0x80,
            0x00,
            0x3f,
            0x1a,
            lit,
            0x2a,
            0x33,
            0x24,
            0x22,
        ] if (0x30..0x40).contains(lit) => Some(lit - 0x30),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_linkers_plt_expression_is_recognised() {
        let e = [
            0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
        ];
        assert_eq!(plt_threshold(&e), Some(11));
        assert_eq!(plt_threshold(&e[..10]), None);
        let mut other = e;
        other[1] = 0x10;
        assert_eq!(plt_threshold(&other), None);
    }
}
