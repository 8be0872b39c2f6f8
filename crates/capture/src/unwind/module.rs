//! One loaded ELF file as the unwinder sees it: its unwind sections, code bytes, CFI coverage and
//! function starts. Pure data built from the file's bytes; nothing here touches a process.

use std::ops::{Deref, Range};
use std::sync::Arc;

use super::cfi::CfiIndex;
use gimli::{BaseAddresses, DebugFrame, EhFrame, LittleEndian};
use object::{
    Object, ObjectSection, ObjectSegment, ObjectSymbol, ObjectSymbolTable, SectionKind, SymbolKind,
};

/// Why an ELF file could not be used for unwinding.
#[derive(Debug, thiserror::Error)]
#[error("cannot parse ELF file {name}: {source}")]
pub struct ModuleError {
    /// Display name of the file.
    pub name: String,
    /// The parser's error.
    #[source]
    pub source: object::Error,
}

/// A slice of a module's file bytes, handed to framehop as section data.
#[derive(Clone)]
pub struct SectionBytes {
    bytes: Arc<[u8]>,
    range: Range<usize>,
}

impl Deref for SectionBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[self.range.clone()]
    }
}

/// A section's address range (SVMA, as linked) and its location in the file.
#[derive(Debug, Clone)]
struct SectionRef {
    svma: Range<u64>,
    file: Range<usize>,
}

/// A loadable segment: link-time address range and where its bytes lie in the file.
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    /// Link-time virtual address of the segment.
    pub vaddr: u64,
    /// Offset of the segment in the file.
    pub offset: u64,
    /// Bytes of the segment present in the file.
    pub filesz: u64,
    /// Whether the segment is executable.
    pub exec: bool,
}

/// A parsed ELF file: everything the unwinder needs, keyed by link-time addresses (SVMA).
pub struct CodeModule {
    name: String,
    bytes: Arc<[u8]>,
    segments: Vec<Segment>,
    text: Option<SectionRef>,
    eh_frame: Option<SectionRef>,
    eh_frame_hdr: Option<SectionRef>,
    /// Whether `.eh_frame_hdr`'s table lists exactly the FDEs of `.eh_frame` (framehop looks
    /// addresses up through it; a table missing an FDE would make it guess frame pointers).
    hdr_complete: bool,
    debug_frame: Option<SectionRef>,
    got: Option<SectionRef>,
    eh_cfi: CfiIndex,
    debug_cfi: CfiIndex,
    functions: Vec<(u64, u64)>,
    symbols: Vec<(u64, u64, Box<str>)>,
    build_id: Option<String>,
}

impl std::fmt::Debug for CodeModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeModule")
            .field("name", &self.name)
            .field("eh_fdes", &self.eh_cfi.len())
            .field("debug_fdes", &self.debug_cfi.len())
            .field("eh_frame_hdr_complete", &self.hdr_complete)
            .field("functions", &self.functions.len())
            .finish()
    }
}

impl CodeModule {
    /// Parses an ELF file's bytes. `name` is used in messages and as framehop's module name.
    pub fn parse(name: &str, bytes: Arc<[u8]>) -> Result<CodeModule, ModuleError> {
        let err = |source| ModuleError {
            name: name.to_string(),
            source,
        };
        let file = object::File::parse(&*bytes).map_err(err)?;
        let section = |names: &[&str]| -> Option<SectionRef> {
            names.iter().find_map(|n| {
                let s = file.section_by_name(n)?;
                let (off, size) = s.file_range()?;
                let start = usize::try_from(off).ok()?;
                let end = start.checked_add(usize::try_from(size).ok()?)?;
                (end <= bytes.len()).then(|| SectionRef {
                    svma: s.address()..s.address() + s.size(),
                    file: start..end,
                })
            })
        };
        let text = section(&[".text"]);
        let eh_frame = section(&[".eh_frame"]);
        let eh_frame_hdr = section(&[".eh_frame_hdr"]);
        let debug_frame = section(&[".debug_frame"]);
        let got = section(&[".got"]);
        let segments = file
            .segments()
            .map(|s| {
                let (offset, filesz) = s.file_range();
                let exec = matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0);
                Segment {
                    vaddr: s.address(),
                    offset,
                    filesz,
                    exec,
                }
            })
            .collect();
        let mut symbols: Vec<(u64, u64, Box<str>)> = file
            .symbols()
            .chain(file.dynamic_symbols())
            .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0)
            .filter_map(|s| {
                let name = s.name().ok().filter(|n| !n.is_empty())?;
                Some((s.address(), s.address() + s.size().max(1), name.into()))
            })
            .collect();
        symbols.extend(plt_symbols(&file));
        // Prefer sized, global symbols when several share an address.
        symbols.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        symbols.dedup_by_key(|s| s.0);
        let mut functions: Vec<(u64, u64)> = symbols.iter().map(|s| (s.0, s.1)).collect();
        // Sections of code without symbols still bound functions at their start (e.g. `.plt`).
        for s in file.sections() {
            if s.kind() == SectionKind::Text && s.size() > 0 {
                functions.push((s.address(), s.address()));
            }
        }
        functions.sort_unstable();
        functions.dedup_by_key(|f| f.0);
        let build_id = file
            .build_id()
            .ok()
            .flatten()
            .map(|id| id.iter().map(|b| format!("{b:02x}")).collect());

        let mut module = CodeModule {
            name: name.to_string(),
            bytes,
            segments,
            text,
            eh_frame,
            eh_frame_hdr,
            hdr_complete: false,
            debug_frame,
            got,
            eh_cfi: CfiIndex::default(),
            debug_cfi: CfiIndex::default(),
            functions,
            symbols,
            build_id,
        };
        module.eh_cfi = module.cfi_index(false);
        module.debug_cfi = module.cfi_index(true);
        module.hdr_complete = module.hdr_lists_every_fde();
        Ok(module)
    }

    /// Display name (usually the path).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether framehop may look addresses up through `.eh_frame_hdr` (its table lists every
    /// FDE); otherwise it indexes `.eh_frame` itself.
    pub fn eh_frame_hdr_complete(&self) -> bool {
        self.hdr_complete
    }

    /// Hex GNU build id, when the file has one.
    pub fn build_id(&self) -> Option<&str> {
        self.build_id.as_deref()
    }

    /// Whether the file has any CFI (`.eh_frame` or `.debug_frame` FDEs).
    pub fn has_cfi(&self) -> bool {
        !self.eh_cfi.is_empty() || !self.debug_cfi.is_empty()
    }

    /// Number of FDEs in `.eh_frame` and in `.debug_frame`.
    pub fn fde_counts(&self) -> (usize, usize) {
        (self.eh_cfi.len(), self.debug_cfi.len())
    }

    /// Link-time address ranges whose CFI rows need full-register evaluation (`.eh_frame`
    /// ranges, then `.debug_frame` ones): see [`super::cfi`].
    pub fn full_register_ranges(&self) -> Vec<(u64, u64)> {
        let mut v = self.eh_cfi.full_register_ranges().to_vec();
        v.extend_from_slice(self.debug_cfi.full_register_ranges());
        v
    }

    /// Whether an `.eh_frame` FDE covers the link-time address `svma`.
    pub fn eh_frame_covers(&self, svma: u64) -> bool {
        self.eh_cfi.covers(svma)
    }

    /// Whether a `.debug_frame` FDE covers the link-time address `svma`.
    pub fn debug_frame_covers(&self, svma: u64) -> bool {
        self.debug_cfi.covers(svma)
    }

    /// Start of the function containing `svma`, from the symbol tables (None when unknown).
    pub fn function_start(&self, svma: u64) -> Option<u64> {
        let i = self.functions.partition_point(|f| f.0 <= svma);
        let (start, end) = *self.functions.get(i.checked_sub(1)?)?;
        // A symbol with a size must contain the address; a sizeless boundary is trusted up to the
        // next boundary (the gap check keeps a far-away start from being used).
        if end > start && svma >= end {
            return None;
        }
        Some(start)
    }

    /// The (raw, possibly mangled) name of the symbol containing `svma`, from `.symtab` or
    /// `.dynsym`.
    pub fn symbol_name(&self, svma: u64) -> Option<&str> {
        let i = self.symbols.partition_point(|s| s.0 <= svma);
        let (start, end, name) = self.symbols.get(i.checked_sub(1)?)?;
        (svma >= *start && svma < *end).then_some(&**name)
    }

    /// The file offset of the link-time address `svma`, when a segment maps it from the file.
    pub fn file_offset_of(&self, svma: u64) -> Option<u64> {
        self.segments.iter().find_map(|s| {
            (svma >= s.vaddr && svma < s.vaddr + s.filesz).then(|| svma - s.vaddr + s.offset)
        })
    }

    /// The link-time address of file offset `offset` (the inverse of [`CodeModule::file_offset_of`]).
    ///
    /// A mapping starts at a page-aligned offset, which may lie before its segment's first byte
    /// (and inside the previous segment's last page): executable segments are matched first,
    /// from their page-aligned start.
    pub fn svma_of_file_offset(&self, offset: u64) -> Option<u64> {
        let in_segment = |s: &&Segment, aligned: bool| {
            let start = if aligned { s.offset & !0xfff } else { s.offset };
            offset >= start && offset < s.offset + s.filesz
        };
        let svma = |s: &Segment| offset.wrapping_sub(s.offset).wrapping_add(s.vaddr);
        self.segments
            .iter()
            .filter(|s| s.exec)
            .find(|s| in_segment(s, true))
            .or_else(|| self.segments.iter().find(|s| in_segment(s, false)))
            .map(svma)
    }

    /// Up to `len` code bytes starting at link-time address `svma` (shorter at a segment end).
    pub fn code(&self, svma: u64, len: usize) -> Option<&[u8]> {
        let seg = self
            .segments
            .iter()
            .find(|s| svma >= s.vaddr && svma < s.vaddr + s.filesz)?;
        let start = usize::try_from(svma - seg.vaddr + seg.offset).ok()?;
        let seg_end = usize::try_from(seg.offset + seg.filesz).ok()?;
        let end = start.saturating_add(len).min(seg_end).min(self.bytes.len());
        self.bytes.get(start..end)
    }

    /// framehop section info exposing `.eh_frame` (+ header) only, or `.debug_frame` only.
    pub(crate) fn section_info(self: &Arc<Self>, debug_frame: bool) -> ModuleSections {
        ModuleSections {
            module: self.clone(),
            debug_frame,
        }
    }

    fn bytes_of(&self, s: &SectionRef) -> SectionBytes {
        SectionBytes {
            bytes: self.bytes.clone(),
            range: s.file.clone(),
        }
    }

    /// The FDE index of `.debug_frame` (`debug`) or `.eh_frame`.
    pub(crate) fn cfi(&self, debug: bool) -> &CfiIndex {
        if debug { &self.debug_cfi } else { &self.eh_cfi }
    }

    /// The base addresses for reading `.eh_frame` (`debug` false) or `.debug_frame`.
    pub(crate) fn cfi_bases(&self, debug: bool) -> BaseAddresses {
        let mut bases = BaseAddresses::default();
        if let Some(t) = &self.text {
            bases = bases.set_text(t.svma.start);
        }
        if let Some(g) = &self.got {
            bases = bases.set_got(g.svma.start);
        }
        if !debug {
            if let Some(s) = &self.eh_frame {
                bases = bases.set_eh_frame(s.svma.start);
            }
            if let Some(h) = &self.eh_frame_hdr {
                bases = bases.set_eh_frame_hdr(h.svma.start);
            }
        }
        bases
    }

    /// The bytes of `.eh_frame`, when present.
    pub(crate) fn eh_frame_bytes(&self) -> Option<&[u8]> {
        self.eh_frame.as_ref().map(|s| &self.bytes[s.file.clone()])
    }

    /// The bytes of `.debug_frame`, when present.
    pub(crate) fn debug_frame_bytes(&self) -> Option<&[u8]> {
        self.debug_frame
            .as_ref()
            .map(|s| &self.bytes[s.file.clone()])
    }

    /// Whether the `.eh_frame_hdr` search table has one entry per `.eh_frame` FDE, at the same
    /// start addresses.
    fn hdr_lists_every_fde(&self) -> bool {
        let Some(h) = &self.eh_frame_hdr else {
            return false;
        };
        let bases = self.cfi_bases(false);
        let hdr = gimli::EhFrameHdr::new(&self.bytes[h.file.clone()], LittleEndian);
        let Ok(parsed) = hdr.parse(&bases, 8) else {
            return false;
        };
        let Some(table) = parsed.table() else {
            return false;
        };
        let mut starts = Vec::with_capacity(self.eh_cfi.len());
        let mut iter = table.iter(&bases);
        loop {
            match iter.next() {
                Ok(Some((gimli::Pointer::Direct(start), _))) => starts.push(start),
                Ok(None) => break,
                _ => return false,
            }
        }
        starts.sort_unstable();
        starts == self.eh_cfi.starts()
    }

    fn cfi_index(&self, debug: bool) -> CfiIndex {
        let bases = self.cfi_bases(debug);
        if debug {
            let Some(bytes) = self.debug_frame_bytes() else {
                return CfiIndex::default();
            };
            let mut section = DebugFrame::new(bytes, LittleEndian);
            section.set_address_size(8);
            CfiIndex::build(&section, &bases)
        } else {
            let Some(bytes) = self.eh_frame_bytes() else {
                return CfiIndex::default();
            };
            CfiIndex::build(&EhFrame::new(bytes, LittleEndian), &bases)
        }
    }
}

#[cfg(test)]
impl CodeModule {
    /// A module for tests: `code` linked at `text_svma` (one executable segment at file offset
    /// 0), `eh_frame` linked at `eh_frame_svma`, and the given function symbols.
    pub(crate) fn synthetic(
        text_svma: u64,
        code: &[u8],
        eh_frame_svma: u64,
        eh_frame: &[u8],
        symbols: &[(u64, u64, &str)],
    ) -> CodeModule {
        let mut bytes = code.to_vec();
        bytes.extend_from_slice(eh_frame);
        let text_end = text_svma + code.len() as u64;
        let mut module = CodeModule {
            name: "synthetic".into(),
            bytes: bytes.into(),
            segments: vec![Segment {
                vaddr: text_svma,
                offset: 0,
                filesz: code.len() as u64,
                exec: true,
            }],
            text: Some(SectionRef {
                svma: text_svma..text_end,
                file: 0..code.len(),
            }),
            eh_frame: (!eh_frame.is_empty()).then(|| SectionRef {
                svma: eh_frame_svma..eh_frame_svma + eh_frame.len() as u64,
                file: code.len()..code.len() + eh_frame.len(),
            }),
            eh_frame_hdr: None,
            hdr_complete: false,
            debug_frame: None,
            got: None,
            eh_cfi: CfiIndex::default(),
            debug_cfi: CfiIndex::default(),
            functions: symbols.iter().map(|s| (s.0, s.1)).collect(),
            symbols: symbols.iter().map(|s| (s.0, s.1, s.2.into())).collect(),
            build_id: None,
        };
        module.eh_cfi = module.cfi_index(false);
        module
    }
}

/// `name@plt` symbols for the PLT stubs: the i-th stub of `.plt.sec` and the i-th entry of `.plt`
/// after its 16-byte header both go through the i-th `.rela.plt` relocation, whose symbol names
/// them. The header itself (the lazy-binding trampoline) is `plt0@plt`.
fn plt_symbols(file: &object::File<'_>) -> Vec<(u64, u64, Box<str>)> {
    let mut out = Vec::new();
    let plt = file.section_by_name(".plt");
    if let Some(plt) = &plt {
        out.push((plt.address(), plt.address() + 16, "plt0@plt".into()));
    }
    let (Some(rela), Some(dynsym)) = (
        file.section_by_name(".rela.plt")
            .and_then(|s| s.data().ok()),
        file.dynamic_symbol_table(),
    ) else {
        return out;
    };
    let tables = [
        file.section_by_name(".plt.sec").map(|s| (s, 0)),
        plt.map(|s| (s, 16)),
    ];
    for (stubs, first) in tables.into_iter().flatten() {
        for (i, entry) in rela.chunks_exact(24).enumerate() {
            let info = u64::from_le_bytes(entry[8..16].try_into().unwrap_or([0; 8]));
            let index = object::SymbolIndex((info >> 32) as usize);
            let Some(name) = dynsym
                .symbol_by_index(index)
                .ok()
                .and_then(|s| s.name().ok())
            else {
                continue;
            };
            let start = stubs.address() + first + 16 * i as u64;
            if start + 16 <= stubs.address() + stubs.size() && !name.is_empty() {
                out.push((start, start + 16, format!("{name}@plt").into()));
            }
        }
    }
    out
}

/// framehop's view of a module's sections: either the `.eh_frame` family or `.debug_frame`.
pub(crate) struct ModuleSections {
    module: Arc<CodeModule>,
    debug_frame: bool,
}

impl framehop::ModuleSectionInfo<SectionBytes> for ModuleSections {
    fn base_svma(&self) -> u64 {
        0
    }

    fn section_svma_range(&mut self, name: &[u8]) -> Option<Range<u64>> {
        let m = &self.module;
        let s = match name {
            b".text" => m.text.as_ref(),
            b".eh_frame" if !self.debug_frame => m.eh_frame.as_ref(),
            b".eh_frame_hdr" if !self.debug_frame && m.hdr_complete => m.eh_frame_hdr.as_ref(),
            b".got" => m.got.as_ref(),
            _ => None,
        };
        s.map(|s| s.svma.clone())
    }

    fn section_data(&mut self, name: &[u8]) -> Option<SectionBytes> {
        let m = &self.module;
        let s = match name {
            b".text" => m.text.as_ref(),
            b".eh_frame" if !self.debug_frame => m.eh_frame.as_ref(),
            b".eh_frame_hdr" if !self.debug_frame && m.hdr_complete => m.eh_frame_hdr.as_ref(),
            b".debug_frame" if self.debug_frame => m.debug_frame.as_ref(),
            _ => None,
        };
        s.map(|s| m.bytes_of(s))
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_offset_before_the_text_segment_maps_to_its_page() {
        // Rust binaries often start the executable segment mid-page (offset 0x249c80, vaddr
        // 0x24ac80); the kernel maps it from offset 0x249000, which also lies in the read-only
        // segment before it.
        let segments = vec![
            Segment {
                vaddr: 0,
                offset: 0,
                filesz: 0x249c68,
                exec: false,
            },
            Segment {
                vaddr: 0x24ac80,
                offset: 0x249c80,
                filesz: 0x7f34e0,
                exec: true,
            },
        ];
        let module = CodeModule {
            name: "x".into(),
            bytes: Arc::from(&[][..]),
            segments,
            text: None,
            eh_frame: None,
            eh_frame_hdr: None,
            hdr_complete: false,
            debug_frame: None,
            got: None,
            eh_cfi: CfiIndex::default(),
            debug_cfi: CfiIndex::default(),
            functions: Vec::new(),
            symbols: Vec::new(),
            build_id: None,
        };
        assert_eq!(module.svma_of_file_offset(0x249000), Some(0x24a000));
        assert_eq!(module.svma_of_file_offset(0x1000), Some(0x1000));
    }

    #[test]
    fn this_binary_has_a_complete_eh_frame_hdr_and_few_full_register_rows() {
        let bytes = std::fs::read("/proc/self/exe").expect("own executable");
        let m = CodeModule::parse("self", bytes.into()).expect("parses");
        assert!(m.fde_counts().0 > 1000, "{m:?}");
        assert!(m.eh_frame_hdr_complete(), "{m:?}");
        // Hand-written assembly and stack realignment aside, compiled code needs only rsp/rbp.
        assert!(
            m.full_register_ranges().len() * 100 < m.fde_counts().0,
            "{m:?}"
        );
    }
}
