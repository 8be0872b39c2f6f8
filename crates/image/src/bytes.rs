//! Where a module's bytes come from. A file stays on disk: its unwind sections are copied out once,
//! and code bytes and symbol names are read on demand, with a few code pages cached (counted in
//! [`crate::ModuleBudget`] while cached). Bytes already in memory (the vDSO, tests) are used as
//! they are.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex, PoisonError};

use foldhash::{HashMap as FastMap, HashMapExt};

use crate::budget::{ModuleBudget, PAGE_CACHE_BYTES};

/// Size of a cached code page.
const PAGE: u64 = 4096;
/// Code pages cached per file-backed module: the call sites that return addresses are checked
/// against and the functions whose prologues are analysed. A miss costs one `pread`.
pub(crate) const CACHED_PAGES: usize = 32;
/// A read of at most this many bytes whose page is not kept, in a full cache, reads only those
/// bytes (recording rustc: ~6,500 return addresses checked, most on pages never read again,
/// each of which read a page and evicted another before).
const UNCACHED_READ: usize = 16;
/// Longest symbol name read from a file.
const MAX_NAME: usize = 4096;
/// Symbol names kept per file-backed module: a hot function's name is asked for at each of its
/// sampled addresses (recording rustc: 9,000 reads of 3,000 names).
const CACHED_NAMES: usize = 2048;
/// What a kept name costs besides its bytes (its key and box, the map's slot), as counted.
const NAME_OVERHEAD: usize = 32;

/// The bytes of one module, read on demand.
pub(crate) struct ModuleBytes {
    source: Source,
    pages: Mutex<FastMap<u64, Box<[u8]>>>,
    /// Names read from the file, by offset (at most [`CACHED_NAMES`]).
    names: Mutex<FastMap<u64, Box<str>>>,
    /// Where the cached pages and names are counted.
    budget: ModuleBudget,
}

/// Where a module's bytes are, borrowed (see [`ModuleBytes::source`]).
pub(crate) enum SourceRef<'a> {
    /// Read from this file.
    File(&'a File),
    /// Already in memory.
    Memory(&'a [u8]),
}

enum Source {
    File(File),
    Memory(Arc<[u8]>),
}

impl ModuleBytes {
    /// Bytes read from `file` when needed.
    pub(crate) fn from_file(file: File, budget: &ModuleBudget) -> ModuleBytes {
        ModuleBytes {
            source: Source::File(file),
            pages: Mutex::new(FastMap::new()),
            names: Mutex::new(FastMap::new()),
            budget: budget.clone(),
        }
    }

    /// Bytes already in memory.
    pub(crate) fn memory(bytes: Arc<[u8]>, budget: &ModuleBudget) -> ModuleBytes {
        ModuleBytes {
            source: Source::Memory(bytes),
            pages: Mutex::new(FastMap::new()),
            names: Mutex::new(FastMap::new()),
            budget: budget.clone(),
        }
    }

    /// The file read from (None for bytes in memory).
    pub(crate) fn file(&self) -> Option<&File> {
        match &self.source {
            Source::File(file) => Some(file),
            Source::Memory(_) => None,
        }
    }

    /// Where the bytes are: the file, or the bytes themselves.
    pub(crate) fn source(&self) -> SourceRef<'_> {
        match &self.source {
            Source::File(file) => SourceRef::File(file),
            Source::Memory(bytes) => SourceRef::Memory(bytes),
        }
    }

    /// Length of the file or bytes (0 when the file cannot be examined).
    pub(crate) fn len(&self) -> u64 {
        match &self.source {
            Source::File(file) => file.metadata().map_or(0, |m| m.len()),
            Source::Memory(bytes) => bytes.len() as u64,
        }
    }

    /// Fills `buf` from file offset `offset`, uncached; returns how many bytes were read (fewer at
    /// the end of the file or on a read error).
    pub(crate) fn read_at(&self, offset: u64, buf: &mut [u8]) -> usize {
        match &self.source {
            Source::Memory(bytes) => {
                let Some(from) = usize::try_from(offset).ok().filter(|&o| o <= bytes.len()) else {
                    return 0;
                };
                let n = buf.len().min(bytes.len() - from);
                buf[..n].copy_from_slice(&bytes[from..from + n]);
                n
            }
            Source::File(file) => {
                let mut done = 0;
                while done < buf.len() {
                    match file.read_at(&mut buf[done..], offset + done as u64) {
                        Ok(0) => break,
                        Ok(n) => done += n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(_) => break,
                    }
                }
                done
            }
        }
    }

    /// `len` bytes at `offset`, or None when the file is shorter.
    pub(crate) fn read_exact_shared(&self, offset: u64, len: usize) -> Option<Arc<[u8]>> {
        // Read in place: converting a vector into shared bytes would copy it (megabytes for a
        // compiler's unwind sections).
        let mut shared: Arc<[u8]> = std::iter::repeat_n(0, len).collect();
        let buf = Arc::get_mut(&mut shared)?;
        (self.read_at(offset, buf) == len).then_some(shared)
    }

    /// Like [`ModuleBytes::read_at`], through the page cache (for code bytes, read again and again
    /// by the unwinder).
    pub(crate) fn read_cached(&self, offset: u64, buf: &mut [u8]) -> usize {
        if matches!(self.source, Source::Memory(_)) {
            return self.read_at(offset, buf);
        }
        let Ok(mut pages) = self.pages.lock() else {
            return self.read_at(offset, buf);
        };
        let mut done = 0;
        while done < buf.len() {
            let at = offset + done as u64;
            let page = at / PAGE;
            if !pages.contains_key(&page) {
                let all_full = self.budget.pages() + PAGE as usize > PAGE_CACHE_BYTES;
                let own_full = pages.len() >= CACHED_PAGES || (all_full && !pages.is_empty());
                if own_full && done == 0 && buf.len() <= UNCACHED_READ {
                    // A few bytes, with no room to keep their page but by evicting one (a call
                    // site checked once for a return address: the unwinder remembers the
                    // result): one small read instead of a page's.
                    drop(pages);
                    return self.read_at(offset, buf);
                }
                if own_full {
                    // Evict an arbitrary page: hot pages come back on their next use.
                    if let Some(&victim) = pages.keys().next()
                        && let Some(old) = pages.remove(&victim)
                    {
                        self.budget.sub_pages(old.len());
                    }
                } else if all_full {
                    // Every module's cache together is full: read this without caching.
                    drop(pages);
                    return self.read_at(offset, buf);
                }
                let mut data = vec![0; PAGE as usize];
                let n = self.read_at(page * PAGE, &mut data);
                if n < PAGE as usize {
                    // The file's last page, or a failed read: not cached (a failure is not kept).
                    drop(pages);
                    return self.read_at(offset, buf);
                }
                self.budget.add_pages(n);
                pages.insert(page, data.into_boxed_slice());
            }
            let data = &pages[&page];
            let from = (at - page * PAGE) as usize;
            if from >= data.len() {
                break;
            }
            let n = (buf.len() - done).min(data.len() - from);
            buf[done..done + n].copy_from_slice(&data[from..from + n]);
            done += n;
        }
        done
    }

    /// The NUL-terminated string at `offset` (a symbol name), when it is UTF-8 and not too long.
    /// Names read from a file are kept (see [`CACHED_NAMES`]), within the room the shared page
    /// cache has ([`PAGE_CACHE_BYTES`]).
    pub(crate) fn read_name(&self, offset: u64) -> Option<String> {
        if matches!(self.source, Source::Memory(_)) {
            return self.read_name_uncached(offset);
        }
        if let Ok(names) = self.names.lock()
            && let Some(name) = names.get(&offset)
        {
            return Some(name.to_string());
        }
        let name = self.read_name_uncached(offset)?;
        if let Ok(mut names) = self.names.lock() {
            if names.len() >= CACHED_NAMES {
                let freed = names.drain().map(|(_, n)| n.len() + NAME_OVERHEAD).sum();
                self.budget.sub_pages(freed);
            }
            let cost = name.len() + NAME_OVERHEAD;
            if self.budget.pages() + cost <= PAGE_CACHE_BYTES {
                self.budget.add_pages(cost);
                names.insert(offset, name.as_str().into());
            }
        }
        Some(name)
    }

    fn read_name_uncached(&self, offset: u64) -> Option<String> {
        let mut name = Vec::new();
        // One read for nearly every name: rustc's driver's function names average 163 bytes,
        // 56% are longer than 128, under 1% longer than 512.
        let mut chunk = [0u8; 512];
        while name.len() < MAX_NAME {
            let n = self.read_at(offset + name.len() as u64, &mut chunk);
            if n == 0 {
                return None;
            }
            if let Some(end) = chunk[..n].iter().position(|&b| b == 0) {
                name.extend_from_slice(&chunk[..end]);
                return String::from_utf8(name).ok();
            }
            name.extend_from_slice(&chunk[..n]);
        }
        None
    }
}

impl Drop for ModuleBytes {
    fn drop(&mut self) {
        // A poisoned lock still holds what was counted.
        let pages = self.pages.get_mut().unwrap_or_else(PoisonError::into_inner);
        let cached: usize = pages.values().map(|p| p.len()).sum();
        let names = self.names.get_mut().unwrap_or_else(PoisonError::into_inner);
        let names: usize = names.values().map(|n| n.len() + NAME_OVERHEAD).sum();
        self.budget.sub_pages(cached + names);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn temp_file(content: &[u8]) -> File {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("rootline-bytes-{}-{n}", std::process::id()));
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(content))
            .expect("temp file");
        let f = File::open(&path).expect("reopen");
        let _ = std::fs::remove_file(&path);
        f
    }

    #[test]
    fn cached_reads_span_pages_and_stop_at_the_end_of_the_file() {
        let content: Vec<u8> = (0..3 * PAGE as usize + 100)
            .map(|i| (i % 251) as u8)
            .collect();
        let bytes = ModuleBytes::from_file(temp_file(&content), &ModuleBudget::new());
        let mut buf = [0u8; 300];
        assert_eq!(bytes.read_cached(PAGE - 150, &mut buf), 300);
        assert_eq!(&buf[..], &content[PAGE as usize - 150..PAGE as usize + 150]);
        let end = content.len() as u64;
        assert_eq!(bytes.read_cached(end - 10, &mut buf), 10);
        assert_eq!(&buf[..10], &content[content.len() - 10..]);
        assert_eq!(bytes.read_cached(end + 5, &mut buf), 0);
        // More distinct pages than the cache holds: still correct, and bounded.
        for round in 0..3 {
            for page in 0..4 {
                let mut one = [0u8; 1];
                assert_eq!(bytes.read_cached(page * PAGE + round, &mut one), 1);
                assert_eq!(one[0], content[(page * PAGE + round) as usize]);
            }
        }
        assert!(bytes.pages.lock().unwrap().len() <= CACHED_PAGES);
    }

    #[test]
    fn a_full_cache_reads_a_few_bytes_alone_and_keeps_its_pages_for_longer_reads() {
        let pages = CACHED_PAGES as u64 + 8;
        let content: Vec<u8> = (0..pages * PAGE).map(|i| (i % 253) as u8).collect();
        let budget = ModuleBudget::new();
        let bytes = ModuleBytes::from_file(temp_file(&content), &budget);
        let cached = || {
            let mut kept: Vec<u64> = bytes.pages.lock().unwrap().keys().copied().collect();
            kept.sort_unstable();
            kept
        };
        let mut small = [0u8; UNCACHED_READ];
        for page in 0..CACHED_PAGES as u64 {
            assert_eq!(bytes.read_cached(page * PAGE + 7, &mut small), small.len());
        }
        let full = cached();
        assert_eq!(full.len(), CACHED_PAGES);
        // Past the cache's room, a call site's bytes are read alone: right, and nothing evicted.
        for page in CACHED_PAGES as u64..pages {
            let at = page * PAGE + 4000;
            assert_eq!(bytes.read_cached(at, &mut small), small.len());
            assert_eq!(&small[..], &content[at as usize..at as usize + small.len()]);
        }
        assert_eq!(cached(), full);
        assert_eq!(budget.pages(), CACHED_PAGES * PAGE as usize);
        // A longer read (a function's code) still takes its page in, evicting another.
        let mut longer = [0u8; UNCACHED_READ + 1];
        let at = (pages - 1) * PAGE;
        assert_eq!(bytes.read_cached(at, &mut longer), longer.len());
        assert_eq!(
            &longer[..],
            &content[at as usize..at as usize + longer.len()]
        );
        assert!(cached().contains(&(pages - 1)));
        assert_eq!(cached().len(), CACHED_PAGES);
    }

    #[test]
    fn names_end_at_nul_and_bad_ones_are_refused() {
        let mut content = b"\0main\0".to_vec();
        content.extend(std::iter::repeat_n(b'x', 300));
        content.push(0);
        content.extend_from_slice(b"\xff\xfe\0unterminated");
        let file = ModuleBytes::from_file(temp_file(&content), &ModuleBudget::new());
        let memory = ModuleBytes::memory(content.clone().into(), &ModuleBudget::new());
        for bytes in [file, memory] {
            assert_eq!(bytes.read_name(1).as_deref(), Some("main"));
            assert_eq!(bytes.read_name(0).as_deref(), Some(""));
            assert_eq!(bytes.read_name(6).map(|n| n.len()), Some(300));
            assert_eq!(bytes.read_name(307), None, "not UTF-8");
            assert_eq!(bytes.read_name(310), None, "no NUL before the end");
            assert_eq!(bytes.read_name(10_000), None);
        }
    }

    #[test]
    fn names_read_again_are_the_kept_ones_and_counted_until_dropped() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("names");
        std::fs::write(&path, b"\0main\0helper\0").expect("written");
        let budget = ModuleBudget::new();
        let bytes = ModuleBytes::from_file(File::open(&path).expect("opened"), &budget);
        assert_eq!(bytes.read_name(1).as_deref(), Some("main"));
        assert_eq!(bytes.read_name(6).as_deref(), Some("helper"));
        assert_eq!(budget.pages(), 4 + 6 + 2 * NAME_OVERHEAD);
        // The file written again in place: a kept name is not read from it again.
        std::fs::write(&path, b"\0MAIN\0HELPER\0").expect("written again");
        assert_eq!(bytes.read_name(1).as_deref(), Some("main"));
        assert_eq!(
            bytes.read_name(7).as_deref(),
            Some("ELPER"),
            "not kept: read"
        );
        drop(bytes);
        assert_eq!(budget.pages(), 0, "the kept names are no longer counted");

        // Bounded: past the most kept, the kept ones start over, counted as they are.
        let many: Vec<u8> = (0..CACHED_NAMES + 10)
            .flat_map(|i| format!("name{i:05}\0").into_bytes())
            .collect();
        let bytes = ModuleBytes::from_file(temp_file(&many), &budget);
        for i in 0..CACHED_NAMES as u64 + 10 {
            assert_eq!(bytes.read_name(i * 10), Some(format!("name{i:05}")));
        }
        let kept = bytes.names.lock().unwrap().len();
        assert_eq!(kept, 10, "started over at the limit");
        assert_eq!(budget.pages(), kept * (9 + NAME_OVERHEAD));
    }
}
