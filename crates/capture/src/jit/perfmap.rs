//! Perf maps (`/tmp/perf-PID.map`): one line per piece of JIT code, `START SIZE NAME`, with START
//! and SIZE in hexadecimal (optional `0x`, any case, any padding) and a NAME that may hold spaces.
//!
//! Runtimes append to the file while they run, so [`PerfMap`] reads it incrementally: each
//! [`PerfMap::read_more`] consumes only the bytes appended since the last call and keeps a torn
//! last line (a write in progress) until its newline arrives. Later entries replace earlier ones
//! they overlap (code memory reused after a method was freed or moved). A NUL byte ends an entry
//! as a newline does (.NET 8 writes one in place of a newline now and then).

use std::collections::BTreeMap;
use std::io::{self, Read, Seek, SeekFrom};

use super::names::{JitName, parse_name};

/// One perf-map line, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerfMapEntry {
    /// First code address.
    pub start: u64,
    /// Code size in bytes (at least 1).
    pub size: u64,
    /// The name as the runtime wrote it.
    pub raw: String,
}

/// Why a perf-map line was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("perf map line {line}: {reason}")]
pub struct LineError {
    /// 1-based line number.
    pub line: u64,
    /// What is wrong with it.
    pub reason: &'static str,
}

fn hex(field: &str) -> Option<u64> {
    let digits = field
        .strip_prefix("0x")
        .or_else(|| field.strip_prefix("0X"))
        .unwrap_or(field);
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// Parses one line (without its newline). `line` is the 1-based number used in errors.
pub fn parse_line(text: &str, line: u64) -> Result<PerfMapEntry, LineError> {
    let err = |reason| LineError { line, reason };
    let text = text.trim_end_matches('\r').trim_start();
    let (start, rest) = text
        .split_once([' ', '\t'])
        .ok_or(err("fewer than 3 fields"))?;
    let rest = rest.trim_start();
    let (size, name) = rest
        .split_once([' ', '\t'])
        .ok_or(err("fewer than 3 fields"))?;
    let start = hex(start).ok_or(err("start address is not hexadecimal"))?;
    let size = hex(size).ok_or(err("size is not hexadecimal"))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(err("empty name"));
    }
    if size == 0 || start.checked_add(size).is_none() {
        return Err(err("empty or overflowing address range"));
    }
    Ok(PerfMapEntry {
        start,
        size,
        raw: name.to_string(),
    })
}

/// A symbol from a JIT map: its code range and parsed name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitSymbol {
    /// First code address.
    pub start: u64,
    /// One past the last code address.
    pub end: u64,
    /// The parsed name.
    pub name: JitName,
}

impl JitSymbol {
    /// Memory the symbol takes in a [`SymbolTable`]: its entry (with the tree's slack) and its
    /// strings.
    fn heap_bytes(&self) -> usize {
        let text = |s: &Option<String>| s.as_ref().map_or(0, String::capacity);
        (8 + std::mem::size_of::<JitSymbol>()) * 3 / 2
            + self.name.name.capacity()
            + text(&self.name.module)
            + text(&self.name.file)
            + text(&self.name.system_name)
            + text(&self.name.tier)
    }
}

/// Non-overlapping JIT symbols by start address; a newer symbol replaces the ones it overlaps.
#[derive(Debug, Default, Clone)]
pub struct SymbolTable {
    by_start: BTreeMap<u64, JitSymbol>,
    bytes: usize,
}

impl SymbolTable {
    /// Inserts a symbol, removing every older one it overlaps.
    pub fn insert(&mut self, symbol: JitSymbol) {
        let (start, end) = (symbol.start, symbol.end);
        if let Some((&s, prev)) = self.by_start.range(..start).next_back()
            && prev.end > start
        {
            self.remove(s);
        }
        let covered: Vec<u64> = self.by_start.range(start..end).map(|(&s, _)| s).collect();
        for s in covered {
            self.remove(s);
        }
        self.bytes += symbol.heap_bytes();
        self.by_start.insert(start, symbol);
    }

    fn remove(&mut self, start: u64) {
        if let Some(old) = self.by_start.remove(&start) {
            self.bytes -= old.heap_bytes();
        }
    }

    /// Memory the table holds, in bytes (estimated from its entries and their strings).
    pub fn heap_bytes(&self) -> usize {
        self.bytes
    }

    /// The symbol containing `addr`.
    pub fn lookup(&self, addr: u64) -> Option<&JitSymbol> {
        let (_, s) = self.by_start.range(..=addr).next_back()?;
        (addr < s.end).then_some(s)
    }

    /// Number of symbols.
    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    /// Whether there are no symbols.
    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }
}

/// Longest torn last line held back for its newline; a longer one is dropped up to its newline
/// (reported as a line that does not parse) so that a file without newlines cannot make the
/// reader hold and rescan all of it.
const MAX_HELD_LINE: usize = 64 << 10;

/// The text reported in place of a line longer than [`MAX_HELD_LINE`].
const OVERLONG_LINE: &str = "<line longer than 64 KiB>";

/// The complete lines appended to a text file since the last read; a last line without its
/// newline (a write in progress) is held back until the newline arrives.
#[derive(Debug, Default)]
pub(crate) struct AppendedLines {
    offset: u64,
    pending: Vec<u8>,
    lines: u64,
    /// Inside an overlong line: everything up to its newline is dropped.
    skipping: bool,
}

impl AppendedLines {
    /// Reads what was appended to `source` and returns each new complete, non-empty line with
    /// its 1-based line number.
    pub(crate) fn read<R: Read + Seek>(
        &mut self,
        source: &mut R,
    ) -> io::Result<Vec<(u64, String)>> {
        source.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::new();
        let n = source.take(64 << 20).read_to_end(&mut buf)?;
        self.offset += n as u64;
        self.pending.extend_from_slice(&buf);
        let mut out = Vec::new();
        if self.skipping {
            let Some(nl) = self.pending.iter().position(|&b| b == b'\n') else {
                self.pending.clear();
                return Ok(out);
            };
            self.pending.drain(..=nl);
            self.skipping = false;
            self.lines += 1;
            out.push((self.lines, OVERLONG_LINE.to_string()));
        }
        let Some(last_nl) = self.pending.iter().rposition(|&b| b == b'\n') else {
            if self.pending.len() > MAX_HELD_LINE {
                self.pending.clear();
                self.skipping = true;
            }
            return Ok(out);
        };
        let complete: Vec<u8> = self.pending.drain(..=last_nl).collect();
        for raw in complete[..last_nl].split(|&b| b == b'\n') {
            self.lines += 1;
            // .NET 8's perf map now and then ends an entry with a NUL byte instead of its
            // newline: the next entry follows on the same line.
            for entry in raw.split(|&b| b == 0).filter(|e| !e.is_empty()) {
                out.push((self.lines, String::from_utf8_lossy(entry).into_owned()));
            }
        }
        Ok(out)
    }

    /// Bytes consumed so far (complete lines plus a held-back torn line).
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }
}

/// An incrementally read perf map.
#[derive(Debug)]
pub struct PerfMap<R> {
    source: R,
    lines: AppendedLines,
    /// Lines that did not parse (kept for reporting; the rest of the file is still used).
    pub bad_lines: Vec<LineError>,
    /// The symbols read so far.
    pub symbols: SymbolTable,
}

impl<R: Read + Seek> PerfMap<R> {
    /// A map read from `source` (nothing is read until [`PerfMap::read_more`]).
    pub fn new(source: R) -> PerfMap<R> {
        PerfMap {
            source,
            lines: AppendedLines::default(),
            bad_lines: Vec::new(),
            symbols: SymbolTable::default(),
        }
    }

    /// Reads what was appended since the last call; returns the number of new entries. A last
    /// line without its newline is kept back until the rest of it is written.
    pub fn read_more(&mut self) -> io::Result<usize> {
        let mut added = 0;
        for (line, text) in self.lines.read(&mut self.source)? {
            match parse_line(&text, line) {
                Ok(e) => {
                    self.symbols.insert(JitSymbol {
                        start: e.start,
                        end: e.start + e.size,
                        name: parse_name(&e.raw),
                    });
                    added += 1;
                }
                Err(e) => {
                    if self.bad_lines.len() < 16 {
                        self.bad_lines.push(e);
                    }
                }
            }
        }
        Ok(added)
    }

    /// Bytes consumed so far (complete lines plus a held-back torn line).
    pub fn offset(&self) -> u64 {
        self.lines.offset()
    }

    /// Reads the file from its start again at the next [`PerfMap::read_more`], keeping the
    /// symbols read so far (newer entries replace those they overlap): for a runtime that
    /// rewrites its map whole (HotSpot's `Compiler.perfmap`).
    pub fn rewind(&mut self) {
        self.lines = AppendedLines::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    #[test]
    fn a_symbol_tables_memory_follows_its_entries() {
        let symbol = |start: u64, end: u64, name: &str| JitSymbol {
            start,
            end,
            name: parse_name(name),
        };
        let mut t = SymbolTable::default();
        assert_eq!(t.heap_bytes(), 0);
        t.insert(symbol(0x100, 0x200, "LazyCompile:*a /x.js:1:1"));
        t.insert(symbol(0x200, 0x300, "LazyCompile:*b /x.js:2:1"));
        let two = t.heap_bytes();
        assert!(two > 2 * std::mem::size_of::<JitSymbol>(), "{two}");
        // Code memory reused: one new symbol over both old ones.
        t.insert(symbol(0x180, 0x280, "c"));
        assert_eq!(t.len(), 1);
        assert_eq!(t.heap_bytes(), t.lookup(0x200).unwrap().heap_bytes());
        t.insert(symbol(0x180, 0x280, "c"));
        assert_eq!(t.heap_bytes(), t.lookup(0x200).unwrap().heap_bytes());
    }

    #[test]
    fn every_runtime_style_parses() {
        let coreclr = parse_line(
            "00007FAA2D861E50 100 void [Rec] Rec::Main(string[])[Optimized]",
            1,
        )
        .unwrap();
        assert_eq!(coreclr.start, 0x7faa_2d86_1e50);
        assert_eq!(coreclr.size, 0x100);
        assert_eq!(coreclr.raw, "void [Rec] Rec::Main(string[])[Optimized]");
        let mono = parse_line("41002fd0 178 Rec:Main (string[])", 2).unwrap();
        assert_eq!((mono.start, mono.size), (0x4100_2fd0, 0x178));
        assert_eq!(mono.raw, "Rec:Main (string[])");
        let node = parse_line("0x3d0c0b3fe0c0 0x1c JS:*fib /tmp/x.js:3:13", 3).unwrap();
        assert_eq!((node.start, node.size), (0x3d0c_0b3f_e0c0, 0x1c));
        let jvm = parse_line(
            "0x00007f3a2c4a1b20 0x00000000000001a0 void Rec.down(int, int)",
            4,
        )
        .unwrap();
        assert_eq!(jvm.raw, "void Rec.down(int, int)");
        let tabs = parse_line("  7f00\t  10\t name  with  spaces \r", 5).unwrap();
        assert_eq!(tabs.raw, "name  with  spaces");
    }

    #[test]
    fn a_nul_byte_ends_an_entry_as_net8_writes_it() {
        // As .NET 8.0.4 wrote it: one entry's newline is a NUL, the next follows on its line.
        let file = b"0x7f9b97a14040 8d int32 [A8] Rootline.Tests.Async::Leaf(int32)[InstrumentedTier]\0\
0x7f9b97a140f0 f instance class System.Threading.Tasks.Task`1<!0> [System.Private.CoreLib] \
System.Runtime.CompilerServices.AsyncTaskMethodBuilder`1[System.Int32]::get_Task()[OptimizedTier1]\n"
            .to_vec();
        let mut map = PerfMap::new(Cursor::new(file));
        assert_eq!(map.read_more().unwrap(), 2);
        assert!(map.bad_lines.is_empty(), "{:?}", map.bad_lines);
        let leaf = &map.symbols.lookup(0x7f9b_97a1_4040).unwrap().name;
        assert_eq!(leaf.name, "Rootline.Tests.Async::Leaf(int32)");
        assert_eq!(leaf.tier.as_deref(), Some("InstrumentedTier"));
        let task = &map.symbols.lookup(0x7f9b_97a1_40f0).unwrap().name;
        assert_eq!(
            task.name,
            "System.Runtime.CompilerServices.AsyncTaskMethodBuilder`1[System.Int32]::get_Task()"
        );
        assert_eq!(task.tier.as_deref(), Some("OptimizedTier1"));
    }

    #[test]
    fn a_line_without_newline_is_not_held_without_bound() {
        let mut file = vec![b'x'; 3 * MAX_HELD_LINE];
        let mut lines = AppendedLines::default();
        let read = |lines: &mut AppendedLines, file: &Vec<u8>| {
            lines.read(&mut std::io::Cursor::new(file)).unwrap()
        };
        assert!(read(&mut lines, &file).is_empty());
        assert!(lines.pending.is_empty(), "the overlong line is not kept");
        file.extend_from_slice(b"yyy");
        assert!(read(&mut lines, &file).is_empty());
        assert!(lines.pending.is_empty());
        file.extend_from_slice(b"z\n10 5 after\n20 5 torn");
        assert_eq!(
            read(&mut lines, &file),
            vec![
                (1, OVERLONG_LINE.to_string()),
                (2, "10 5 after".to_string())
            ]
        );
        assert_eq!(lines.pending, b"20 5 torn");
        assert_eq!(lines.offset(), file.len() as u64);
    }

    #[test]
    fn bad_lines_say_which_and_why() {
        assert_eq!(parse_line("zz 10 f", 7).unwrap_err().line, 7);
        assert!(parse_line("1000 10", 1).is_err());
        assert!(parse_line("1000 0 f", 1).is_err());
        assert!(parse_line("ffffffffffffffff 10 f", 1).is_err());
        assert!(parse_line("1000 10 ", 1).is_err());
        assert!(parse_line("11112222333344445 10 f", 1).is_err());
        assert!(parse_line("", 1).is_err());
    }

    /// A growing file: a reader over shared bytes the test appends to.
    #[derive(Clone, Default)]
    struct Growing(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);
    impl Read for Growing {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            unreachable!("PerfMap seeks first")
        }
    }
    struct At(Growing, u64);
    impl Read for At {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let data = self.0.0.borrow();
            let mut c = Cursor::new(&data[..]);
            c.set_position(self.1);
            let n = c.read(buf)?;
            self.1 += n as u64;
            Ok(n)
        }
    }
    impl Seek for At {
        fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
            if let SeekFrom::Start(p) = pos {
                self.1 = p;
            }
            Ok(self.1)
        }
    }

    #[test]
    fn a_growing_map_with_a_torn_line_is_read_incrementally() {
        let file = Growing::default();
        let mut map = PerfMap::new(At(file.clone(), 0));
        file.0
            .borrow_mut()
            .extend_from_slice(b"1000 100 first\n2000 80 sec");
        assert_eq!(map.read_more().unwrap(), 1);
        assert!(map.symbols.lookup(0x2010).is_none(), "torn line held back");
        assert_eq!(map.symbols.lookup(0x10ff).unwrap().start, 0x1000);
        assert!(map.symbols.lookup(0x1100).is_none());
        file.0
            .borrow_mut()
            .extend_from_slice(b"ond\nbogus line\n1080 10 replaces first\n");
        assert_eq!(map.read_more().unwrap(), 2);
        assert_eq!(map.symbols.lookup(0x2010).unwrap().name.name, "second");
        assert_eq!(
            map.symbols.lookup(0x1085).unwrap().name.name,
            "replaces first"
        );
        // The overlapped older entry is gone entirely.
        assert!(map.symbols.lookup(0x1000).is_none());
        assert_eq!(map.bad_lines.len(), 1);
        assert_eq!(map.bad_lines[0].line, 3);
        assert_eq!(map.read_more().unwrap(), 0);
    }
}
