//! Symbolization of distinct addresses, off the sampling path: ELF symbols and DWARF through
//! `addr2line` (function names, inlined frames, Rust and C++ demangling, source lines; separate
//! debug files through build id) and kernel addresses through `/proc/kallsyms`.

use std::path::Path;

/// One function frame at an address: the physical function first, then each inlined callee.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymbolFrame {
    /// Demangled function name.
    pub name: String,
    /// Source file, when known.
    pub file: Option<String>,
    /// Source line, when known.
    pub line: Option<u32>,
}

mod by_unit;
mod dwarf;
mod inflated_cache;
mod names;
mod names_cache;

pub(crate) use names_cache::dir as kept_names_dir;

use std::collections::HashMap;
use std::path::PathBuf;

use dwarf::{DwarfCache, DwarfReader};
use names_cache::KeptNames;
use rootline_image::ModuleBudget;

/// The memory a [`Symbolizer`] may hold: parsed DWARF, and the modules it loads for separate
/// debug files' symbol tables (counted with the recorder's other modules).
#[derive(Debug, Clone, Default)]
pub struct SymbolizerBudgets {
    /// Most bytes of parsed DWARF at once (None: no limit).
    pub dwarf: Option<usize>,
    /// Where loaded modules are counted.
    pub modules: ModuleBudget,
    /// Most memory the modules counted in `modules` may hold (None: no limit).
    pub module_limit: Option<usize>,
}

/// Turns addresses into function names. A binary's DWARF is loaded when first needed and kept
/// while it is in use, within an optional memory budget (see [`Symbolizer::with_budgets`]).
#[derive(Default)]
pub struct Symbolizer {
    dwarf: DwarfCache,
    kallsyms: Option<Kallsyms>,
    demangled: Demangled,
    /// Where names are kept between recordings (see [`Symbolizer::keeping_names`]).
    names_dir: Option<PathBuf>,
    /// Per binary path, its kept names (None: the file's identity could not be read).
    kept: HashMap<PathBuf, Option<KeptNames>>,
}

impl Symbolizer {
    /// An empty symbolizer.
    pub fn new() -> Symbolizer {
        Symbolizer::default()
    }

    /// An empty symbolizer held to `budgets`. Binaries whose DWARF does not fit are named from
    /// their symbol tables (and a separate debug file's, loaded as a module within the module
    /// budget), without inlined frames or source lines.
    pub fn with_budgets(budgets: SymbolizerBudgets) -> Symbolizer {
        Symbolizer {
            dwarf: DwarfCache::new(budgets),
            kallsyms: None,
            demangled: Demangled::default(),
            names_dir: None,
            kept: HashMap::new(),
        }
    }

    /// Keeps the demangled names of binaries named from their symbol tables alone (no DWARF) in
    /// `dir` between recordings, under each file's identity, so that a later recording reads
    /// and demangles only the functions it meets for the first time. Written by
    /// [`Symbolizer::write_kept_names`].
    pub fn keeping_names(mut self, dir: PathBuf) -> Symbolizer {
        self.names_dir = Some(dir);
        self
    }

    /// Writes the names met since they were last written (see [`Symbolizer::keeping_names`]).
    pub fn write_kept_names(&mut self) {
        if let Some(dir) = &self.names_dir {
            for kept in self.kept.values_mut().flatten() {
                kept.write(dir);
            }
        }
    }

    /// Estimated bytes of the DWARF loaded now.
    pub fn dwarf_bytes(&self) -> usize {
        self.dwarf.bytes()
    }

    /// Binaries whose DWARF did not fit the budget so far.
    pub fn dwarf_skipped(&self) -> u64 {
        self.dwarf.skipped()
    }

    /// Symbolizes link-time addresses (SVMAs) within the ELF file at `path`. For each address:
    /// its frames, physical function first, then inlined callees (empty when unknown).
    ///
    /// The physical function's name comes from the symbol table when it has one (the linker's
    /// name, demangled): `symbol` looks it up (`.symtab` and `.dynsym`). DWARF supplies inlined
    /// callees, lines, and names for code without a symbol.
    ///
    /// With a `build_id`, a separate debug file `/usr/lib/debug/.build-id/xx/yyyy.debug` (Debian's
    /// `-dbg` packages) is used for DWARF and the full symbol table when it exists. Without one,
    /// and without `debug_info` (DWARF) in the file itself, only `symbol` names
    /// the addresses: the file is not mapped for a symbol map that would add nothing. DWARF past
    /// the budget is not loaded (see [`Symbolizer::with_budgets`]). `symbol_start` gives the
    /// start of the symbol `symbol` names, under which a binary named from its symbol table alone
    /// keeps the name (see [`Symbolizer::keeping_names`]).
    pub fn symbolize_file(
        &mut self,
        path: &Path,
        build_id: Option<&str>,
        debug_info: bool,
        svmas: &[u64],
        symbol_start: impl Fn(u64) -> Option<u64>,
        symbol: impl Fn(u64) -> Option<String>,
    ) -> Vec<Vec<SymbolFrame>> {
        let entry = self.dwarf.get(path, build_id, debug_info);
        let demangled = &mut self.demangled;
        let symbols_alone = entry.dwarf.is_none() && entry.symbols.is_none();
        if let (Some(dir), true) = (&self.names_dir, symbols_alone) {
            // The file's identity, checked at every batch: names go only to the file they are of.
            let key = std::fs::metadata(path)
                .ok()
                .map(|m| rootline_image::file_key(&m));
            let kept = self.kept.entry(path.to_path_buf()).or_default();
            if kept.as_ref().map(KeptNames::key) != key {
                if let Some(old) = kept.as_mut() {
                    old.write(dir);
                }
                *kept = key.map(|key| KeptNames::read(dir, key));
            }
            if let Some(kept) = kept {
                return svmas
                    .iter()
                    .map(|&a| from_symbols_alone(a, &symbol_start, &symbol, kept, demangled))
                    .collect();
            }
        }
        let dwarf = entry.dwarf.as_ref();
        let debug_symbols = entry.symbols.as_ref();
        let closure = |linkage: &str| entry.closure_name(linkage).map(str::to_string);
        svmas
            .iter()
            .map(|&a| {
                let name = symbol(a).or_else(|| debug_symbols.and_then(|m| m.symbol_name(a)));
                symbolize_one(dwarf, a, name, &closure, demangled)
            })
            .collect()
    }

    /// Ends a batch of symbolization: lets go of the DWARF of binaries not used in the last few
    /// batches, and of the least recently used ones past a handful.
    pub fn end_batch(&mut self) {
        self.dwarf.end_batch();
    }

    /// The kernel function containing `addr`, from `/proc/kallsyms` (read on first use).
    pub fn kernel(&mut self, addr: u64) -> Option<&str> {
        self.kallsyms
            .get_or_insert_with(|| {
                Kallsyms::parse(&std::fs::read_to_string("/proc/kallsyms").unwrap_or_default())
            })
            .lookup(addr)
    }
}

/// The frame at `addr` of a binary without DWARF: its symbol's name, demangled, from `kept` when
/// the symbol was named before (else read, demangled and kept). What [`symbolize_one`] gives
/// without DWARF.
fn from_symbols_alone(
    addr: u64,
    symbol_start: &dyn Fn(u64) -> Option<u64>,
    symbol: &dyn Fn(u64) -> Option<String>,
    kept: &mut KeptNames,
    demangled: &mut Demangled,
) -> Vec<SymbolFrame> {
    let start = symbol_start(addr);
    let name = match start.and_then(|s| kept.get(s)) {
        Some(name) => name.to_string(),
        None => match symbol(addr) {
            Some(raw) => {
                let name = demangled.get(&raw);
                if let Some(start) = start {
                    kept.insert(start, &name);
                }
                name
            }
            None => String::new(),
        },
    };
    if name.is_empty() {
        return Vec::new();
    }
    vec![SymbolFrame {
        name,
        file: None,
        line: None,
    }]
}

/// The frames at `addr`, physical first. Names are the functions' linkage names demangled the
/// way their unit's language does (the bare `DW_AT_name` only where DWARF has no linkage name),
/// with Rust closures numbered by `closure` (see [`names`]).
fn symbolize_one(
    dwarf: Option<&DwarfReader>,
    addr: u64,
    symbol: Option<String>,
    closure: &dyn Fn(&str) -> Option<String>,
    demangled: &mut Demangled,
) -> Vec<SymbolFrame> {
    let numbered = |raw: &str| {
        names::is_legacy_closure(raw)
            .then(|| closure(raw))
            .flatten()
    };
    let mut frames = Vec::new();
    if let Some(dwarf) = dwarf {
        dwarf.find_frames(addr, &numbered, &mut frames);
    }
    // addr2line yields the innermost inlined frame first; the profile wants the physical first.
    frames.reverse();
    let symbol = symbol
        .or_else(|| dwarf.and_then(|d| d.find_symbol(addr)).map(str::to_string))
        .map(|s| numbered(&s).unwrap_or_else(|| demangled.get(&s)));
    match (symbol, frames.first_mut()) {
        (Some(symbol), Some(physical)) => physical.name = symbol,
        (Some(symbol), None) => frames.push(SymbolFrame {
            name: symbol,
            file: None,
            line: None,
        }),
        (None, _) => {}
    }
    frames.retain(|f| !f.name.is_empty());
    frames
}

/// Appends the frames `addr2line` found (innermost first) to `out`, each named by its function's
/// linkage name: a legacy Rust closure's numbered name when `numbered` knows it, else demangled
/// the way its unit's language does (the bare `DW_AT_name` where DWARF has no linkage name).
fn push_frames<R: addr2line::gimli::Reader>(
    frames: Option<addr2line::FrameIter<'_, R>>,
    numbered: &dyn Fn(&str) -> Option<String>,
    out: &mut Vec<SymbolFrame>,
) {
    let Some(mut iter) = frames else {
        return;
    };
    while let Ok(Some(frame)) = iter.next() {
        let name = frame
            .function
            .as_ref()
            .and_then(|f| {
                let raw = f.raw_name().ok()?;
                numbered(&raw).or_else(|| f.demangle().ok().map(|n| n.into_owned()))
            })
            .unwrap_or_default();
        let (file, line) = frame
            .location
            .map(|l| (l.file.map(str::to_string), l.line))
            .unwrap_or((None, None));
        out.push(SymbolFrame { name, file, line });
    }
}

/// Symbol-table names demangled so far: a function is sampled at many addresses (each call site
/// of it a return address), and C++ demangling is slow. At most [`Demangled::MAX`] names, then it
/// starts over.
#[derive(Default)]
struct Demangled {
    names: std::collections::HashMap<Box<str>, Box<str>>,
}

impl Demangled {
    const MAX: usize = 4096;

    /// [`demangle_symbol`] of `name`.
    fn get(&mut self, name: &str) -> String {
        if let Some(d) = self.names.get(name) {
            return d.to_string();
        }
        let d = demangle_symbol(name);
        if self.names.len() >= Self::MAX {
            self.names.clear();
        }
        self.names.insert(name.into(), d.as_str().into());
        d
    }
}

/// Demangles a symbol-table name when it is mangled (Itanium C++ / Rust legacy `_Z…`, Rust v0
/// `_R…`); any other name is a plain C name and stays as it is (a bare `a` must not become the
/// C++ type "signed char").
pub fn demangle_symbol(name: &str) -> String {
    if name.starts_with("_Z") || name.starts_with("_R") {
        addr2line::demangle_auto(name.into(), None).into_owned()
    } else {
        name.to_string()
    }
}

/// The kernel symbol table.
#[derive(Debug, Default)]
pub struct Kallsyms {
    symbols: Vec<(u64, String)>,
}

impl Kallsyms {
    /// Parses `/proc/kallsyms` text (`address type name [module]`), keeping text symbols.
    pub fn parse(text: &str) -> Kallsyms {
        let mut symbols: Vec<(u64, String)> = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let addr = u64::from_str_radix(f.next()?, 16).ok()?;
                let kind = f.next()?;
                let name = f.next()?;
                (addr != 0 && matches!(kind, "t" | "T" | "w" | "W"))
                    .then(|| (addr, name.to_string()))
            })
            .collect();
        symbols.sort_unstable_by_key(|s| s.0);
        Kallsyms { symbols }
    }

    /// The symbol at or before `addr`.
    pub fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self.symbols.partition_point(|s| s.0 <= addr);
        Some(&self.symbols.get(i.checked_sub(1)?)?.1)
    }

    /// Whether any symbol has a real address (kallsyms shows zeros without privilege).
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dwarf_is_let_go_after_a_few_unused_batches() {
        use dwarf::KEEP_BATCHES;
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let other = Path::new("/nonexistent/for-this-test");
        let mut s = Symbolizer::new();
        let symbolize = |s: &mut Symbolizer, path: &Path| {
            s.symbolize_file(path, None, true, &[0x1000], |_| None, |_| None);
        };
        symbolize(&mut s, &exe);
        assert!(s.dwarf.is_loaded(&exe), "the test binary has DWARF");
        assert!(s.dwarf_bytes() > 0);
        for _ in 0..KEEP_BATCHES - 1 {
            s.end_batch();
            symbolize(&mut s, other);
        }
        s.end_batch();
        assert!(s.dwarf.is_loaded(&exe), "used {KEEP_BATCHES} batches ago");
        symbolize(&mut s, other);
        s.end_batch();
        assert!(!s.dwarf.knows(&exe));
        assert!(s.dwarf.knows(other));
        assert_eq!(s.dwarf_bytes(), 0);
        // Without DWARF in the file (and no separate debug file), nothing is loaded.
        s.symbolize_file(&exe, None, false, &[0x1000], |_| None, |_| None);
        assert!(!s.dwarf.is_loaded(&exe));
    }

    #[test]
    fn dwarf_past_the_budget_is_not_loaded() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let cost = dwarf::dwarf_cost(&exe).expect("ELF");
        assert!(cost > 100_000, "the test binary's DWARF costs {cost}");
        let mut s = Symbolizer::with_budgets(SymbolizerBudgets {
            dwarf: Some(cost - 1),
            ..SymbolizerBudgets::default()
        });
        s.symbolize_file(&exe, None, true, &[0x1000], |_| None, |_| None);
        assert!(!s.dwarf.is_loaded(&exe));
        assert_eq!((s.dwarf_bytes(), s.dwarf_skipped()), (0, 1));
        let mut s = Symbolizer::with_budgets(SymbolizerBudgets {
            dwarf: Some(cost),
            ..SymbolizerBudgets::default()
        });
        s.symbolize_file(&exe, None, true, &[0x1000], |_| None, |_| None);
        assert!(s.dwarf.is_loaded(&exe));
        assert_eq!((s.dwarf_bytes(), s.dwarf_skipped()), (cost, 0));
    }

    #[test]
    fn names_kept_by_one_recording_name_the_next_without_reading_the_binary() {
        use std::cell::Cell;
        let dir = tempfile::tempdir().unwrap();
        let kept = dir.path().join("names");
        let binary = dir.path().join("lib.so");
        std::fs::write(&binary, b"not read: named from its symbols alone").unwrap();
        // 40 addresses, two in each function of 0x100 bytes (18 of them, then 4 addresses in
        // no symbol); mangled Rust names and C names.
        let svmas: Vec<u64> = (0..40u64).map(|i| 0x1000 + i * 0x80 + 3).collect();
        let start = |a: u64| (a < 0x2200).then_some(a & !0xff);
        let reads = Cell::new(0);
        let name = |a: u64| {
            reads.set(reads.get() + 1);
            let f = start(a)? >> 8;
            Some(if f % 2 == 0 {
                let id = format!("f{f}");
                format!("_ZN5crate{}{id}17h0123456789abcdefE", id.len())
            } else {
                format!("c_function_{f}")
            })
        };
        let symbolize =
            |s: &mut Symbolizer| s.symbolize_file(&binary, None, false, &svmas, start, name);
        let mut first = Symbolizer::new().keeping_names(kept.clone());
        let named = symbolize(&mut first);
        assert_eq!(named[0][0].name, "crate::f16");
        assert_eq!(named[2][0].name, "c_function_17");
        assert!(named[39].is_empty(), "no symbol past 0x2200");
        // Each of the 18 functions is read once, and each address outside them.
        assert_eq!(reads.get(), 22);
        first.write_kept_names();

        let mut second = Symbolizer::new().keeping_names(kept.clone());
        reads.set(0);
        assert_eq!(symbolize(&mut second), named);
        // Only the addresses outside every symbol are looked up again.
        assert_eq!(reads.get(), 4);
        // Without keeping, or once the binary is written again, names are read afresh.
        reads.set(0);
        assert_eq!(symbolize(&mut Symbolizer::new()), named);
        assert_eq!(reads.get(), 40);
        // The same symbolizer notices too (its next batch checks the file's identity).
        std::fs::write(&binary, b"written again").unwrap();
        reads.set(0);
        assert_eq!(symbolize(&mut second), named);
        assert_eq!(reads.get(), 22);
        second.write_kept_names();
        reads.set(0);
        assert_eq!(symbolize(&mut Symbolizer::new().keeping_names(kept)), named);
        assert_eq!(reads.get(), 4);
    }

    #[test]
    fn only_mangled_names_are_demangled() {
        assert_eq!(demangle_symbol("a"), "a");
        assert_eq!(demangle_symbol("b"), "b");
        assert_eq!(demangle_symbol("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(
            demangle_symbol("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
    }

    #[test]
    fn kallsyms_lookup_finds_the_enclosing_symbol() {
        let k = Kallsyms::parse(
            "ffffffff81000000 T _stext\nffffffff81000100 t do_thing\nffffffff81000200 D data\n",
        );
        assert_eq!(k.lookup(0xffffffff81000150), Some("do_thing"));
        assert_eq!(k.lookup(0xffffffff81000000), Some("_stext"));
        assert_eq!(k.lookup(0x1000), None);
    }
}
