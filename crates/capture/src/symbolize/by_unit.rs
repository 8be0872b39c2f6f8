//! A binary's compressed DWARF read one compilation unit at a time.
//!
//! `addr2line` reads every unit before its first lookup: each unit's header, abbreviations and
//! line-program header. A distribution's separate debug file for libc has 4,126 units, and a
//! recording that meets a few dozen of them paid for all (about a quarter of the recorder's
//! symbolizing). Such files list every unit's address ranges in `.debug_aranges`, so here a
//! lookup finds its unit there and only that unit is read, into an `addr2line` context of its
//! own; units are read once and kept with the file.
//!
//! A unit is read alone only when nothing in it can refer outside it: no attribute in its
//! abbreviations takes a form holding a `.debug_info` offset, a type signature or a
//! supplementary file's offset (`DW_FORM_ref_addr`, `DW_FORM_ref_sig8`, dwz's alternate forms),
//! or a form chosen per entry (`DW_FORM_indirect`), and none names a split-DWARF file. The first
//! unit that does not qualify sends the whole file to `addr2line`'s usual reading; units read
//! alone before it answered exactly as the whole file would.
//! This reading is used only for files whose `.debug_info` is zlib-compressed (distributions'
//! separate debug files): their sections must be decompressed onto the heap either way, and the
//! location lists, which naming never reads, are left compressed on disk.

use std::cell::OnceCell;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gimli::Reader as _;
use object::read::elf::ElfFile64;
use object::{Endianness, Object, ObjectSection};

use super::SymbolFrame;

/// Largest file whose symbol table is read from a copy of the whole file in memory.
const WHOLE_FILE_READ: u64 = 64 << 20;

/// The sections read, in the order [`UnitDwarf::read`] takes them: those a unit's context reads
/// (see [`Sections`]), then `.debug_aranges`.
const READ: [&str; 10] = [
    ".debug_abbrev",
    ".debug_addr",
    ".debug_info",
    ".debug_line",
    ".debug_line_str",
    ".debug_str",
    ".debug_str_offsets",
    ".debug_ranges",
    ".debug_rnglists",
    ".debug_aranges",
];

/// The section reader: a shared, decompressed section.
type Reader = gimli::EndianArcSlice<gimli::RunTimeEndian>;

/// Why a file is not read unit by unit (the caller reads it whole instead).
#[derive(Debug, thiserror::Error)]
pub(super) enum ByUnitError {
    #[error("cannot read the file: {0}")]
    Io(#[from] std::io::Error),
    #[error("not an ELF file this reading handles: {0}")]
    Elf(#[from] object::Error),
    #[error("its .debug_info is not zlib-compressed")]
    NotCompressed,
    #[error("not every unit is listed in .debug_aranges")]
    NotListed,
    #[error("a compressed section does not inflate to its stated size")]
    Inflate,
    #[error("its DWARF does not parse: {0}")]
    Dwarf(#[from] gimli::Error),
}

/// One unit listed in `.debug_aranges`: where its entries lie in `.debug_info`.
struct UnitSpan {
    offset: usize,
    len: usize,
    /// Its context, built on first use (None: the unit refers outside itself, or does not parse).
    context: OnceCell<Option<addr2line::Context<Reader>>>,
}

/// A file's DWARF read unit by unit (see the module documentation).
pub(super) struct UnitDwarf {
    path: PathBuf,
    sections: Sections,
    /// Address ranges, sorted by start, with the index of their unit in `units`.
    ranges: Vec<(u64, u64, usize)>,
    units: Vec<UnitSpan>,
    /// The file's symbol table (`.symtab`, else `.dynsym`), sorted by address.
    symbols: Vec<SymbolEntry>,
    /// The whole file through `addr2line`, once a unit could not be read alone.
    whole: OnceCell<Option<addr2line::Loader>>,
}

/// The sections a unit's context reads.
#[derive(Default)]
struct Sections {
    abbrev: Option<Reader>,
    addr: Option<Reader>,
    info: Option<Reader>,
    line: Option<Reader>,
    line_str: Option<Reader>,
    str: Option<Reader>,
    str_offsets: Option<Reader>,
    ranges: Option<Reader>,
    rnglists: Option<Reader>,
}

impl UnitDwarf {
    /// Reads the file at `path`: its naming sections (decompressed, or as kept decompressed in
    /// the cache, see [`super::inflated_cache`]), its `.debug_aranges` and its symbol table.
    /// Errors when the file is not one this reading is for.
    pub fn open(path: &Path) -> Result<UnitDwarf, ByUnitError> {
        UnitDwarf::open_kept(path, super::inflated_cache::dir().as_deref())
    }

    /// [`UnitDwarf::open`], with the decompressed sections kept in (and read from) the cache
    /// directory `cache`.
    fn open_kept(path: &Path, cache: Option<&Path>) -> Result<UnitDwarf, ByUnitError> {
        let file = File::open(path)?;
        let meta = file.metadata()?;
        let kept = cache.map(|dir| (dir, rootline_image::file_key(&meta)));
        let cache = object::ReadCache::new(&file);
        let elf = ElfFile64::<Endianness, _>::parse(&cache)?;
        let info = elf
            .section_by_name(".debug_info")
            .ok_or(ByUnitError::NotCompressed)?;
        if info.compressed_data()?.format != object::CompressionFormat::Zlib {
            return Err(ByUnitError::NotCompressed);
        }
        if meta.len() <= WHOLE_FILE_READ {
            // Read at once: the symbol table's names are then read from memory (a read per name
            // through the cache took longer than reading the whole file).
            let data = std::fs::read(path)?;
            UnitDwarf::read(path, &ElfFile64::<Endianness, _>::parse(&*data)?, kept)
        } else {
            UnitDwarf::read(path, &elf, kept)
        }
    }

    /// [`UnitDwarf::open`] from the parsed file; `kept`: the cache directory and the file's
    /// identity there.
    fn read<'data, R: object::ReadRef<'data>>(
        path: &Path,
        elf: &ElfFile64<'data, Endianness, R>,
        kept: Option<(&Path, rootline_image::FileKey)>,
    ) -> Result<UnitDwarf, ByUnitError> {
        let endian = if elf.is_little_endian() {
            gimli::RunTimeEndian::Little
        } else {
            gimli::RunTimeEndian::Big
        };
        let read = |name: &str| -> Result<Option<Arc<[u8]>>, ByUnitError> {
            let Some(section) = elf.section_by_name(name) else {
                return Ok(None);
            };
            let data = section.compressed_data()?;
            Ok(Some(match data.format {
                object::CompressionFormat::None => data.data.into(),
                object::CompressionFormat::Zlib => inflate(data.data, data.uncompressed_size)?,
                _ => return Err(ByUnitError::NotCompressed),
            }))
        };
        let from_cache = kept.and_then(|(dir, key)| super::inflated_cache::load(dir, &key, &READ));
        let was_kept = from_cache.is_some();
        let bytes: Vec<Option<Arc<[u8]>>> = match from_cache {
            Some(sections) => sections.into_iter().map(|(_, data)| data).collect(),
            None => READ
                .iter()
                .map(|name| read(name))
                .collect::<Result<Vec<_>, _>>()?,
        };
        let mut next = bytes
            .iter()
            .map(|b| b.clone().map(|b| Reader::new(b, endian)));
        let mut next = || next.next().flatten();
        // In the order of `READ`.
        let sections = Sections {
            abbrev: next(),
            addr: next(),
            info: next(),
            line: next(),
            line_str: next(),
            str: next(),
            str_offsets: next(),
            ranges: next(),
            rnglists: next(),
        };
        let aranges = next();
        let (ranges, units) = unit_ranges(&sections, aranges)?;
        // Kept only for a file read by unit.
        if let Some((dir, key)) = kept.filter(|_| !was_kept) {
            let named: Vec<(&str, Option<&[u8]>)> = READ
                .iter()
                .zip(&bytes)
                .map(|(&n, b)| (n, b.as_deref()))
                .collect();
            super::inflated_cache::store(dir, &key, &named);
        }
        Ok(UnitDwarf {
            path: path.to_path_buf(),
            sections,
            ranges,
            units,
            symbols: symbol_table(elf),
            whole: OnceCell::new(),
        })
    }

    /// Appends the frames at link-time address `addr` to `out` (innermost first, as `addr2line`
    /// gives them; see [`super::push_frames`]); nothing when no unit covers it.
    pub fn find_frames(
        &self,
        addr: u64,
        numbered: &dyn Fn(&str) -> Option<String>,
        out: &mut Vec<SymbolFrame>,
    ) {
        if self.whole.get().is_none() {
            let Some(span) = self.unit_at(addr) else {
                return;
            };
            if let Some(context) = span.context.get_or_init(|| self.context(span)) {
                let frames = context.find_frames(addr).skip_all_loads().ok();
                return super::push_frames(frames, numbered, out);
            }
        }
        // The file is read whole: this unit, or one before it, refers outside itself.
        let whole = self
            .whole
            .get_or_init(|| addr2line::Loader::new(&self.path).ok());
        if let Some(loader) = whole {
            super::push_frames(loader.find_frames(addr).ok(), numbered, out);
        }
    }

    /// The unit whose address ranges hold `addr`.
    fn unit_at(&self, addr: u64) -> Option<&UnitSpan> {
        let i = self
            .ranges
            .partition_point(|r| r.0 <= addr)
            .checked_sub(1)?;
        let (_, end, unit) = self.ranges[i];
        (addr < end).then(|| &self.units[unit])
    }

    /// The name of the symbol-table symbol covering `addr`.
    pub fn find_symbol(&self, addr: u64) -> Option<&str> {
        if let Some(Some(loader)) = self.whole.get() {
            return loader.find_symbol(addr);
        }
        let i = self
            .symbols
            .partition_point(|s| s.address <= addr)
            .checked_sub(1)?;
        let symbol = &self.symbols[i];
        (symbol.size == 0 || addr - symbol.address < symbol.size).then_some(&*symbol.name)
    }

    /// A context over the unit alone, when it refers to nothing outside itself.
    fn context(&self, span: &UnitSpan) -> Option<addr2line::Context<Reader>> {
        let info = self.sections.info.as_ref()?;
        if span.offset.checked_add(span.len)? > info.len() {
            return None;
        }
        let alone = info.range(span.offset..span.offset + span.len);
        let header = gimli::DebugInfo::from(alone.clone())
            .units()
            .next()
            .ok()??;
        if !matches!(header.type_(), gimli::UnitType::Compilation) {
            return None;
        }
        let abbrev = self.sections.abbrev.as_ref()?;
        if refers_outside(abbrev, header.debug_abbrev_offset().0).unwrap_or(true) {
            return None;
        }
        let s = &self.sections;
        let dwarf = gimli::Dwarf::load(|id| -> Result<Reader, gimli::Error> {
            let section = match id {
                gimli::SectionId::DebugInfo => Some(&alone),
                gimli::SectionId::DebugAbbrev => s.abbrev.as_ref(),
                gimli::SectionId::DebugAddr => s.addr.as_ref(),
                gimli::SectionId::DebugLine => s.line.as_ref(),
                gimli::SectionId::DebugLineStr => s.line_str.as_ref(),
                gimli::SectionId::DebugStr => s.str.as_ref(),
                gimli::SectionId::DebugStrOffsets => s.str_offsets.as_ref(),
                gimli::SectionId::DebugRanges => s.ranges.as_ref(),
                gimli::SectionId::DebugRngLists => s.rnglists.as_ref(),
                _ => None,
            };
            Ok(section
                .cloned()
                .unwrap_or_else(|| Reader::new(Arc::from([]), alone.endian())))
        })
        .ok()?;
        addr2line::Context::from_dwarf(dwarf).ok()
    }

    /// Units read alone so far (for tests).
    #[cfg(test)]
    pub fn units_read(&self) -> usize {
        self.units
            .iter()
            .filter(|u| u.context.get().is_some())
            .count()
    }

    /// Whether a unit sent the file to the whole reading (for tests).
    #[cfg(test)]
    pub fn reads_whole(&self) -> bool {
        self.whole.get().is_some()
    }
}

/// Inflates a zlib stream that must come to exactly `size` bytes (refused before allocating
/// when `size` is more than deflate can expand `compressed` to).
fn inflate(compressed: &[u8], size: u64) -> Result<Arc<[u8]>, ByUnitError> {
    const MAX_RATIO: u64 = 1_032;
    if size > (compressed.len() as u64).saturating_mul(MAX_RATIO) {
        return Err(ByUnitError::Inflate);
    }
    let size = usize::try_from(size).map_err(|_| ByUnitError::Inflate)?;
    let mut out = Vec::with_capacity(size);
    let mut z = flate2::Decompress::new(true);
    let status = z
        .decompress_vec(compressed, &mut out, flate2::FlushDecompress::Finish)
        .map_err(|_| ByUnitError::Inflate)?;
    if status != flate2::Status::StreamEnd || out.len() != size {
        return Err(ByUnitError::Inflate);
    }
    Ok(out.into())
}

/// The units `.debug_aranges` lists, and their address ranges sorted by start. Errors when a
/// unit of `.debug_info` is not listed (its ranges would be known only by reading it).
#[allow(clippy::type_complexity)]
fn unit_ranges(
    sections: &Sections,
    aranges: Option<Reader>,
) -> Result<(Vec<(u64, u64, usize)>, Vec<UnitSpan>), ByUnitError> {
    let info = sections.info.clone().ok_or(ByUnitError::NotCompressed)?;
    let aranges = aranges.ok_or(ByUnitError::NotListed)?;
    let debug_info = gimli::DebugInfo::from(info);
    let mut units = Vec::new();
    let mut index = std::collections::HashMap::new();
    let mut headers = debug_info.units();
    while let Some(header) = headers.next()? {
        let offset = header.offset().0;
        index.insert(offset, units.len());
        units.push(UnitSpan {
            offset,
            len: header.length_including_self(),
            context: OnceCell::new(),
        });
    }
    let mut listed = vec![false; units.len()];
    let mut ranges = Vec::new();
    let mut sets = gimli::DebugAranges::from(aranges).headers();
    while let Some(set) = sets.next()? {
        let Some(&unit) = index.get(&set.debug_info_offset().0) else {
            continue;
        };
        listed[unit] = true;
        let mut entries = set.entries();
        while let Some(entry) = entries.next()? {
            let range = entry.range();
            if range.end > range.begin {
                ranges.push((range.begin, range.end, unit));
            }
        }
    }
    if listed.iter().any(|&l| !l) {
        return Err(ByUnitError::NotListed);
    }
    ranges.sort_unstable();
    Ok((ranges, units))
}

/// Whether the abbreviation table at `offset` lets an entry refer outside its unit: a form
/// holding a `.debug_info` offset or a supplementary file's, a form chosen per entry, or a
/// split-DWARF file's name.
fn refers_outside(abbrev: &Reader, offset: usize) -> Result<bool, gimli::Error> {
    let mut r = abbrev.clone();
    r.skip(offset)?;
    loop {
        if r.read_uleb128()? == 0 {
            return Ok(false);
        }
        r.read_uleb128()?; // tag
        r.read_u8()?; // has children
        loop {
            let name = r.read_uleb128()?;
            let form = r.read_uleb128()?;
            if name == 0 && form == 0 {
                break;
            }
            if form == u64::from(gimli::DW_FORM_implicit_const.0) {
                r.read_sleb128()?;
            }
            let outside = [
                gimli::DW_FORM_ref_addr,
                gimli::DW_FORM_indirect,
                gimli::DW_FORM_GNU_ref_alt,
                gimli::DW_FORM_GNU_strp_alt,
                gimli::DW_FORM_ref_sup4,
                gimli::DW_FORM_ref_sup8,
                gimli::DW_FORM_strp_sup,
                gimli::DW_FORM_ref_sig8,
            ];
            let split = [gimli::DW_AT_dwo_name, gimli::DW_AT_GNU_dwo_name];
            if outside.iter().any(|f| u64::from(f.0) == form)
                || split.iter().any(|a| u64::from(a.0) == name)
            {
                return Ok(true);
            }
        }
    }
}

/// The file's defined function and data symbols by address (`.symtab`, or `.dynsym` when it has
/// none), chosen and sized as `addr2line` does for an address without DWARF: of symbols at one
/// address, one of known kind, with a size, of the widest scope, the last in the table; a symbol
/// without a size reaches the next symbol or its section's end.
fn symbol_table<'data, R: object::ReadRef<'data>>(
    elf: &ElfFile64<'data, Endianness, R>,
) -> Vec<SymbolEntry> {
    use object::{ObjectSymbol, ObjectSymbolTable, SymbolFlags, SymbolScope, SymbolSection};
    let Some(table) = elf.symbol_table().or_else(|| elf.dynamic_symbol_table()) else {
        return Vec::new();
    };
    // (address, rank: lower is better, later in the table first, size, name); an empty name
    // marks where a section ends.
    let mut all: Vec<(u64, u32, usize, u64, &str)> = Vec::new();
    for symbol in table.symbols() {
        let Ok(name) = symbol.name() else { continue };
        let SymbolFlags::Elf { st_info, .. } = symbol.flags() else {
            continue;
        };
        // Defined in a section: a function, a data object, or a symbol of no type (a label such
        // as ld.so's `_start`, though not an architecture's local mapping symbol such as `$x`).
        let local = st_info >> 4 == object::elf::STB_LOCAL;
        let kind = match st_info & 0xf {
            object::elf::STT_FUNC | object::elf::STT_OBJECT => 0,
            object::elf::STT_NOTYPE if !(local && name.starts_with('$')) => 1,
            _ => continue,
        };
        if name.is_empty() || !matches!(symbol.section(), SymbolSection::Section(_)) {
            continue;
        }
        let scope = match symbol.scope() {
            SymbolScope::Dynamic => 0,
            SymbolScope::Linkage => 1,
            SymbolScope::Compilation => 2,
            SymbolScope::Unknown => 3,
        };
        let rank = (kind * 2 + u32::from(symbol.size() == 0)) * 4 + scope;
        all.push((
            symbol.address(),
            rank,
            usize::MAX - symbol.index().0,
            symbol.size(),
            name,
        ));
    }
    for section in elf.sections() {
        let end = section.address().saturating_add(section.size());
        all.push((end, u32::MAX, usize::MAX, u64::MAX, ""));
    }
    all.sort_unstable();
    all.dedup_by_key(|s| s.0);
    let mut next = u64::MAX;
    let mut symbols: Vec<SymbolEntry> = Vec::with_capacity(all.len());
    for &(address, _, _, size, name) in all.iter().rev() {
        if !name.is_empty() {
            let size = if size == 0 {
                next.saturating_sub(address)
            } else {
                size
            };
            symbols.push(SymbolEntry {
                address,
                size,
                name: name.into(),
            });
        }
        next = address;
    }
    symbols.reverse();
    symbols
}

/// A symbol-table symbol: where it starts, how many bytes it covers (0: up to the next one), its
/// name.
struct SymbolEntry {
    address: u64,
    size: u64,
    name: Box<str>,
}

#[cfg(test)]
mod tests;
