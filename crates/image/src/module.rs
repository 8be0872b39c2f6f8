//! One loaded ELF file as the unwinder sees it: its unwind sections, CFI coverage, function starts
//! and symbols. The file stays on disk: only the unwind sections (`.eh_frame`, `.debug_frame`)
//! and compact tables are kept in memory; code bytes and symbol names are read
//! when asked for (module `bytes`). Every module's memory is counted ([`ModuleBudget::live_bytes`]) so a
//! long-running profiler can bound it. Nothing here touches a process.

use std::fs::File;
use std::sync::Arc;

use rootline_unwind::cfi::CfiIndexParts;
use rootline_unwind::{Binary, Section, SectionLayout, UnwindSections};

use crate::ElfError;
use crate::budget::ModuleBudget;
use crate::bytes::ModuleBytes;
use crate::layout::{self, NameRef, Segment, Symbol};
use crate::layout_cache;

/// Why an ELF file could not be used for unwinding.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// The file is not an ELF file the unwinder can read.
    #[error("cannot parse ELF file {name}: {source}")]
    Parse {
        /// Display name of the file.
        name: String,
        /// What is wrong with it.
        #[source]
        source: ElfError,
    },
    /// Loading the file would take the memory of all loaded modules past the budget.
    #[error(
        "not loading {name}: it needs about {needed} bytes and modules already hold {live} of the \
         {budget}-byte budget"
    )]
    OverBudget {
        /// Display name of the file.
        name: String,
        /// Memory the module needs (estimated from its headers, or measured once built).
        needed: usize,
        /// Memory all live modules held when it was refused.
        live: usize,
        /// The budget.
        budget: usize,
    },
}

/// A parsed ELF file: everything the unwinder needs, keyed by link-time addresses (SVMA).
pub struct CodeModule {
    name: String,
    bytes: ModuleBytes,
    segments: Vec<Segment>,
    sections: Arc<UnwindSections>,
    functions: Vec<(u64, u64)>,
    symbols: Vec<Symbol>,
    thread_entries: Vec<(u64, u64)>,
    build_id: Option<String>,
    debug_info: bool,
    heap_bytes: usize,
    /// Where `heap_bytes` is counted.
    budget: ModuleBudget,
}

impl std::fmt::Debug for CodeModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeModule")
            .field("name", &self.name)
            .field("fdes", &self.sections.fde_counts())
            .field("functions", &self.functions.len())
            .field("heap_bytes", &self.heap_bytes)
            .finish()
    }
}

impl Drop for CodeModule {
    fn drop(&mut self) {
        self.budget.sub_tables(self.heap_bytes);
    }
}

impl CodeModule {
    /// Parses the ELF file `file`, reading only its headers, symbol tables and unwind sections;
    /// the file is kept open for code bytes and names. `name` is used in messages. The module's memory is counted in `budget` while it lives.
    ///
    /// With a `limit`, the file is refused ([`ModuleError::OverBudget`]) when it would take the
    /// memory counted in `budget` past it (the code page cache all modules share,
    /// [`crate::PAGE_CACHE_BYTES`], has its room set aside): checked from the headers before the
    /// unwind sections are read, and again once the module is built.
    pub fn open(
        name: &str,
        file: File,
        budget: &ModuleBudget,
        limit: Option<usize>,
    ) -> Result<CodeModule, ModuleError> {
        CodeModule::open_cached(name, file, budget, limit, None)
    }

    /// [`CodeModule::open`], keeping what is slow to read of a large binary (its layout with
    /// its symbol tables, and its FDE indexes) in the directory `cache`, and reading it back
    /// from there while the file is unchanged.
    pub fn open_cached(
        name: &str,
        file: File,
        budget: &ModuleBudget,
        limit: Option<usize>,
        cache: Option<&std::path::Path>,
    ) -> Result<CodeModule, ModuleError> {
        let key = cache
            .and_then(|_| file.metadata().ok())
            .map(|m| layout_cache::key_of(&m));
        let kept = cache
            .zip(key.as_ref())
            .and_then(|(dir, key)| layout_cache::load(dir, key));
        let bytes = ModuleBytes::from_file(file, budget);
        if let Some((layout, indexes)) = kept {
            return CodeModule::build(name, Ok(layout), bytes, budget, limit, Some(indexes));
        }
        let layout = layout::read_layout(&bytes, limit.map(|l| budget.room(l)));
        let keep = match (&layout, cache, key) {
            (Ok(l), Some(dir), Some(key)) if layout_cache::worth_keeping(l) => {
                Some((l.clone(), dir, key))
            }
            _ => None,
        };
        let module = CodeModule::build(name, layout, bytes, budget, limit, None)?;
        if let Some((layout, dir, key)) = keep {
            layout_cache::store(dir, &key, &layout, &module.sections.index_parts());
        }
        Ok(module)
    }

    /// Parses an ELF file already in memory (the vDSO). `name`, `budget` and `limit` as for
    /// [`CodeModule::open`].
    pub fn parse(
        name: &str,
        bytes: Arc<[u8]>,
        budget: &ModuleBudget,
        limit: Option<usize>,
    ) -> Result<CodeModule, ModuleError> {
        let bytes = ModuleBytes::memory(bytes, budget);
        let layout = layout::read_layout(&bytes, limit.map(|l| budget.room(l)));
        CodeModule::build(name, layout, bytes, budget, limit, None)
    }

    fn build(
        name: &str,
        layout: Result<layout::Layout, ElfError>,
        bytes: ModuleBytes,
        budget: &ModuleBudget,
        limit: Option<usize>,
        indexes: Option<[CfiIndexParts; 2]>,
    ) -> Result<CodeModule, ModuleError> {
        let mut layout = layout.map_err(|source| ModuleError::Parse {
            name: name.to_string(),
            source,
        })?;
        // No spare capacity: a module built from a kept layout, whose tables are read at their
        // size, must count the same bytes in the budget as one read from the file.
        layout.segments.shrink_to_fit();
        layout.functions.shrink_to_fit();
        layout.symbols.shrink_to_fit();
        layout.thread_entries.shrink_to_fit();
        let over_budget = |needed: usize| {
            let limit = limit?;
            (!budget.fits(needed, limit)).then(|| ModuleError::OverBudget {
                name: name.to_string(),
                needed,
                live: budget.live_bytes(),
                budget: limit,
            })
        };
        // A layout read only up to the room left carries the extrapolated need, past the room.
        let estimate = layout.over_limit.unwrap_or_else(|| layout.estimate_bytes());
        if let Some(refused) = over_budget(estimate) {
            return Err(refused);
        }
        if layout.over_limit.is_some() {
            // (Only if the room grew meanwhile; the next attempt reads it all.)
            return Err(ModuleError::OverBudget {
                name: name.to_string(),
                needed: estimate,
                live: budget.live_bytes(),
                budget: limit.unwrap_or(0),
            });
        }
        let file_len = bytes.len();
        let section = |p: Option<layout::Placed>| -> Option<Section> {
            let p = p?;
            let end = p.offset.checked_add(p.size)?;
            if end > file_len {
                return None;
            }
            let data = bytes.read_exact_shared(p.offset, usize::try_from(p.size).ok()?)?;
            Some(Section { svma: p.svma, data })
        };
        let section_layout = SectionLayout {
            text: layout.text,
            got: layout.got,
            eh_frame: section(layout.eh_frame),
            eh_frame_hdr: layout.eh_frame_hdr.map(|p| p.svma),
            debug_frame: section(layout.debug_frame),
        };
        let sections = match indexes {
            Some([eh, debug]) => UnwindSections::with_indexes(section_layout, eh, debug),
            None => UnwindSections::new(section_layout),
        };
        let module = CodeModule {
            name: name.to_string(),
            bytes,
            segments: layout.segments,
            sections: Arc::new(sections),
            functions: layout.functions,
            symbols: layout.symbols,
            thread_entries: layout.thread_entries,
            build_id: layout.build_id,
            debug_info: layout.debug_info,
            heap_bytes: 0,
            budget: budget.clone(),
        }
        .counted();
        // The estimate may be short (the FDE count is only known now): check what was built.
        if let Some(refused) = over_budget(0) {
            let needed = module.heap_bytes;
            drop(module);
            return Err(match refused {
                ModuleError::OverBudget {
                    name, live, budget, ..
                } => ModuleError::OverBudget {
                    name,
                    needed,
                    live: live - needed,
                    budget,
                },
                other => other,
            });
        }
        Ok(module)
    }

    /// Measures the module and counts it in its budget.
    fn counted(mut self) -> CodeModule {
        self.heap_bytes = self.measure();
        self.budget.add_tables(self.heap_bytes);
        self
    }

    fn measure(&self) -> usize {
        std::mem::size_of::<CodeModule>()
            + self.name.len()
            + self.sections.heap_bytes()
            + self.segments.capacity() * std::mem::size_of::<Segment>()
            + self.functions.capacity() * 16
            + self.symbols.capacity() * std::mem::size_of::<Symbol>()
            + self.thread_entries.capacity() * 16
    }

    /// The open file the module reads from (None for bytes in memory).
    pub fn file(&self) -> Option<&File> {
        self.bytes.file()
    }

    /// Memory this module holds, in bytes: its unwind sections, FDE indexes, symbol and function
    /// tables (the code pages it caches, at most 128 KiB, are counted in [`ModuleBudget::live_bytes`]
    /// while cached). The file itself is not read into memory.
    pub fn heap_bytes(&self) -> usize {
        self.heap_bytes
    }

    /// Display name (usually the path).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Hex GNU build id, when the file has one.
    pub fn build_id(&self) -> Option<&str> {
        self.build_id.as_deref()
    }

    /// Whether the file has DWARF debug information (`.debug_info`). A separate debug file (found
    /// through the build id) is not counted.
    pub fn has_debug_info(&self) -> bool {
        self.debug_info
    }

    /// Whether the file has any CFI (`.eh_frame` or `.debug_frame` FDEs).
    pub fn has_cfi(&self) -> bool {
        self.sections.has_cfi()
    }

    /// Number of FDEs in `.eh_frame` and in `.debug_frame`.
    pub fn fde_counts(&self) -> (usize, usize) {
        self.sections.fde_counts()
    }

    /// Link-time address ranges whose CFI rows need full-register evaluation (`.eh_frame`
    /// ranges, then `.debug_frame` ones): see [`rootline_unwind::cfi`].
    pub fn full_register_ranges(&self) -> Vec<(u64, u64)> {
        self.sections.full_register_ranges()
    }

    /// Whether an `.eh_frame` FDE covers the link-time address `svma`.
    pub fn eh_frame_covers(&self, svma: u64) -> bool {
        self.sections.eh_frame_covers(svma)
    }

    /// Whether a `.debug_frame` FDE covers the link-time address `svma`.
    pub fn debug_frame_covers(&self, svma: u64) -> bool {
        self.sections.debug_frame_covers(svma)
    }

    /// Start of the function containing `svma`, from the symbol tables (None when unknown).
    pub fn function_start(&self, svma: u64) -> Option<u64> {
        let (start, end) = self.function_before(svma)?;
        // A symbol with a size must contain the address; a sizeless boundary is trusted up to the
        // next boundary (the gap check keeps a far-away start from being used).
        if end > start && svma >= end {
            return None;
        }
        Some(start)
    }

    /// End of the function containing `svma`, when its symbol has a size (None when unknown).
    pub fn function_end(&self, svma: u64) -> Option<u64> {
        let (start, end) = self.function_before(svma)?;
        (end > start && svma < end).then_some(end)
    }

    /// The function symbol starting last at or before `svma`: `(start, end)`.
    fn function_before(&self, svma: u64) -> Option<(u64, u64)> {
        let i = self.functions.partition_point(|f| f.0 <= svma);
        self.functions.get(i.checked_sub(1)?).copied()
    }

    /// The (raw, possibly mangled) name of the symbol containing `svma`, from `.symtab` or
    /// `.dynsym` (read from the file).
    pub fn symbol_name(&self, svma: u64) -> Option<String> {
        match self.symbol_at(svma)?.name {
            NameRef::At(offset) => self.bytes.read_name(offset).filter(|n| !n.is_empty()),
            NameRef::Plt(offset) => self
                .bytes
                .read_name(offset)
                .filter(|n| !n.is_empty())
                .map(|n| n + "@plt"),
            NameRef::Plt0 => Some("plt0@plt".into()),
            NameRef::Entry => Some("_start".into()),
        }
    }

    /// The start of the symbol holding `svma` (the one [`CodeModule::symbol_name`] names).
    pub fn symbol_start(&self, svma: u64) -> Option<u64> {
        Some(self.symbol_at(svma)?.start)
    }

    fn symbol_at(&self, svma: u64) -> Option<&Symbol> {
        let i = self.symbols.partition_point(|s| s.start <= svma);
        let symbol = self.symbols.get(i.checked_sub(1)?)?;
        (svma < symbol.end).then_some(symbol)
    }

    /// Whether `svma` lies in a function that starts threads ([`rootline_unwind::policy::is_thread_entry`]).
    pub fn in_thread_entry(&self, svma: u64) -> bool {
        let i = self.thread_entries.partition_point(|f| f.0 <= svma);
        i.checked_sub(1)
            .and_then(|i| self.thread_entries.get(i))
            .is_some_and(|&(_, end)| svma < end)
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

    /// Fills `buf` with code bytes from link-time address `svma` and returns them (fewer at the
    /// end of a segment); None when no segment maps `svma` from the file or the file cannot be
    /// read there.
    pub fn code<'b>(&self, svma: u64, buf: &'b mut [u8]) -> Option<&'b [u8]> {
        let seg = self
            .segments
            .iter()
            .find(|s| svma >= s.vaddr && svma < s.vaddr + s.filesz)?;
        let offset = svma - seg.vaddr + seg.offset;
        let in_segment = usize::try_from(seg.offset + seg.filesz - offset).unwrap_or(usize::MAX);
        let len = buf.len().min(in_segment);
        // A read that falls short of the segment's bytes is a failure, not shorter code.
        let n = self.bytes.read_cached(offset, &mut buf[..len]);
        (n == len).then_some(&buf[..n])
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
        let mut table = Vec::new();
        let mut thread_entries = Vec::new();
        for &(start, end, name) in symbols {
            table.push(Symbol {
                start,
                end,
                name: NameRef::At(bytes.len() as u64),
            });
            bytes.extend_from_slice(name.as_bytes());
            bytes.push(0);
            if rootline_unwind::policy::is_thread_entry(name) {
                thread_entries.push((start, end));
            }
        }
        CodeModule {
            name: "synthetic".into(),
            bytes: ModuleBytes::memory(bytes.into(), &ModuleBudget::new()),
            segments: vec![Segment {
                vaddr: text_svma,
                offset: 0,
                filesz: code.len() as u64,
                exec: true,
            }],
            sections: Arc::new(UnwindSections::new(SectionLayout {
                text: Some(text_svma..text_svma + code.len() as u64),
                eh_frame: (!eh_frame.is_empty()).then(|| Section {
                    svma: eh_frame_svma..eh_frame_svma + eh_frame.len() as u64,
                    data: eh_frame.into(),
                }),
                ..SectionLayout::default()
            })),
            functions: symbols.iter().map(|s| (s.0, s.1)).collect(),
            symbols: table,
            thread_entries,
            build_id: None,
            debug_info: false,
            heap_bytes: 0,
            budget: ModuleBudget::new(),
        }
        .counted()
    }
}

impl Binary for CodeModule {
    fn name(&self) -> &str {
        &self.name
    }

    fn unwind_sections(&self) -> &Arc<UnwindSections> {
        &self.sections
    }

    fn code<'b>(&self, svma: u64, buf: &'b mut [u8]) -> Option<&'b [u8]> {
        CodeModule::code(self, svma, buf)
    }

    fn function_start(&self, svma: u64) -> Option<u64> {
        CodeModule::function_start(self, svma)
    }

    fn function_end(&self, svma: u64) -> Option<u64> {
        CodeModule::function_end(self, svma)
    }

    fn in_thread_entry(&self, svma: u64) -> bool {
        CodeModule::in_thread_entry(self, svma)
    }

    fn is_interpreter_reentry(&self, svma: u64) -> bool {
        self.function_start(svma) == Some(svma)
            && self
                .symbol_name(svma)
                .is_some_and(|n| rootline_unwind::policy::is_interpreter_reentry(&n))
    }

    fn svma_of_file_offset(&self, offset: u64) -> Option<u64> {
        CodeModule::svma_of_file_offset(self, offset)
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
            bytes: ModuleBytes::memory(Arc::from(&[][..]), &ModuleBudget::new()),
            segments,
            sections: Arc::new(UnwindSections::new(SectionLayout::default())),
            functions: Vec::new(),
            symbols: Vec::new(),
            thread_entries: Vec::new(),
            build_id: None,
            debug_info: false,
            heap_bytes: 0,
            budget: ModuleBudget::new(),
        };
        assert_eq!(module.svma_of_file_offset(0x249000), Some(0x24a000));
        assert_eq!(module.svma_of_file_offset(0x1000), Some(0x1000));
    }

    #[test]
    fn code_is_shorter_only_at_a_segment_end_and_missing_where_the_file_is_short() {
        let code: Vec<u8> = (0..0x10).collect();
        let m = CodeModule::synthetic(0x1000, &code, 0, &[], &[]);
        let mut buf = [0u8; 16];
        // The segment ends after 16 bytes: 8 are there.
        assert_eq!(m.code(0x1008, &mut buf), Some(&code[8..]));
        assert_eq!(m.code(0x1010, &mut buf), None, "past the segment");
        // A segment the file is too short for: its bytes cannot be read, so there are none.
        let mut short = CodeModule::synthetic(0x1000, &code, 0, &[], &[]);
        short.segments[0].filesz = 0x100;
        assert_eq!(short.code(0x1008, &mut buf), None);
        assert_eq!(short.code(0x1000, &mut buf[..8]), Some(&code[..8]));
    }

    #[test]
    fn a_large_librarys_kept_layout_builds_the_same_module() {
        // The compiler's driver library: the kind of binary whose layout is kept.
        let sysroot = std::process::Command::new("rustc")
            .args(["--print", "sysroot"])
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        let driver = sysroot
            .and_then(|s| std::fs::read_dir(format!("{s}/lib")).ok())
            .and_then(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .find(|p| p.to_string_lossy().contains("librustc_driver-"))
            });
        let Some(path) = driver else {
            eprintln!("skipped: no librustc_driver in rustc's sysroot");
            return;
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let open = || {
            let file = File::open(&path).expect("the driver");
            CodeModule::open_cached("driver", file, &ModuleBudget::new(), None, Some(dir.path()))
                .expect("parses")
        };
        let read = open();
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 1);
        let kept = open();
        let symbols = |m: &CodeModule| -> Vec<(u64, u64, String)> {
            m.symbols
                .iter()
                .map(|s| (s.start, s.end, format!("{:?}", s.name)))
                .collect()
        };
        assert!(read.symbols.len() >= layout_cache::MIN_SYMBOLS);
        assert_eq!(symbols(&read), symbols(&kept));
        assert_eq!(read.functions, kept.functions);
        assert_eq!(read.thread_entries, kept.thread_entries);
        assert_eq!(read.fde_counts(), kept.fde_counts());
        assert_eq!(read.sections.index_parts(), kept.sections.index_parts());
        // Both count the same memory in the budget.
        assert_eq!(read.heap_bytes(), kept.heap_bytes());
        // The kept index finds the same FDEs and rows as the one read from the file.
        let exec = read
            .segments
            .iter()
            .find(|s| s.exec)
            .expect("a code segment");
        let text = exec.vaddr..exec.vaddr + exec.filesz;
        let step = ((text.end - text.start) / 2_000).max(1);
        for svma in (text.start..text.end).step_by(step as usize) {
            assert_eq!(
                read.sections.row_class(false, svma),
                kept.sections.row_class(false, svma),
                "{svma:#x}"
            );
        }
        assert_eq!(read.build_id(), kept.build_id());
        assert_eq!(
            format!("{:?}", read.segments),
            format!("{:?}", kept.segments)
        );
        // A file changed since is read again (its change time moved).
        let later = File::open(&path).expect("the driver");
        let meta = later.metadata().expect("metadata");
        let mut key = layout_cache::key_of(&meta);
        assert!(layout_cache::load(dir.path(), &key).is_some());
        key[6] += 1;
        assert!(layout_cache::load(dir.path(), &key).is_none());
    }

    #[test]
    fn this_binary_has_few_full_register_rows() {
        let file = File::open("/proc/self/exe").expect("own executable");
        let m = CodeModule::open("self", file, &ModuleBudget::new(), None).expect("parses");
        assert!(m.fde_counts().0 > 1000, "{m:?}");
        // Hand-written assembly and stack realignment aside, compiled code needs only rsp/rbp.
        assert!(
            m.full_register_ranges().len() * 100 < m.fde_counts().0,
            "{m:?}"
        );
    }

    #[test]
    fn a_stripped_executable_names_its_entry_point_start() {
        // Debian's coreutils are stripped dynamically linked executables: no symbol at all at
        // their entry point, where the main thread's stack begins.
        let path = "/usr/bin/true";
        let bytes = std::fs::read(path).expect("coreutils' true");
        let entry = u64::from_le_bytes(bytes[24..32].try_into().unwrap());
        let m = CodeModule::open(path, File::open(path).unwrap(), &ModuleBudget::new(), None)
            .expect("parses");
        assert_eq!(m.symbol_name(entry + 0x29).as_deref(), Some("_start"));
        assert_eq!(m.symbol_name(entry + 0x40), None);
    }
}
