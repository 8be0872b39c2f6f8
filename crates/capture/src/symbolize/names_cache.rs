//! Demangled symbol-table names kept on disk between recordings. Recording rustc compiling a
//! crate names about 11,000 distinct addresses in the compiler's and LLVM's libraries, which have
//! no DWARF: each function's name is read from the file's string table and demangled (C++ names
//! slowly), about a third of the builder thread's CPU, the same functions on every run. The
//! names are kept per binary under its identity (device, inode, size, modification and change
//! times: a file written again starts afresh), by the start of the symbol that holds them, so a
//! later recording only reads and demangles functions it has not met before.
//!
//! Only binaries named from their symbol tables alone are kept (see the caller): names found
//! through DWARF (numbered closures, inlined frames) are not. At most [`KEEP_FILES`] files (the
//! oldest go first), each of at most [`MAX_NAMES`] names, and only binaries with at least
//! [`MIN_NAMES`]. A file that is not whole, well formed, of that very binary and matching its
//! checksum is not used.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use rootline_image::FileKey;
use rootline_image::cache_file::BytesReader;

/// Binaries with fewer names are named afresh every time (a file costs more than it saves).
const MIN_NAMES: usize = 16;
/// Most names kept for one binary; past it, those added last are kept first.
const MAX_NAMES: usize = 1 << 18;
/// The longest name kept.
const MAX_NAME_BYTES: usize = 64 * 1024;
/// Most files kept.
const KEEP_FILES: usize = 64;
const MAGIC: &[u8; 8] = b"RLNAMES1";
/// The cache files' extension.
const EXT: &str = "names";

/// The cache directory, when one can be named.
pub(crate) fn dir() -> Option<PathBuf> {
    crate::cache_dir::cache_dir("symbol-names")
}

/// One binary's kept names: those read from its file, and those added since.
#[derive(Debug)]
pub(super) struct KeptNames {
    key: FileKey,
    names: HashMap<u64, Box<str>>,
    /// Names added since the file was read, in the order they were met.
    added: Vec<u64>,
}

impl KeptNames {
    /// The names kept in `dir` for the binary `key` (none when no usable file is there).
    pub fn read(dir: &Path, key: FileKey) -> KeptNames {
        let names = std::fs::read(dir.join(name(&key)))
            .ok()
            .and_then(|bytes| decode(&bytes, &key))
            .unwrap_or_default();
        KeptNames {
            key,
            names,
            added: Vec::new(),
        }
    }

    /// The identity of the binary whose names these are.
    pub fn key(&self) -> FileKey {
        self.key
    }

    /// The demangled name of the symbol starting at `start`, when kept.
    pub fn get(&self, start: u64) -> Option<&str> {
        self.names.get(&start).map(|n| &**n)
    }

    /// Keeps `name` for the symbol starting at `start`.
    pub fn insert(&mut self, start: u64, name: &str) {
        if name.len() <= MAX_NAME_BYTES && self.names.insert(start, name.into()).is_none() {
            self.added.push(start);
        }
    }

    /// Writes the names to `dir` when some were added and there are enough of them.
    pub fn write(&mut self, dir: &Path) {
        if self.added.is_empty() || self.names.len() < MIN_NAMES {
            return;
        }
        if self.names.len() > MAX_NAMES {
            // The names added last stay; names read from the file fill the room left (in no
            // particular order).
            let mut keep: std::collections::HashSet<u64> =
                self.added.iter().rev().take(MAX_NAMES).copied().collect();
            for &start in self.names.keys() {
                if keep.len() >= MAX_NAMES {
                    break;
                }
                keep.insert(start);
            }
            self.names.retain(|start, _| keep.contains(start));
        }
        let bytes = encode(&self.key, &self.names);
        if rootline_image::cache_file::keep(dir, &name(&self.key), KEEP_FILES, |w| {
            w.write_all(&bytes)
        }) {
            self.added.clear();
        }
    }
}

/// The name of the file kept for `key`.
fn name(key: &FileKey) -> String {
    format!("{}.{EXT}", rootline_image::file_key_name(key))
}

fn checksum(bytes: &[u8]) -> u64 {
    let mut h = foldhash::fast::FixedState::with_seed(0x6e61_6d65_735f_7631).build_hasher();
    h.write(bytes);
    h.finish()
}

/// The file's bytes: magic, key, count, then each name (start, length, UTF-8), then a checksum
/// of everything before it.
fn encode(key: &FileKey, names: &HashMap<u64, Box<str>>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + 80 + names.values().map(|n| n.len() + 12).sum::<usize>());
    out.extend_from_slice(MAGIC);
    for k in key {
        out.extend_from_slice(&k.to_le_bytes());
    }
    out.extend_from_slice(&(names.len() as u64).to_le_bytes());
    let mut sorted: Vec<_> = names.iter().collect();
    sorted.sort_unstable_by_key(|(start, _)| **start);
    for (start, n) in sorted {
        out.extend_from_slice(&start.to_le_bytes());
        out.extend_from_slice(&(n.len() as u32).to_le_bytes());
        out.extend_from_slice(n.as_bytes());
    }
    let sum = checksum(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// The names `bytes` holds, if they are what [`encode`] wrote for the binary `key`.
fn decode(bytes: &[u8], key: &FileKey) -> Option<HashMap<u64, Box<str>>> {
    let (body, sum) = bytes.split_at_checked(bytes.len().checked_sub(8)?)?;
    if checksum(body).to_le_bytes() != sum {
        return None;
    }
    let mut r = BytesReader(body);
    if r.take(8)? != MAGIC {
        return None;
    }
    for &k in key {
        if r.u64()? != k {
            return None;
        }
    }
    // Each name takes at least 12 bytes: a count past what the file can hold is not believed.
    let names = r.list(12, |r| {
        let start = r.u64()?;
        let len = r.u32()? as usize;
        Some((start, std::str::from_utf8(r.take(len)?).ok()?.into()))
    })?;
    (names.len() <= MAX_NAMES && r.is_empty()).then(|| names.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: FileKey = [1, 2, 3, 4, 5, 6, 7];

    fn some_names(n: u64) -> HashMap<u64, Box<str>> {
        (0..n)
            .map(|i| (0x1000 + i * 0x40, format!("crate::f{i}").into()))
            .collect()
    }

    #[test]
    fn names_read_back_only_whole_and_for_their_own_file() {
        let names = some_names(20);
        let bytes = encode(&KEY, &names);
        assert_eq!(decode(&bytes, &KEY), Some(names));
        // Another file's identity, any byte changed, or any length cut: not used.
        assert_eq!(decode(&bytes, &[1, 2, 3, 4, 5, 6, 8]), None);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x20;
            assert_eq!(decode(&bad, &KEY), None, "byte {i} changed");
            assert_eq!(decode(&bytes[..i], &KEY), None, "cut at {i}");
        }
    }

    #[test]
    fn a_count_past_the_file_is_refused_before_anything_is_allocated() {
        let mut bytes = encode(&KEY, &some_names(1));
        let at = 8 + 7 * 8;
        bytes[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let body = bytes.len() - 8;
        let sum = checksum(&bytes[..body]);
        bytes[body..].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(decode(&bytes, &KEY), None);
    }

    #[test]
    fn any_bytes_with_a_good_checksum_decode_or_are_refused_without_panicking() {
        let valid = encode(&KEY, &some_names(5));
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let mut bytes = valid.clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() as usize) % (bytes.len() - 8);
                bytes[at] = next() as u8;
            }
            bytes.truncate(8 + (next() as usize) % (bytes.len() - 8));
            // Seal it, so that the parser past the checksum is what is tried.
            let sum = checksum(&bytes);
            bytes.extend_from_slice(&sum.to_le_bytes());
            if let Some(names) = decode(&bytes, &KEY) {
                assert!(names.len() <= 5 + 1);
            }
        }
    }

    #[test]
    fn names_are_written_when_some_were_added_and_enough_are_known() {
        let dir = tempfile::tempdir().unwrap();
        let mut kept = KeptNames::read(dir.path(), KEY);
        for i in 0..MIN_NAMES as u64 - 1 {
            kept.insert(i, "f");
        }
        kept.write(dir.path());
        assert!(KeptNames::read(dir.path(), KEY).names.is_empty(), "too few");
        kept.insert(999, "g");
        kept.write(dir.path());
        let read = KeptNames::read(dir.path(), KEY);
        assert_eq!(read.names.len(), MIN_NAMES);
        assert_eq!(read.get(999), Some("g"));
        assert!(read.added.is_empty());
        assert!(KeptNames::read(dir.path(), [0; 7]).names.is_empty());
    }
}
