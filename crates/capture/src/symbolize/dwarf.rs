//! The DWARF the symbolizer has loaded, one reader per binary (`addr2line`'s, or its units one at
//! a time for compressed DWARF), kept while in use and held to an optional memory budget.
//!
//! A loader's memory is not the file's size: DWARF sections are mapped, but compressed ones are
//! decompressed onto the heap and every unit's abbreviations are parsed (a Debian `-dbg` libc
//! takes about 34 MB; a 67 MB Rust binary with debug info about 16 MB). [`dwarf_cost`] estimates it
//! from the section headers before loading: decompressed sizes, plus 64 bytes per byte of
//! `.debug_abbrev`. A file read a unit at a time holds less (no location lists, only the units
//! looked up) but may come to read them all, so it is counted the same. A binary whose DWARF
//! does not fit is named from symbol tables only (a separate debug file's full symbol table is
//! still read), without inlined frames or lines.

use std::cell::OnceCell;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use object::elf::FileHeader64;
use object::read::elf::{FileHeader, SectionHeader};
use object::{Endianness, elf};

use super::by_unit::UnitDwarf;
use super::names::ClosureNames;
use super::{SymbolFrame, SymbolizerBudgets};
use crate::unwind::CodeModule;

/// Batches a binary's DWARF stays loaded after its last use ([`DwarfCache::end_batch`]).
pub(super) const KEEP_BATCHES: u64 = 5;
/// Most binaries whose DWARF stays loaded between batches.
const KEEP_LOADERS: usize = 8;
/// Estimated heap bytes per byte of `.debug_abbrev` (parsed once per unit).
const ABBREV_FACTOR: u64 = 64;

/// A binary's DWARF, read whole by `addr2line` or, when compressed, a unit at a time (see
/// [`super::by_unit`]).
pub(super) enum DwarfReader {
    /// Every unit read when the file is opened.
    Whole(Box<addr2line::Loader>),
    /// Each unit read when an address in it is first looked up.
    ByUnit(Box<UnitDwarf>),
}

impl DwarfReader {
    /// Reads the DWARF of the ELF file at `path`: a unit at a time when its `.debug_info` is
    /// compressed and `.debug_aranges` lists every unit, else whole.
    pub fn open(path: &Path) -> Option<DwarfReader> {
        match UnitDwarf::open(path) {
            Ok(by_unit) => Some(DwarfReader::ByUnit(Box::new(by_unit))),
            Err(_) => addr2line::Loader::new(path)
                .ok()
                .map(|loader| DwarfReader::Whole(Box::new(loader))),
        }
    }

    /// Appends the frames at link-time address `addr`, innermost first, to `out`.
    pub fn find_frames(
        &self,
        addr: u64,
        numbered: &dyn Fn(&str) -> Option<String>,
        out: &mut Vec<SymbolFrame>,
    ) {
        match self {
            DwarfReader::Whole(loader) => {
                super::push_frames(loader.find_frames(addr).ok(), numbered, out)
            }
            DwarfReader::ByUnit(by_unit) => by_unit.find_frames(addr, numbered, out),
        }
    }

    /// The name of the symbol-table symbol covering `addr` in the file the DWARF is read from.
    pub fn find_symbol(&self, addr: u64) -> Option<&str> {
        match self {
            DwarfReader::Whole(loader) => loader.find_symbol(addr),
            DwarfReader::ByUnit(by_unit) => by_unit.find_symbol(addr),
        }
    }
}

/// What is known about one binary's debug information.
pub(super) struct Entry {
    /// Its DWARF (or its separate debug file's), when loaded.
    pub dwarf: Option<DwarfReader>,
    /// The separate debug file's symbol table, when its DWARF was not loaded.
    pub symbols: Option<CodeModule>,
    /// The file the loaded DWARF is read from.
    source: Option<PathBuf>,
    /// Its closures' numbered names, read when first needed.
    closures: OnceCell<Option<ClosureNames>>,
    cost: usize,
    used: u64,
}

impl Entry {
    /// Nothing loaded.
    fn none(used: u64) -> Entry {
        Entry {
            dwarf: None,
            symbols: None,
            source: None,
            closures: OnceCell::new(),
            cost: 0,
            used,
        }
    }

    /// The numbered name of the Rust closure whose legacy linkage name is `linkage`, from the
    /// DWARF (read once per binary, when its first closure is named).
    pub fn closure_name(&self, linkage: &str) -> Option<&str> {
        let source = self.source.as_deref()?;
        self.closures
            .get_or_init(|| ClosureNames::read(source))
            .as_ref()?
            .get(linkage)
    }
}

/// Loaded DWARF by binary path (see the module documentation).
#[derive(Default)]
pub(super) struct DwarfCache {
    entries: HashMap<PathBuf, Entry>,
    batch: u64,
    budgets: SymbolizerBudgets,
    bytes: usize,
    skipped: u64,
}

impl DwarfCache {
    /// No DWARF loaded; at most `budgets.dwarf` bytes of it at once. Symbol tables of separate
    /// debug files are modules, held to the module budget with the others.
    pub fn new(budgets: SymbolizerBudgets) -> DwarfCache {
        DwarfCache {
            budgets,
            ..DwarfCache::default()
        }
    }

    /// The debug information of the binary at `path`: from the separate debug file named by
    /// `build_id` (`/usr/lib/debug/.build-id/xx/yyyy.debug`) when there is one, else from the file
    /// itself when it has `debug_info`, else none.
    pub fn get(&mut self, path: &Path, build_id: Option<&str>, debug_info: bool) -> &Entry {
        let batch = self.batch;
        let mut fresh = None;
        if !self.entries.contains_key(path) {
            let entry = self.load(path, build_id, debug_info);
            self.bytes += entry.cost;
            fresh = Some(entry);
        }
        let entry = self
            .entries
            .entry(path.to_path_buf())
            .or_insert_with(|| fresh.take().unwrap_or_else(|| Entry::none(batch)));
        entry.used = batch;
        entry
    }

    fn load(&mut self, path: &Path, build_id: Option<&str>, debug_info: bool) -> Entry {
        let debug_file = build_id
            .filter(|id| id.len() > 2 && id.bytes().all(|b| b.is_ascii_hexdigit()))
            .map(|id| {
                PathBuf::from(format!(
                    "/usr/lib/debug/.build-id/{}/{}.debug",
                    &id[..2],
                    &id[2..]
                ))
            })
            .filter(|p| p.is_file());
        let source = match &debug_file {
            Some(file) => file.as_path(),
            None if debug_info => path,
            None => return Entry::none(self.batch),
        };
        let cost = dwarf_cost(source).unwrap_or(0);
        if self.make_room(cost) {
            let mut loaded = DwarfReader::open(source).map(|l| (l, source));
            if loaded.is_none() && debug_file.is_some() && debug_info {
                // A separate debug file that does not load: the binary's own DWARF, if any.
                loaded = DwarfReader::open(path).map(|l| (l, path));
            }
            let (dwarf, source) = loaded.unzip();
            return Entry {
                dwarf,
                symbols: None,
                source: source.map(Path::to_path_buf),
                closures: OnceCell::new(),
                cost,
                used: self.batch,
            };
        }
        self.skipped += 1;
        let symbols = debug_file
            .and_then(|f| File::open(&f).ok().map(|file| (f, file)))
            .and_then(|(f, file)| {
                CodeModule::open(
                    &f.to_string_lossy(),
                    file,
                    &self.budgets.modules,
                    self.budgets.module_limit,
                )
                .ok()
            });
        Entry {
            dwarf: None,
            symbols,
            source: None,
            closures: OnceCell::new(),
            cost: 0,
            used: self.batch,
        }
    }

    /// Lets go of DWARF not used in this batch, least recently used first, until `cost` more
    /// bytes fit in the budget; false when they cannot.
    fn make_room(&mut self, cost: usize) -> bool {
        let Some(budget) = self.budgets.dwarf else {
            return true;
        };
        if cost > budget {
            return false;
        }
        while self.bytes + cost > budget {
            let batch = self.batch;
            let oldest = self
                .entries
                .iter()
                .filter(|(_, e)| e.cost > 0 && e.used < batch)
                .min_by_key(|(_, e)| e.used)
                .map(|(p, _)| p.clone());
            let Some(oldest) = oldest else {
                return false;
            };
            self.remove(&oldest);
        }
        true
    }

    fn remove(&mut self, path: &Path) {
        if let Some(e) = self.entries.remove(path) {
            self.bytes -= e.cost;
        }
    }

    /// Ends a batch: lets go of the DWARF of binaries not used in the last few batches, and of
    /// the least recently used ones past a handful.
    pub fn end_batch(&mut self) {
        let batch = self.batch;
        let stale: Vec<PathBuf> = self
            .entries
            .iter()
            .filter(|(_, e)| batch.saturating_sub(e.used) >= KEEP_BATCHES)
            .map(|(p, _)| p.clone())
            .collect();
        for p in stale {
            self.remove(&p);
        }
        if self.entries.len() > KEEP_LOADERS {
            let mut uses: Vec<u64> = self.entries.values().map(|e| e.used).collect();
            uses.sort_unstable_by(|a, b| b.cmp(a));
            let oldest_kept = uses[KEEP_LOADERS - 1];
            let old: Vec<PathBuf> = self
                .entries
                .iter()
                .filter(|(_, e)| e.used < oldest_kept)
                .map(|(p, _)| p.clone())
                .collect();
            for p in old {
                self.remove(&p);
            }
        }
        self.batch += 1;
    }

    /// Estimated bytes of the DWARF loaded now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Binaries whose DWARF did not fit the budget (named from symbol tables only).
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Whether DWARF of the binary at `path` is loaded.
    #[cfg(test)]
    pub fn is_loaded(&self, path: &Path) -> bool {
        self.entries.get(path).is_some_and(|e| e.dwarf.is_some())
    }

    /// Whether anything is known about the binary at `path`.
    #[cfg(test)]
    pub fn knows(&self, path: &Path) -> bool {
        self.entries.contains_key(path)
    }
}

/// Heap bytes loading the DWARF of the ELF file at `path` is expected to take (see the module
/// documentation), from its section headers.
pub(super) fn dwarf_cost(path: &Path) -> Option<usize> {
    use std::os::unix::fs::FileExt;
    let file = File::open(path).ok()?;
    let cache = object::ReadCache::new(&file);
    let header = FileHeader64::<Endianness>::parse(&cache).ok()?;
    let endian = header.endian().ok()?;
    let sections = header.sections(endian, &cache).ok()?;
    let mut cost = 0u64;
    for s in sections.iter() {
        let Ok(name) = sections.section_name(endian, s) else {
            continue;
        };
        if !name.starts_with(b".debug_") || s.sh_type(endian) == elf::SHT_NOBITS {
            continue;
        }
        let mut size = s.sh_size(endian);
        if s.sh_flags(endian) & u64::from(elf::SHF_COMPRESSED) != 0 {
            // Elf64_Chdr: ch_type, ch_reserved, then ch_size, the decompressed size.
            let mut ch_size = [0u8; 8];
            file.read_exact_at(&mut ch_size, s.sh_offset(endian) + 8)
                .ok()?;
            size = u64::from_le_bytes(ch_size);
            cost = cost.saturating_add(size);
        }
        if name == b".debug_abbrev" {
            cost = cost.saturating_add(size.saturating_mul(ABBREV_FACTOR));
        }
    }
    usize::try_from(cost).ok()
}
