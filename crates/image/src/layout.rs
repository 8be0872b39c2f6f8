//! Reads an ELF file's layout: segments, where the unwind sections lie, function symbols (by where
//! their names lie in the file, not the names themselves) and the functions that start threads.
//!
//! Headers come through a [`ReadRef`] (so a file on disk is read in the pieces asked for); the
//! symbol and string tables, which reach tens of megabytes in large libraries, are streamed from
//! [`ModuleBytes`] in fixed-size chunks and never held whole.

use std::ops::Range;

use object::elf::{FileHeader64, SectionHeader64};
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader, SectionTable};
use object::{Endianness, ReadRef, elf};

use rootline_unwind::policy::THREAD_ENTRIES;

use crate::ElfError;
use crate::bytes::{ModuleBytes, SourceRef};

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

/// Where a symbol's name lies.
#[derive(Debug, Clone, Copy)]
pub(crate) enum NameRef {
    /// The NUL-terminated name at this file offset.
    At(u64),
    /// A PLT stub: the name at this offset, then `@plt`.
    Plt(u64),
    /// The PLT header, `plt0@plt`.
    Plt0,
    /// The entry point of a dynamically linked executable without a symbol there: the C
    /// runtime's `_start` (crt1.o), which the dynamic loader jumps to.
    Entry,
}

/// A function symbol: its link-time address range and where its name lies.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Symbol {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) name: NameRef,
}

/// The ELF layout of `bytes` (headers through a read cache for a file, the bytes themselves in
/// memory; symbol tables streamed through [`ModuleBytes::read_at`]), read only while the module's
/// estimated memory stays within `limit` (see [`read`]).
pub(crate) fn read_layout(bytes: &ModuleBytes, limit: Option<usize>) -> Result<Layout, ElfError> {
    match bytes.source() {
        SourceRef::File(file) => read(&object::ReadCache::new(file), bytes, limit),
        SourceRef::Memory(data) => read(data, bytes, limit),
    }
}

/// Where a section lies: its link-time addresses and its bytes in the file.
#[derive(Debug, Clone)]
pub(crate) struct Placed {
    pub svma: Range<u64>,
    pub offset: u64,
    pub size: u64,
}

/// What the unwinder keeps from an ELF file's headers and symbol tables.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
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
    /// Address ranges of the functions that start threads ([`THREAD_ENTRIES`]).
    pub thread_entries: Vec<(u64, u64)>,
    pub build_id: Option<String>,
    /// Whether the file has DWARF debug information (`.debug_info`).
    pub debug_info: bool,
    /// When reading stopped at the memory limit given (the symbol tables would pass it): the
    /// module's memory extrapolated from the part of the symbol tables read. The layout is then
    /// incomplete and must not be used.
    pub over_limit: Option<usize>,
}

impl Layout {
    /// Memory a module built from this layout will hold, estimated before its unwind sections
    /// are read (their FDE indexes are taken as half the section size, about what they take).
    pub fn estimate_bytes(&self) -> usize {
        let size = |p: &Option<Placed>| p.as_ref().map_or(0, |p| p.size as usize);
        let cfi = size(&self.eh_frame).saturating_add(size(&self.debug_frame));
        [
            cfi,
            cfi / 2,
            self.functions.len() * 16,
            self.symbols.len() * std::mem::size_of::<Symbol>(),
            self.thread_entries.len() * 16,
        ]
        .into_iter()
        .fold(0usize, usize::saturating_add)
    }
}

type Sections<'d, R> = SectionTable<'d, FileHeader64<Endianness>, R>;

/// Bytes named `_start` from a stripped executable's entry point (see [`NameRef::Entry`]).
const ENTRY_BYTES: u64 = 0x40;

/// Size of one `Elf64_Sym`.
const SYM_SIZE: usize = 24;
/// Bytes of a symbol or string table read at once.
const CHUNK: usize = 2048 * SYM_SIZE;

/// Memory one function symbol takes in a module: its [`Symbol`] and its function bounds.
const SYMBOL_COST: usize = std::mem::size_of::<Symbol>() + 16;

/// Reads the layout of the 64-bit little-endian ELF file `data`, whose bytes `bytes` also reads.
/// With a `limit`, the symbol tables are streamed only while the module's estimated memory stays
/// within it: past it the layout comes back marked [`Layout::over_limit`], so that a file with
/// millions of symbols is refused before its table is built.
pub(crate) fn read<'d, R: ReadRef<'d>>(
    data: R,
    bytes: &ModuleBytes,
    limit: Option<usize>,
) -> Result<Layout, ElfError> {
    let header = FileHeader64::<Endianness>::parse(data)?;
    let endian = header.endian()?;
    if endian != Endianness::Little {
        return Err(ElfError::Unsupported(
            "big-endian ELF files are not supported",
        ));
    }
    let sections = header.sections(endian, data)?;
    let by_name = |name: &str| sections.section_by_name(endian, name.as_bytes());
    let placed = |name: &str| -> Option<Placed> {
        let (_, s) = by_name(name)?;
        let (offset, size) = s.file_range(endian)?;
        let addr = s.sh_addr(endian);
        Some(Placed {
            svma: addr..addr.saturating_add(s.sh_size(endian)),
            offset,
            size,
        })
    };
    let svma = |name: &str| {
        by_name(name).map(|(_, s)| {
            let addr = s.sh_addr(endian);
            addr..addr.saturating_add(s.sh_size(endian))
        })
    };
    let segments = header
        .program_headers(endian, data)?
        .iter()
        .filter(|p| p.p_type(endian) == elf::PT_LOAD)
        .map(|p| Segment {
            vaddr: p.p_vaddr(endian),
            offset: p.p_offset(endian),
            filesz: p.p_filesz(endian),
            exec: p.p_flags(endian) & elf::PF_X != 0,
        })
        .collect();

    let mut layout = Layout {
        segments,
        text: svma(".text"),
        got: svma(".got"),
        eh_frame: placed(".eh_frame"),
        eh_frame_hdr: placed(".eh_frame_hdr"),
        debug_frame: placed(".debug_frame"),
        symbols: Vec::new(),
        functions: Vec::new(),
        thread_entries: Vec::new(),
        build_id: build_id(&sections, data),
        debug_info: by_name(".debug_info").is_some(),
        over_limit: None,
    };
    // How many function symbols fit in the limit next to the unwind sections.
    let mut cap = SymbolCap::new(limit.map_or(usize::MAX, |limit| {
        limit.saturating_sub(layout.estimate_bytes()) / SYMBOL_COST
    }));
    let tables: Vec<_> = [elf::SHT_SYMTAB, elf::SHT_DYNSYM]
        .into_iter()
        .filter_map(|t| sections.iter().find(|s| s.sh_type(endian) == t))
        .collect();
    let table_bytes = |t: &&SectionHeader64<Endianness>| t.file_range(endian).map_or(0, |r| r.1);
    // (Sizes come from the file: added without overflowing.)
    let all_tables = tables.iter().map(table_bytes).fold(0, u64::saturating_add);
    let mut symbols = Vec::new();
    let mut thread_entries = Vec::new();
    let mut scanned = 0u64;
    for table in &tables {
        let stopped = function_symbols(
            &sections,
            table,
            bytes,
            &mut cap,
            &mut symbols,
            &mut thread_entries,
        );
        if let Some(read) = stopped {
            scanned = scanned.saturating_add(read);
            let part =
                (symbols.len() * SYMBOL_COST) as f64 * all_tables as f64 / scanned.max(1) as f64;
            layout.over_limit = Some(layout.estimate_bytes().saturating_add(part as usize));
            layout.symbols = symbols;
            return Ok(layout);
        }
        scanned = scanned.saturating_add(table_bytes(table));
    }
    symbols.extend(plt_symbols(&sections, data, bytes));
    let entry = header.e_entry(endian);
    let interpreted = header
        .program_headers(endian, data)?
        .iter()
        .any(|p| p.p_type(endian) == elf::PT_INTERP);
    if entry != 0 && interpreted && !symbols.iter().any(|s| s.start == entry) {
        // A stripped executable still says where `_start` is: its thread root is named.
        symbols.push(Symbol {
            start: entry,
            end: entry,
            name: NameRef::Entry,
        });
    }
    one_per_address(&mut symbols);
    symbols.shrink_to_fit();
    thread_entries.sort_unstable();
    thread_entries.dedup();

    // Function bounds for the unwinder: a sizeless symbol covers only its first byte.
    let mut functions: Vec<(u64, u64)> = symbols
        .iter()
        .map(|s| (s.start, s.end.max(s.start.saturating_add(1))))
        .collect();
    name_ranges(&mut symbols);
    // Sections of code without symbols still bound functions at their start (e.g. `.plt`).
    for s in sections.iter() {
        let flags = s.sh_flags(endian);
        let code = u64::from(elf::SHF_ALLOC | elf::SHF_EXECINSTR);
        if s.sh_type(endian) == elf::SHT_PROGBITS && flags & code == code && s.sh_size(endian) > 0 {
            functions.push((s.sh_addr(endian), s.sh_addr(endian)));
        }
    }
    functions.sort_unstable();
    functions.dedup_by_key(|f| f.0);
    functions.shrink_to_fit();

    layout.symbols = symbols;
    layout.functions = functions;
    layout.thread_entries = thread_entries;
    Ok(layout)
}

/// Keeps one symbol per start address, sorted: the sized one when several share it.
fn one_per_address(symbols: &mut Vec<Symbol>) {
    symbols.sort_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
    symbols.dedup_by_key(|s| s.start);
}

/// The most function symbols a module may keep (one per address, as the module keeps them),
/// checked as they are streamed: aliases (several names of one function, a function in both
/// `.symtab` and `.dynsym`) are only counted once, by deduplicating what was read whenever it
/// grows past `check_at` (at least `max / 2` symbols apart, so the sorts cost O(log n) a symbol).
struct SymbolCap {
    max: usize,
    check_at: usize,
}

impl SymbolCap {
    fn new(max: usize) -> SymbolCap {
        SymbolCap { max, check_at: max }
    }

    /// Whether `symbols` holds more distinct addresses than the cap allows.
    fn exceeded(&mut self, symbols: &mut Vec<Symbol>) -> bool {
        if symbols.len() <= self.check_at {
            return false;
        }
        one_per_address(symbols);
        self.check_at = self.max.max(symbols.len().saturating_add(self.max / 2));
        symbols.len() > self.max
    }
}

/// Gives each sizeless symbol (an assembly entry such as `_start`) the addresses up to the next
/// symbol for naming, as symbolizers do; the last one keeps a single byte.
fn name_ranges(symbols: &mut [Symbol]) {
    for i in 0..symbols.len() {
        if symbols[i].end <= symbols[i].start {
            let start = symbols[i].start;
            let next = symbols.get(i + 1).map_or(start, |n| n.start);
            let next = match symbols[i].name {
                // `_start` is a few dozen bytes (0x26–0x30 in glibc's crt1.o).
                NameRef::Entry => symbols
                    .get(i + 1)
                    .map_or(u64::MAX, |n| n.start)
                    .min(start.saturating_add(ENTRY_BYTES)),
                _ => next,
            };
            symbols[i].end = next.max(start.saturating_add(1));
        }
    }
}

/// The GNU build id, in hex, from a note section.
fn build_id<'d, R: ReadRef<'d>>(sections: &Sections<'d, R>, data: R) -> Option<String> {
    let endian = Endianness::Little;
    sections.iter().find_map(|s| {
        let mut notes = s.notes(endian, data).ok()??;
        while let Ok(Some(note)) = notes.next() {
            if note.name() == elf::ELF_NOTE_GNU && note.n_type(endian) == elf::NT_GNU_BUILD_ID {
                return Some(note.desc().iter().map(|b| format!("{b:02x}")).collect());
            }
        }
        None
    })
}

/// Appends the function symbols (`STT_FUNC`, `STT_GNU_IFUNC`, non-zero address and name) of one
/// symbol table, streamed from the file, and the ranges of those that start threads. Once
/// `symbols` holds more addresses than `cap` allows it stops: Some(bytes of the table read).
fn function_symbols<'d, R: ReadRef<'d>>(
    sections: &Sections<'d, R>,
    table: &SectionHeader64<Endianness>,
    bytes: &ModuleBytes,
    cap: &mut SymbolCap,
    symbols: &mut Vec<Symbol>,
    thread_entries: &mut Vec<(u64, u64)>,
) -> Option<u64> {
    let endian = Endianness::Little;
    let (offset, size) = table.file_range(endian)?;
    let (strings_at, strings_len) = linked_strings(sections, table)?;
    let entries = thread_entry_names(bytes, strings_at, strings_len);
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0;
    while at < size {
        let want = usize::try_from((size - at).min(CHUNK as u64)).unwrap_or(CHUNK);
        let want = want - want % SYM_SIZE;
        if want == 0 {
            break;
        }
        let got = bytes.read_at(offset + at, &mut buf[..want]);
        for (i, sym) in buf[..got - got % SYM_SIZE]
            .chunks_exact(SYM_SIZE)
            .enumerate()
        {
            let field = |r: Range<usize>| {
                let mut v = [0u8; 8];
                v[..r.len()].copy_from_slice(&sym[r]);
                u64::from_le_bytes(v)
            };
            let (name, kind, value, len) = (field(0..4), sym[4] & 0xf, field(8..16), field(16..24));
            let function = kind == elf::STT_FUNC || kind == elf::STT_GNU_IFUNC;
            if !function || value == 0 || name == 0 || name >= strings_len {
                continue;
            }
            if entries.contains(&name) {
                thread_entries.push((value, value.saturating_add(len.max(1))));
            }
            // A sizeless symbol ends where it starts for now (see `name_ranges`).
            let end = value.saturating_add(len);
            let Some(name_at) = strings_at.checked_add(name) else {
                continue;
            };
            symbols.push(Symbol {
                start: value,
                end,
                name: NameRef::At(name_at),
            });
            if cap.exceeded(symbols) {
                return Some(at + ((i + 1) * SYM_SIZE) as u64);
            }
        }
        if got < want {
            break;
        }
        at += got as u64;
    }
    None
}

/// Offsets in a string table (at `at`, `len` bytes in the file) of the names in
/// [`THREAD_ENTRIES`], found by streaming it.
fn thread_entry_names(bytes: &ModuleBytes, at: u64, len: u64) -> Vec<u64> {
    const KEEP: usize = 32;
    let mut found = Vec::new();
    let mut window: Vec<u8> = Vec::with_capacity(CHUNK + KEEP);
    let mut window_start = 0u64;
    let mut read = 0u64;
    while read < len {
        let old = window.len();
        let want = usize::try_from((len - read).min(CHUNK as u64)).unwrap_or(CHUNK);
        window.resize(old + want, 0);
        let got = bytes.read_at(at + read, &mut window[old..]);
        window.truncate(old + got);
        for end in memchr::memchr_iter(0, &window[old..]).map(|i| old + i) {
            for name in THREAD_ENTRIES {
                let n = name.len();
                if end >= n && &window[end - n..end] == name.as_bytes() {
                    found.push(window_start + (end - n) as u64);
                }
            }
        }
        if got < want {
            break;
        }
        read += got as u64;
        let drop = window.len().saturating_sub(KEEP);
        window.drain(..drop);
        window_start += drop as u64;
    }
    found
}

/// `name@plt` symbols for the PLT stubs: the i-th stub of `.plt.sec` and the i-th entry of `.plt`
/// after its 16-byte header both go through the i-th `.rela.plt` relocation, whose symbol names
/// them. The header itself (the lazy-binding trampoline) is `plt0@plt`.
fn plt_symbols<'d, R: ReadRef<'d>>(
    sections: &Sections<'d, R>,
    data: R,
    bytes: &ModuleBytes,
) -> Vec<Symbol> {
    let endian = Endianness::Little;
    let by_name = |name: &str| {
        sections
            .section_by_name(endian, name.as_bytes())
            .map(|s| s.1)
    };
    let mut out = Vec::new();
    let plt = by_name(".plt");
    if let Some(plt) = plt {
        let start = plt.sh_addr(endian);
        out.push(Symbol {
            start,
            end: start + 16,
            name: NameRef::Plt0,
        });
    }
    let rela = by_name(".rela.plt").and_then(|s| s.data(endian, data).ok());
    let dynsym = sections
        .iter()
        .find(|s| s.sh_type(endian) == elf::SHT_DYNSYM);
    let (Some(rela), Some(dynsym)) = (rela, dynsym) else {
        return out;
    };
    let (Some((dynsym_at, dynsym_len)), Some((strings_at, strings_len))) =
        (dynsym.file_range(endian), linked_strings(sections, dynsym))
    else {
        return out;
    };
    // The name offset of each relocation's symbol, read entry by entry (a few thousand at most).
    let names: Vec<Option<u64>> = rela
        .chunks_exact(24)
        .map(|entry| {
            let info = u64::from_le_bytes(entry[8..16].try_into().unwrap_or([0; 8]));
            let at = (info >> 32).checked_mul(SYM_SIZE as u64)?;
            if at.checked_add(SYM_SIZE as u64)? > dynsym_len {
                return None;
            }
            let mut name = [0u8; 4];
            (bytes.read_at(dynsym_at.checked_add(at)?, &mut name) == 4).then_some(())?;
            let name = u64::from(u32::from_le_bytes(name));
            (name != 0 && name < strings_len)
                .then(|| strings_at.checked_add(name))
                .flatten()
        })
        .collect();
    let tables = [by_name(".plt.sec").map(|s| (s, 0)), plt.map(|s| (s, 16))];
    for (stubs, first) in tables.into_iter().flatten() {
        let (base, size) = (stubs.sh_addr(endian), stubs.sh_size(endian));
        for (i, name) in names.iter().enumerate() {
            let start = base + first + 16 * i as u64;
            if let Some(name) = *name
                && start + 16 <= base + size
            {
                out.push(Symbol {
                    start,
                    end: start + 16,
                    name: NameRef::Plt(name),
                });
            }
        }
    }
    out
}

/// The file range of the string table linked to symbol table `table`.
fn linked_strings<'d, R: ReadRef<'d>>(
    sections: &Sections<'d, R>,
    table: &SectionHeader64<Endianness>,
) -> Option<(u64, u64)> {
    let endian = Endianness::Little;
    let index = object::SectionIndex(table.sh_link(endian) as usize);
    let strings = sections.section(index).ok()?;
    if strings.sh_type(endian) != elf::SHT_STRTAB {
        return None;
    }
    strings.file_range(endian)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbol_tables_are_read_only_up_to_the_limit() {
        let libc = std::fs::File::open("/lib/x86_64-linux-gnu/libc.so.6").expect("libc");
        let bytes = ModuleBytes::from_file(libc, &crate::ModuleBudget::new());
        let whole = read_layout(&bytes, None).expect("libc's layout");
        assert_eq!(whole.over_limit, None);
        let functions = whole.functions.len();
        assert!(functions > 1000, "{functions} functions");
        let exact = whole.estimate_bytes();
        let roomy = read_layout(&bytes, Some(usize::MAX)).expect("libc's layout");
        assert_eq!(roomy.over_limit, None);
        assert_eq!(roomy.functions.len(), functions);
        // Room for the unwind sections and a hundred symbols: reading stops there.
        let sections_only = Layout {
            symbols: Vec::new(),
            functions: Vec::new(),
            thread_entries: Vec::new(),
            ..whole
        };
        let limit = sections_only.estimate_bytes() + 100 * SYMBOL_COST;
        let cut = read_layout(&bytes, Some(limit)).expect("libc's layout");
        // (Aliases are let go every half a limit's symbols, when it is checked.)
        let kept = cut.symbols.len();
        assert!((101..=151).contains(&kept), "{kept} symbols kept");
        assert!(
            cut.symbols.capacity() < 1000,
            "no table built past the limit"
        );
        // What the whole module would need, extrapolated from the part read: about right.
        let needed = cut.over_limit.expect("stopped at the limit");
        assert!(
            needed > exact / 2 && needed < exact * 2,
            "{needed} for {exact}"
        );
        // More than the limit: the binary is retried only once the room grew.
        assert!(needed > limit, "{needed} within the limit {limit}");
    }

    #[test]
    fn a_module_that_fits_is_read_whole_despite_aliases() {
        // libc names many functions several times (`malloc` and `__libc_malloc`, versions of one
        // symbol): the module keeps one symbol per address, so only those count to the limit.
        let libc = std::fs::File::open("/lib/x86_64-linux-gnu/libc.so.6").expect("libc");
        let bytes = ModuleBytes::from_file(libc, &crate::ModuleBudget::new());
        let whole = read_layout(&bytes, None).expect("libc's layout");
        let exact = whole.estimate_bytes();
        let fitting = read_layout(&bytes, Some(exact)).expect("libc's layout");
        assert_eq!(
            fitting.over_limit, None,
            "refused with room for {exact} bytes"
        );
        assert_eq!(fitting.functions, whole.functions);
        assert_eq!(fitting.symbols.len(), whole.symbols.len());
    }

    #[test]
    fn symbol_tables_claiming_every_byte_do_not_panic() {
        // libc with a second symbol table (the section before `.shstrtab`, as `.symtab` over
        // `.dynsym`'s strings) claiming 2^64 - 1 bytes: the tables' sizes add past u64.
        let mut elf = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").expect("libc");
        let word = |b: &[u8], at: usize, n: usize| {
            let mut v = [0u8; 8];
            v[..n].copy_from_slice(&b[at..at + n]);
            u64::from_le_bytes(v) as usize
        };
        let (shoff, shnum) = (word(&elf, 0x28, 8), word(&elf, 0x3c, 2));
        let header = |i: usize| shoff + i * 64;
        let dynsym = (0..shnum)
            .find(|&i| word(&elf, header(i) + 4, 4) == elf::SHT_DYNSYM as usize)
            .expect("libc has .dynsym");
        let strings = elf[header(dynsym) + 40..header(dynsym) + 44].to_vec();
        let fake = header(shnum - 2);
        elf[fake + 4..fake + 8].copy_from_slice(&elf::SHT_SYMTAB.to_le_bytes());
        elf[fake + 32..fake + 40].copy_from_slice(&u64::MAX.to_le_bytes());
        elf[fake + 40..fake + 44].copy_from_slice(&strings);
        let bytes = ModuleBytes::memory(elf.into(), &crate::ModuleBudget::new());
        for limit in [None, Some(0), Some(1 << 20)] {
            let layout = read_layout(&bytes, limit).expect("still an ELF file");
            assert!(!layout.symbols.is_empty());
            assert_eq!(layout.over_limit.is_some(), limit == Some(0), "{limit:?}");
        }
    }
}
