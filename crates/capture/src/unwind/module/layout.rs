//! Reads an ELF file's layout from its headers and tables: segments, where the unwind sections lie,
//! function symbols (by where their names lie in the file, not the names themselves) and the
//! functions that start threads. Works through any [`ReadRef`], so a file on disk is read in the
//! pieces asked for, never whole.

use std::ops::Range;

use object::read::elf::{ElfFile64, SectionHeader, Sym};
use object::{
    Endianness, Object, ObjectSection, ObjectSegment, ObjectSymbol, ReadRef, SectionKind,
    SymbolKind,
};

use super::{NameRef, Segment, Symbol};
use crate::unwind::policy;

/// Where a section lies: its link-time addresses and its bytes in the file.
#[derive(Debug, Clone)]
pub(super) struct Placed {
    pub svma: Range<u64>,
    pub offset: u64,
    pub size: u64,
}

/// What the unwinder keeps from an ELF file's headers and symbol tables.
pub(super) struct Layout {
    pub segments: Vec<Segment>,
    pub text: Option<Range<u64>>,
    pub got: Option<Range<u64>>,
    pub eh_frame: Option<Placed>,
    pub eh_frame_hdr: Option<Placed>,
    pub debug_frame: Option<Placed>,
    /// Function symbols by start address (one per address, sized global ones preferred).
    pub symbols: Vec<Symbol>,
    /// Function boundaries: symbols plus the start of every code section.
    pub functions: Vec<(u64, u64)>,
    /// Address ranges of the functions that start threads ([`policy::is_thread_entry`]).
    pub thread_entries: Vec<(u64, u64)>,
    pub build_id: Option<String>,
    /// Whether the file has DWARF debug information or names a separate debug file.
    pub debug_info: bool,
}

impl Layout {
    /// Memory a module built from this layout will hold, estimated before its unwind sections
    /// are read (their FDE indexes are taken as half the section size, about what they take).
    pub fn estimate_bytes(&self) -> usize {
        let size = |p: &Option<Placed>| p.as_ref().map_or(0, |p| p.size as usize);
        let cfi = size(&self.eh_frame) + size(&self.debug_frame);
        cfi + cfi / 2
            + size(&self.eh_frame_hdr)
            + self.functions.len() * 16
            + self.symbols.len() * std::mem::size_of::<Symbol>()
            + self.thread_entries.len() * 16
    }
}

/// Reads the layout of the 64-bit ELF file `data`.
pub(super) fn read<'d, R: ReadRef<'d>>(data: R) -> object::Result<Layout> {
    let elf = ElfFile64::<Endianness, R>::parse(data)?;
    let placed = |name: &str| -> Option<Placed> {
        let s = elf.section_by_name(name)?;
        let (offset, size) = s.file_range()?;
        Some(Placed {
            svma: s.address()..s.address().saturating_add(s.size()),
            offset,
            size,
        })
    };
    let svma = |name: &str| placed(name).map(|p| p.svma);
    let segments = elf
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

    let mut symbols = Vec::new();
    let mut thread_entries = Vec::new();
    for dynamic in [false, true] {
        let Some(table) = symbol_table(&elf, data, dynamic) else {
            continue;
        };
        let iter = if dynamic {
            elf.dynamic_symbols()
        } else {
            elf.symbols()
        };
        for s in iter.filter(|s| s.kind() == SymbolKind::Text && s.address() != 0) {
            let st_name = s.elf_symbol().st_name(elf.endian());
            let Some(name) = table.name(st_name) else {
                continue;
            };
            let (start, end) = (s.address(), s.address().saturating_add(s.size().max(1)));
            if std::str::from_utf8(name).is_ok_and(policy::is_thread_entry) {
                thread_entries.push((start, end));
            }
            symbols.push(Symbol {
                start,
                end,
                name: NameRef::At(table.offset + u64::from(st_name)),
            });
        }
    }
    symbols.extend(plt_symbols(&elf, data));
    // Prefer sized, global symbols when several share an address.
    symbols.sort_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
    symbols.dedup_by_key(|s| s.start);
    symbols.shrink_to_fit();
    thread_entries.sort_unstable();

    let mut functions: Vec<(u64, u64)> = symbols.iter().map(|s| (s.start, s.end)).collect();
    // Sections of code without symbols still bound functions at their start (e.g. `.plt`).
    for s in elf.sections() {
        if s.kind() == SectionKind::Text && s.size() > 0 {
            functions.push((s.address(), s.address()));
        }
    }
    functions.sort_unstable();
    functions.dedup_by_key(|f| f.0);
    functions.shrink_to_fit();
    let build_id = elf
        .build_id()
        .ok()
        .flatten()
        .map(|id| id.iter().map(|b| format!("{b:02x}")).collect());

    Ok(Layout {
        segments,
        text: svma(".text"),
        got: svma(".got"),
        eh_frame: placed(".eh_frame"),
        eh_frame_hdr: placed(".eh_frame_hdr"),
        debug_frame: placed(".debug_frame"),
        symbols,
        functions,
        thread_entries,
        build_id,
        debug_info: elf.section_by_name(".debug_info").is_some()
            || elf.section_by_name(".gnu_debuglink").is_some(),
    })
}

/// A symbol table's string table: its bytes (while parsing) and its offset in the file.
struct Strings<'d> {
    bytes: &'d [u8],
    offset: u64,
}

impl<'d> Strings<'d> {
    /// The non-empty name at `st_name`, without its NUL.
    fn name(&self, st_name: u32) -> Option<&'d [u8]> {
        let rest = self.bytes.get(usize::try_from(st_name).ok()?..)?;
        let name = &rest[..rest.iter().position(|&b| b == 0)?];
        (!name.is_empty()).then_some(name)
    }
}

/// The string table of `.symtab` (or `.dynsym` when `dynamic`).
fn symbol_table<'d, R: ReadRef<'d>>(
    elf: &ElfFile64<'d, Endianness, R>,
    data: R,
    dynamic: bool,
) -> Option<Strings<'d>> {
    let table = if dynamic {
        elf.elf_dynamic_symbol_table()
    } else {
        elf.elf_symbol_table()
    };
    if table.is_empty() {
        return None;
    }
    let header = elf
        .elf_section_table()
        .section(table.string_section())
        .ok()?;
    Some(Strings {
        bytes: header.data(elf.endian(), data).ok()?,
        offset: header.sh_offset(elf.endian()),
    })
}

/// `name@plt` symbols for the PLT stubs: the i-th stub of `.plt.sec` and the i-th entry of `.plt`
/// after its 16-byte header both go through the i-th `.rela.plt` relocation, whose symbol names
/// them. The header itself (the lazy-binding trampoline) is `plt0@plt`.
fn plt_symbols<'d, R: ReadRef<'d>>(elf: &ElfFile64<'d, Endianness, R>, data: R) -> Vec<Symbol> {
    let mut out = Vec::new();
    let plt = elf.section_by_name(".plt");
    if let Some(plt) = &plt {
        out.push(Symbol {
            start: plt.address(),
            end: plt.address() + 16,
            name: NameRef::Plt0,
        });
    }
    let (Some(rela), Some(strings)) = (
        elf.section_by_name(".rela.plt").and_then(|s| s.data().ok()),
        symbol_table(elf, data, true),
    ) else {
        return out;
    };
    let dynsym = elf.elf_dynamic_symbol_table();
    let tables = [
        elf.section_by_name(".plt.sec").map(|s| (s, 0)),
        plt.map(|s| (s, 16)),
    ];
    for (stubs, first) in tables.into_iter().flatten() {
        for (i, entry) in rela.chunks_exact(24).enumerate() {
            let info = u64::from_le_bytes(entry[8..16].try_into().unwrap_or([0; 8]));
            let index = object::SymbolIndex((info >> 32) as usize);
            let Some(st_name) = dynsym
                .symbol(index)
                .ok()
                .map(|s| s.st_name(elf.endian()))
                .filter(|&n| strings.name(n).is_some())
            else {
                continue;
            };
            let start = stubs.address() + first + 16 * i as u64;
            if start + 16 <= stubs.address() + stubs.size() {
                out.push(Symbol {
                    start,
                    end: start + 16,
                    name: NameRef::Plt(strings.offset + u64::from(st_name)),
                });
            }
        }
    }
    out
}
