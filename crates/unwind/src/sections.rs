//! A binary's unwind sections as the unwinder holds them: `.eh_frame` and `.debug_frame` bytes
//! (`.eh_frame_hdr`'s address only), their link-time addresses, and each one's [`CfiIndex`].
//!
//! The image layer reads the sections out of the file and hands them to [`UnwindSections::new`];
//! everything derived from them (the FDE indexes, the base addresses gimli needs) is computed
//! here, once.

use std::ops::Range;
use std::sync::Arc;

use gimli::{BaseAddresses, DebugFrame, EhFrame, EndianSlice, LittleEndian};

use crate::cfi::{CfiIndex, CfiIndexParts, RowClass};

/// One section in memory, with its link-time address range.
#[derive(Debug, Clone)]
pub struct Section {
    /// Link-time addresses the section occupies.
    pub svma: Range<u64>,
    /// Its bytes.
    pub data: Arc<[u8]>,
}

/// Where a binary's sections lie, as the image layer found them.
#[derive(Debug, Clone, Default)]
pub struct SectionLayout {
    /// `.text`'s link-time range (the base of text-relative CFI pointers).
    pub text: Option<Range<u64>>,
    /// `.got`'s link-time range (the base of GOT-relative CFI pointers).
    pub got: Option<Range<u64>>,
    /// `.eh_frame`.
    pub eh_frame: Option<Section>,
    /// `.eh_frame_hdr`'s link-time range: the base of `.eh_frame`'s data-relative pointers (its
    /// table is not used: FDEs are found through [`CfiIndex`]).
    pub eh_frame_hdr: Option<Range<u64>>,
    /// `.debug_frame`.
    pub debug_frame: Option<Section>,
}

/// A binary's unwind sections and their FDE indexes.
#[derive(Debug)]
pub struct UnwindSections {
    layout: SectionLayout,
    eh_cfi: CfiIndex,
    debug_cfi: CfiIndex,
}

impl UnwindSections {
    /// Indexes the sections' FDEs.
    pub fn new(layout: SectionLayout) -> UnwindSections {
        let mut sections = UnwindSections {
            layout,
            eh_cfi: CfiIndex::default(),
            debug_cfi: CfiIndex::default(),
        };
        sections.eh_cfi = sections.cfi_index(false);
        sections.debug_cfi = sections.cfi_index(true);
        sections
    }

    /// The sections with FDE indexes made from `eh_frame` and `debug_frame` (what
    /// [`UnwindSections::index_parts`] gave for the same sections) instead of read from them.
    pub fn with_indexes(
        layout: SectionLayout,
        eh_frame: CfiIndexParts,
        debug_frame: CfiIndexParts,
    ) -> UnwindSections {
        UnwindSections {
            layout,
            eh_cfi: CfiIndex::from_parts(eh_frame),
            debug_cfi: CfiIndex::from_parts(debug_frame),
        }
    }

    /// What the FDE indexes of `.eh_frame` and of `.debug_frame` are made of.
    pub fn index_parts(&self) -> [CfiIndexParts; 2] {
        [self.eh_cfi.parts(), self.debug_cfi.parts()]
    }

    /// Heap memory held: the section bytes and the FDE indexes.
    pub fn heap_bytes(&self) -> usize {
        let section = |s: &Option<Section>| s.as_ref().map_or(0, |s| s.data.len());
        section(&self.layout.eh_frame)
            + section(&self.layout.debug_frame)
            + self.eh_cfi.heap_bytes()
            + self.debug_cfi.heap_bytes()
            + (self.eh_cfi.len() + self.debug_cfi.len()) * 8
    }

    /// Whether any FDE covers code.
    pub fn has_cfi(&self) -> bool {
        !self.eh_cfi.is_empty() || !self.debug_cfi.is_empty()
    }

    /// FDEs in `.eh_frame` and in `.debug_frame`.
    pub fn fde_counts(&self) -> (usize, usize) {
        (self.eh_cfi.len(), self.debug_cfi.len())
    }

    /// Link-time ranges whose CFI rows need more registers than rip, rsp and rbp (`.eh_frame`
    /// ranges, then `.debug_frame` ones). Reads every row: for diagnostics and tests.
    pub fn full_register_ranges(&self) -> Vec<(u64, u64)> {
        let mut v = Vec::new();
        if let Some(section) = self.eh_frame_section() {
            v = self
                .eh_cfi
                .full_register_ranges(&section, &self.cfi_bases(false));
        }
        if let Some(section) = self.debug_frame_section() {
            v.extend(
                self.debug_cfi
                    .full_register_ranges(&section, &self.cfi_bases(true)),
            );
        }
        v
    }

    /// How the unwinder may evaluate the row at link-time address `svma` in `.debug_frame`
    /// (`debug`) or `.eh_frame` (see [`CfiIndex::row_class`]); None when that section has no FDE
    /// for it.
    pub fn row_class(&self, debug: bool, svma: u64) -> Option<RowClass> {
        if debug {
            let s = self.debug_frame_section()?;
            self.debug_cfi.row_class(&s, &self.cfi_bases(true), svma)
        } else {
            let s = self.eh_frame_section()?;
            self.eh_cfi.row_class(&s, &self.cfi_bases(false), svma)
        }
    }

    /// [`CfiIndex::clone_gap`] in `.eh_frame`, then in `.debug_frame`.
    pub fn clone_gap(&self, svma: u64) -> Option<u64> {
        let eh = self
            .eh_frame_section()
            .and_then(|s| self.eh_cfi.clone_gap(&s, &self.cfi_bases(false), svma));
        eh.or_else(|| {
            self.debug_frame_section()
                .and_then(|s| self.debug_cfi.clone_gap(&s, &self.cfi_bases(true), svma))
        })
    }

    /// `.eh_frame` as gimli reads it.
    pub(crate) fn eh_frame_section(&self) -> Option<EhFrame<EndianSlice<'_, LittleEndian>>> {
        Some(EhFrame::new(self.eh_frame_bytes()?, LittleEndian))
    }

    /// `.debug_frame` as gimli reads it (8-byte addresses).
    pub(crate) fn debug_frame_section(&self) -> Option<DebugFrame<EndianSlice<'_, LittleEndian>>> {
        let mut section = DebugFrame::new(self.debug_frame_bytes()?, LittleEndian);
        section.set_address_size(8);
        Some(section)
    }

    /// Whether an `.eh_frame` FDE covers link-time address `svma`.
    pub fn eh_frame_covers(&self, svma: u64) -> bool {
        self.eh_cfi.covers(svma)
    }

    /// Whether a `.debug_frame` FDE covers link-time address `svma`.
    pub fn debug_frame_covers(&self, svma: u64) -> bool {
        self.debug_cfi.covers(svma)
    }

    /// The FDE index of `.debug_frame` (`debug`) or `.eh_frame`.
    pub fn cfi(&self, debug: bool) -> &CfiIndex {
        if debug { &self.debug_cfi } else { &self.eh_cfi }
    }

    /// The base addresses gimli needs to read pointers in `.debug_frame` (`debug`) or
    /// `.eh_frame`.
    pub fn cfi_bases(&self, debug: bool) -> BaseAddresses {
        let l = &self.layout;
        let mut bases = BaseAddresses::default();
        if let Some(t) = &l.text {
            bases = bases.set_text(t.start);
        }
        if let Some(g) = &l.got {
            bases = bases.set_got(g.start);
        }
        if !debug {
            if let Some(s) = &l.eh_frame {
                bases = bases.set_eh_frame(s.svma.start);
            }
            if let Some(h) = &l.eh_frame_hdr {
                bases = bases.set_eh_frame_hdr(h.start);
            }
        }
        bases
    }

    /// `.eh_frame`'s bytes.
    pub fn eh_frame_bytes(&self) -> Option<&[u8]> {
        self.layout.eh_frame.as_ref().map(|s| &*s.data)
    }

    /// `.debug_frame`'s bytes.
    pub fn debug_frame_bytes(&self) -> Option<&[u8]> {
        self.layout.debug_frame.as_ref().map(|s| &*s.data)
    }

    fn cfi_index(&self, debug: bool) -> CfiIndex {
        let bases = self.cfi_bases(debug);
        if debug {
            self.debug_frame_section()
                .map_or_else(CfiIndex::default, |s| CfiIndex::build(&s, &bases))
        } else {
            self.eh_frame_section()
                .map_or_else(CfiIndex::default, |s| CfiIndex::build(&s, &bases))
        }
    }
}
