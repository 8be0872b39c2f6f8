//! jitdump files (`jit-PID.dump`, the format of Linux perf's `jitdump.h`): a header, then
//! records of JIT code loads (address, size, name, code bytes) and moves. A runtime writing one
//! maps it executable so that profilers find it in the process's mappings (Node `--perf-prof`,
//! .NET with `DOTNET_PerfMapEnabled=1`/`2`, the JVM with an agent).
//!
//! [`JitDump::read_more`] reads incrementally, like the perf map reader: a record not yet fully
//! written is left for the next call.

use std::io::{self, Read, Seek, SeekFrom};

use super::names::parse_name;
use super::perfmap::{JitSymbol, SymbolTable};

/// `'JiTD'` as a native-endian (little-endian here) u32.
const MAGIC: u32 = 0x4A69_5444;
const HEADER_MIN: usize = 40;
const RECORD_HEADER: usize = 16;
const CODE_LOAD: u32 = 0;
const CODE_MOVE: u32 = 1;

/// A jitdump file's problem, with the byte offset where it was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("jitdump at byte {offset}: {reason}")]
pub struct JitDumpError {
    /// Byte offset from the start of the file.
    pub offset: u64,
    /// What is wrong.
    pub reason: &'static str,
}

/// An incrementally read jitdump file.
#[derive(Debug)]
pub struct JitDump<R> {
    source: R,
    offset: u64,
    pending: Vec<u8>,
    header_done: bool,
    /// Set when the file turned out malformed; nothing more is read from it.
    pub error: Option<JitDumpError>,
    /// Code loaded so far.
    pub symbols: SymbolTable,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl<R: Read + Seek> JitDump<R> {
    /// A dump read from `source` (nothing is read until [`JitDump::read_more`]).
    pub fn new(source: R) -> JitDump<R> {
        JitDump {
            source,
            offset: 0,
            pending: Vec::new(),
            header_done: false,
            error: None,
            symbols: SymbolTable::default(),
        }
    }

    /// Reads the records appended since the last call; returns how many code loads and moves
    /// were applied.
    pub fn read_more(&mut self) -> io::Result<usize> {
        if self.error.is_some() {
            return Ok(0);
        }
        self.source
            .seek(SeekFrom::Start(self.offset + self.pending.len() as u64))?;
        (&mut self.source)
            .take(64 << 20)
            .read_to_end(&mut self.pending)?;
        let mut at = 0;
        let mut applied = 0;
        let fail = |s: &mut Self, at: usize, reason| {
            s.error = Some(JitDumpError {
                offset: s.offset + at as u64,
                reason,
            });
        };
        if !self.header_done {
            if self.pending.len() < HEADER_MIN {
                return Ok(0);
            }
            if u32_at(&self.pending, 0) != Some(MAGIC) {
                fail(self, 0, "no JiTD magic (or a big-endian dump)");
                return Ok(0);
            }
            let size = u32_at(&self.pending, 8).unwrap_or(0) as usize;
            if size < HEADER_MIN {
                fail(self, 8, "header size below 40 bytes");
                return Ok(0);
            }
            if self.pending.len() < size {
                return Ok(0);
            }
            at = size;
            self.header_done = true;
        }
        while let (Some(id), Some(size)) = (
            u32_at(&self.pending, at),
            u32_at(&self.pending, at + 4).map(|s| s as usize),
        ) {
            if size < RECORD_HEADER {
                fail(self, at + 4, "record size below its header");
                break;
            }
            let Some(record) = self.pending.get(at..at + size) else {
                break; // Not fully written yet.
            };
            let body = &record[RECORD_HEADER..];
            match id {
                CODE_LOAD => {
                    let (Some(addr), Some(len)) = (u64_at(body, 16), u64_at(body, 24)) else {
                        fail(self, at, "code load record too short");
                        break;
                    };
                    let name = body.get(40..).and_then(|n| {
                        let end = n.iter().position(|&b| b == 0)?;
                        Some(String::from_utf8_lossy(&n[..end]).into_owned())
                    });
                    let Some(name) = name else {
                        fail(self, at, "code load name without its NUL");
                        break;
                    };
                    if len > 0
                        && let Some(end) = addr.checked_add(len)
                    {
                        self.symbols.insert(JitSymbol {
                            start: addr,
                            end,
                            name: parse_name(&name),
                        });
                        applied += 1;
                    }
                }
                CODE_MOVE => {
                    let (Some(old), Some(new), Some(len)) =
                        (u64_at(body, 16), u64_at(body, 24), u64_at(body, 32))
                    else {
                        fail(self, at, "code move record too short");
                        break;
                    };
                    if let Some(s) = self.symbols.lookup(old).cloned()
                        && s.start == old
                        && let Some(end) = new.checked_add(len.max(1))
                    {
                        self.symbols.insert(JitSymbol {
                            start: new,
                            end,
                            name: s.name,
                        });
                        applied += 1;
                    }
                }
                // Debug info, close, unwinding info and anything newer: skipped by size.
                _ => {}
            }
            at += size;
        }
        self.pending.drain(..at);
        self.offset += at as u64;
        Ok(applied)
    }
}

/// The jitdump file process `pid` has mapped (`…/jit-N.dump` in `/proc/PID/maps`), as a path
/// this process can open (through `/proc/PID/root`).
pub fn mapped_jitdump(pid: u32) -> Option<std::path::PathBuf> {
    let maps = crate::process::read_maps(pid).ok()?;
    let path = maps.into_iter().map(|e| e.path).find(|p| {
        let base = p.rsplit('/').next().unwrap_or("");
        base.starts_with("jit-") && base.ends_with(".dump")
    })?;
    Some(std::path::PathBuf::from(format!("/proc/{pid}/root{path}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn header() -> Vec<u8> {
        let mut h = Vec::new();
        for v in [MAGIC, 1, 40, 62, 0, 1234] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        h.extend_from_slice(&0u64.to_le_bytes());
        h.extend_from_slice(&0u64.to_le_bytes());
        h
    }

    fn load(addr: u64, len: u64, name: &str) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&1234u32.to_le_bytes());
        body.extend_from_slice(&1234u32.to_le_bytes());
        for v in [addr, addr, len, 7] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.extend_from_slice(name.as_bytes());
        body.push(0);
        body.extend(std::iter::repeat_n(0x90, len as usize));
        let mut r = Vec::new();
        r.extend_from_slice(&CODE_LOAD.to_le_bytes());
        r.extend_from_slice(&((16 + body.len()) as u32).to_le_bytes());
        r.extend_from_slice(&0u64.to_le_bytes());
        r.extend_from_slice(&body);
        r
    }

    #[test]
    fn loads_and_moves_are_read_incrementally() {
        let mut bytes = header();
        bytes.extend(load(0x1000, 0x20, "JS:*fib /x.js:1:1"));
        let second = load(0x2000, 0x10, "Builtin:Foo");
        bytes.extend_from_slice(&second[..10]);
        let mut dump = JitDump::new(Cursor::new(bytes.clone()));
        assert_eq!(dump.read_more().unwrap(), 1);
        assert_eq!(dump.symbols.lookup(0x1010).unwrap().name.name, "fib");
        assert!(dump.symbols.lookup(0x2000).is_none());
        bytes.extend_from_slice(&second[10..]);
        // A move of fib to 0x3000.
        let mut mv = Vec::new();
        mv.extend_from_slice(&CODE_MOVE.to_le_bytes());
        mv.extend_from_slice(&(16u32 + 48).to_le_bytes());
        mv.extend_from_slice(&0u64.to_le_bytes());
        mv.extend_from_slice(&[0; 8]);
        for v in [0x1000u64, 0x1000, 0x3000, 0x20, 7] {
            mv.extend_from_slice(&v.to_le_bytes());
        }
        bytes.extend(mv);
        *dump.source.get_mut() = bytes;
        assert_eq!(dump.read_more().unwrap(), 2);
        assert_eq!(
            dump.symbols.lookup(0x2005).unwrap().name.name,
            "Builtin:Foo"
        );
        assert_eq!(dump.symbols.lookup(0x301f).unwrap().name.name, "fib");
        assert!(dump.error.is_none());
    }

    #[test]
    fn a_corrupt_dump_reports_where() {
        let mut dump = JitDump::new(Cursor::new(vec![0u8; 64]));
        dump.read_more().unwrap();
        assert_eq!(dump.error.as_ref().unwrap().offset, 0);
        let mut bytes = header();
        bytes.extend_from_slice(&[0, 0, 0, 0, 4, 0, 0, 0]);
        let mut dump = JitDump::new(Cursor::new(bytes));
        dump.read_more().unwrap();
        assert_eq!(dump.error.as_ref().unwrap().offset, 44);
    }
}
