//! Layouts of large binaries kept on disk between recordings. Reading a compiler's largest
//! library (hundreds of thousands of symbols, a string table of tens of megabytes scanned for the
//! functions that start threads, the symbols sorted, hundreds of thousands of FDE headers
//! indexed) takes a large part of a recording's own CPU, and while it is read the in-kernel walk
//! cannot unwind through that library. A layout is kept
//! under the file's identity (device, inode, size, modification and change times): a file
//! written again, even in place, has another change time and is read afresh.
//!
//! Only layouts with at least [`MIN_SYMBOLS`] symbols are kept, and at most [`KEEP_FILES`] files
//! (the oldest go first). A file that cannot be read back whole and well formed is not used.

use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rootline_unwind::cfi::CfiIndexParts;

use crate::cache_file::BytesReader;
use crate::layout::{Layout, NameRef, Placed, Segment, Symbol};

/// What is kept of a binary: its layout and the FDE indexes of its `.eh_frame` and
/// `.debug_frame`.
pub(crate) type Kept = (Layout, [CfiIndexParts; 2]);

/// Layouts with fewer symbols are read from the file every time.
pub(crate) const MIN_SYMBOLS: usize = 50_000;
/// Most files kept.
const KEEP_FILES: usize = 16;
const MAGIC: &[u8; 8] = b"RLLAYOU2";

/// A file's identity: what changes when the file is written or replaced.
pub type FileKey = [u64; 7];

/// The identity of the file `meta` describes.
pub fn key_of(meta: &std::fs::Metadata) -> FileKey {
    [
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime() as u64,
        meta.mtime_nsec() as u64,
        meta.ctime() as u64,
        meta.ctime_nsec() as u64,
    ]
}

/// A short name for the file `key`, for a cache file kept for it (a hash of its identity).
pub fn key_name(key: &FileKey) -> String {
    let name = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, k| {
        (h ^ k).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{name:016x}")
}

/// The name of the file kept for `key`.
fn name(key: &FileKey) -> String {
    format!("{}.layout", key_name(key))
}

fn file(dir: &Path, key: &FileKey) -> PathBuf {
    dir.join(name(key))
}

/// Whether `layout` is worth keeping: large, and read whole.
pub(crate) fn worth_keeping(layout: &Layout) -> bool {
    layout.symbols.len() >= MIN_SYMBOLS && layout.over_limit.is_none()
}

/// The layout and indexes kept for the file `key`, if any (whole, well formed, and of that
/// very file).
pub(crate) fn load(dir: &Path, key: &FileKey) -> Option<Kept> {
    let bytes = std::fs::read(file(dir, key)).ok()?;
    decode(&bytes, key)
}

/// Keeps `layout` and `indexes` for the file `key` when the layout is
/// [worth keeping](worth_keeping) (written aside, then renamed), and drops the oldest files past
/// [`KEEP_FILES`]. Failures are ignored: the cache only saves time.
pub(crate) fn store(dir: &Path, key: &FileKey, layout: &Layout, indexes: &[CfiIndexParts; 2]) {
    if !worth_keeping(layout) {
        return;
    }
    crate::cache_file::keep(dir, &name(key), KEEP_FILES, |w| {
        w.write_all(&encode(layout, indexes, key))
    });
}

/// `layout` and `indexes` as kept on disk: the magic, the file's identity, then each table
/// (little-endian words, each table preceded by its length).
fn encode(layout: &Layout, indexes: &[CfiIndexParts; 2], key: &FileKey) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(
        64 + layout.symbols.len() * 32 + layout.functions.len() * 16,
    ));
    w.0.extend_from_slice(MAGIC);
    key.iter().for_each(|&k| w.u64(k));
    w.u64(layout.segments.len() as u64);
    for s in &layout.segments {
        [s.vaddr, s.offset, s.filesz, u64::from(s.exec)]
            .into_iter()
            .for_each(|v| w.u64(v));
    }
    w.range(layout.text.as_ref());
    w.range(layout.got.as_ref());
    for placed in [&layout.eh_frame, &layout.eh_frame_hdr, &layout.debug_frame] {
        w.range(placed.as_ref().map(|p| &p.svma));
        if let Some(p) = placed {
            w.u64(p.offset);
            w.u64(p.size);
        }
    }
    w.u64(layout.symbols.len() as u64);
    for s in &layout.symbols {
        let (tag, at) = match s.name {
            NameRef::At(at) => (0, at),
            NameRef::Plt(at) => (1, at),
            NameRef::Plt0 => (2, 0),
            NameRef::Entry => (3, 0),
        };
        [s.start, s.end, tag, at].into_iter().for_each(|v| w.u64(v));
    }
    for pairs in [&layout.functions, &layout.thread_entries] {
        w.u64(pairs.len() as u64);
        for &(a, b) in pairs {
            w.u64(a);
            w.u64(b);
        }
    }
    match &layout.build_id {
        Some(id) => {
            w.u64(id.len() as u64 + 1);
            w.0.extend_from_slice(id.as_bytes());
        }
        None => w.u64(0),
    }
    w.u64(u64::from(layout.debug_info));
    for index in indexes {
        w.u64(index.fdes.len() as u64);
        for &(start, end, offset) in &index.fdes {
            [start, end, offset].into_iter().for_each(|v| w.u64(v));
        }
        w.u64(index.signal.len() as u64);
        for &(a, b) in &index.signal {
            w.u64(a);
            w.u64(b);
        }
    }
    w.0
}

/// The layout and indexes `bytes` hold, if they are what [`encode`] wrote for the file `key`.
fn decode(bytes: &[u8], key: &FileKey) -> Option<Kept> {
    let mut r = BytesReader(bytes.strip_prefix(MAGIC)?);
    for k in key {
        if r.u64()? != *k {
            return None;
        }
    }
    let segments = r.list(32, |r| {
        Some(Segment {
            vaddr: r.u64()?,
            offset: r.u64()?,
            filesz: r.u64()?,
            exec: r.flag()?,
        })
    })?;
    let text = r.range()?;
    let got = r.range()?;
    let mut placed = || -> Option<Option<Placed>> {
        let Some(svma) = r.range()? else {
            return Some(None);
        };
        Some(Some(Placed {
            svma,
            offset: r.u64()?,
            size: r.u64()?,
        }))
    };
    let (eh_frame, eh_frame_hdr, debug_frame) = (placed()?, placed()?, placed()?);
    let symbols = r.list(32, |r| {
        let (start, end, tag, at) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let name = match tag {
            0 => NameRef::At(at),
            1 => NameRef::Plt(at),
            2 => NameRef::Plt0,
            3 => NameRef::Entry,
            _ => return None,
        };
        Some(Symbol { start, end, name })
    })?;
    let pair = |r: &mut BytesReader| Some((r.u64()?, r.u64()?));
    let functions = r.list(16, pair)?;
    let thread_entries = r.list(16, pair)?;
    let build_id = match r.u64()? {
        0 => None,
        n => Some(String::from_utf8(r.take(usize::try_from(n - 1).ok()?)?.to_vec()).ok()?),
    };
    let debug_info = r.flag()?;
    let mut index = || -> Option<CfiIndexParts> {
        Some(CfiIndexParts {
            fdes: r.list(24, |r| Some((r.u64()?, r.u64()?, r.u64()?)))?,
            signal: r.list(16, pair)?,
        })
    };
    let indexes = [index()?, index()?];
    if !r.0.is_empty() {
        return None;
    }
    let layout = Layout {
        segments,
        text,
        got,
        eh_frame,
        eh_frame_hdr,
        debug_frame,
        symbols,
        functions,
        thread_entries,
        build_id,
        debug_info,
        over_limit: None,
    };
    Some((layout, indexes))
}

struct Writer(Vec<u8>);

impl Writer {
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    /// A flag (0: none), then the range.
    fn range(&mut self, r: Option<&Range<u64>>) {
        match r {
            Some(r) => {
                self.u64(1);
                self.u64(r.start);
                self.u64(r.end);
            }
            None => self.u64(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout {
            segments: vec![Segment {
                vaddr: 0x1000,
                offset: 0x1000,
                filesz: 0x2345,
                exec: true,
            }],
            text: Some(0x1000..0x3000),
            got: None,
            eh_frame: Some(Placed {
                svma: 0x4000..0x4800,
                offset: 0x4000,
                size: 0x800,
            }),
            eh_frame_hdr: None,
            debug_frame: None,
            symbols: vec![
                Symbol {
                    start: 0x1000,
                    end: 0x1010,
                    name: NameRef::Plt0,
                },
                Symbol {
                    start: 0x1010,
                    end: 0x1020,
                    name: NameRef::Plt(77),
                },
                Symbol {
                    start: 0x1100,
                    end: 0x1200,
                    name: NameRef::At(99),
                },
                Symbol {
                    start: 0x1200,
                    end: 0x1201,
                    name: NameRef::Entry,
                },
            ],
            functions: vec![(0x1000, 0x1010), (0x1100, 0x1200)],
            thread_entries: vec![(0x1100, 0x1200)],
            build_id: Some("abcd".into()),
            debug_info: true,
            over_limit: None,
        }
    }

    fn same(a: &Layout, b: &Layout) -> bool {
        format!("{a:?}") == format!("{b:?}")
    }

    fn indexes() -> [CfiIndexParts; 2] {
        [
            CfiIndexParts {
                fdes: vec![(0x1000, 0x1010, 0x18), (0x1100, 0x1200, 0x40)],
                signal: vec![(0x1100, 0x1200)],
            },
            CfiIndexParts::default(),
        ]
    }

    #[test]
    fn a_layout_reads_back_as_written_for_its_file_only() {
        let key = [1, 2, 3, 4, 5, 6, 7];
        let bytes = encode(&layout(), &indexes(), &key);
        let (back, back_indexes) = decode(&bytes, &key).expect("reads back");
        assert!(same(&back, &layout()));
        assert_eq!(back_indexes, indexes());
        let mut other = key;
        other[6] += 1;
        assert!(decode(&bytes, &other).is_none(), "another change time");
        // Every cut, and any trailing byte, is refused without a panic.
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n], &key).is_none(), "cut at {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer, &key).is_none());
        // A length past the bytes left allocates nothing and is refused.
        let mut huge = bytes.clone();
        let segments_len = MAGIC.len() + 7 * 8;
        huge[segments_len..segments_len + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode(&huge, &key).is_none());
    }

    #[test]
    fn only_large_layouts_are_kept_and_the_oldest_files_go() {
        let dir = tempfile::tempdir().expect("temp dir");
        let key = [9; 7];
        store(dir.path(), &key, &layout(), &indexes());
        assert!(
            load(dir.path(), &key).is_none(),
            "a small layout is not kept"
        );
        let mut large = layout();
        large.symbols = (0..MIN_SYMBOLS as u64)
            .map(|i| Symbol {
                start: i * 16,
                end: i * 16 + 16,
                name: NameRef::At(i),
            })
            .collect();
        for k in 0..KEEP_FILES as u64 + 2 {
            store(dir.path(), &[k; 7], &large, &indexes());
        }
        let kept: Vec<_> = (0..KEEP_FILES as u64 + 2)
            .filter_map(|k| load(dir.path(), &[k; 7]))
            .collect();
        assert_eq!(kept.len(), KEEP_FILES);
        assert!(kept.iter().all(|(l, i)| same(l, &large) && *i == indexes()));
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("dir").count(),
            KEEP_FILES
        );
    }
}
