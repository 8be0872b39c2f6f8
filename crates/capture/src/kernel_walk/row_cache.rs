//! Compiled rows kept on disk between recordings, keyed by the content of the binary's unwind
//! sections: a large library's rows (a compiler's has over a million) take a few hundred
//! milliseconds to compile, during which its frames are walked by guesswork. Only binaries with
//! many rows are kept, and at most [`KEEP_FILES`] files (the oldest go first).
//!
//! A file holds the rows exactly as the table does ([`Row`], little-endian), after their base
//! address, count and span, so that kept rows are read from the file straight into the table:
//! no copy of tens of megabytes is made in between. Rows read that are out of order or of an
//! unknown kind make the file unusable (it is removed).
//!
//! The directory is `kernel-rows` in [`crate::cache_dir`]; a cache that cannot be read or written
//! is simply not used.

use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use rootline_unwind::UnwindSections;
use rootline_unwind::kernel_rows::{KernelRow, RowKind};

use super::layout::Row;

/// Binaries with fewer rows are compiled every time.
pub(super) const MIN_ROWS: usize = 100_000;
/// Most files kept.
const KEEP_FILES: usize = 16;
/// Changed whenever the rows compiled from the same sections change (4: rows covering no
/// address are left out).
const MAGIC: &[u8; 8] = b"RLKROWS4";
/// The magic, the rows' base address, their count and the last one's address (relative).
const HEADER: usize = 32;
const ROW_BYTES: usize = std::mem::size_of::<Row>();

/// The cache directory, when one can be named.
pub(super) fn dir() -> Option<PathBuf> {
    crate::cache_dir::cache_dir("kernel-rows")
}

/// The key of `sections`: a hash of their bytes and of the link-time addresses rows depend on.
pub(super) fn key(sections: &UnwindSections) -> u64 {
    let mut h = foldhash::fast::FixedState::with_seed(0x726f_6f74_6c69_6e65).build_hasher();
    let bases = [sections.cfi_bases(false), sections.cfi_bases(true)];
    h.write(format!("{bases:?}").as_bytes());
    for bytes in [sections.eh_frame_bytes(), sections.debug_frame_bytes()] {
        let bytes = bytes.unwrap_or_default();
        h.write_usize(bytes.len());
        h.write(bytes);
    }
    h.finish()
}

fn name(key: u64) -> String {
    format!("{key:016x}.rows")
}

fn file(dir: &Path, key: u64) -> PathBuf {
    dir.join(name(key))
}

/// Rows kept on disk, opened and their header checked; [`Kept::read_into`] reads them.
#[derive(Debug)]
pub(super) struct Kept {
    file: File,
    path: PathBuf,
    /// Link-time address the rows' addresses are relative to.
    pub base: u64,
    /// How many rows the file holds.
    pub count: usize,
    /// The last row's address, relative to `base`.
    pub span: u32,
}

impl Kept {
    /// Reads the rows into `table` (exactly [`Kept::count`] rows long); false when the file is
    /// shorter or longer than its header said, or holds rows out of order or of an unknown
    /// kind (`table` then holds rows that must not be used, and the file is removed).
    pub fn read_into(mut self, table: &mut [Row]) -> bool {
        let read = table.len() == self.count
            && self.file.read_exact(rows_as_bytes(table)).is_ok()
            && matches!(self.file.read(&mut [0u8; 1]), Ok(0));
        let good = read
            && table.first().is_some_and(|r| r.pc == 0)
            && table.last().is_some_and(|r| r.pc == self.span)
            && well_formed(table);
        if !good {
            let _ = std::fs::remove_file(&self.path);
        }
        good
    }
}

/// The bytes of `rows`, to read them in place.
fn rows_as_bytes(rows: &mut [Row]) -> &mut [u8] {
    bytemuck::cast_slice_mut(rows)
}

/// Whether `rows` are sorted by address and of kinds a table holds (one pass, without
/// branches: a compiler's library has millions of rows).
fn well_formed(rows: &[Row]) -> bool {
    let (good, _) = rows.iter().fold((true, 0u32), |(good, last), r| {
        let this = (r.pc >= last) & (r.kind <= RowKind::Stop as u8) & (r.pad == 0);
        (good & this, r.pc)
    });
    good
}

/// The rows kept under `key`, if a file is there with a well-formed header (the rows are
/// checked as they are read, by [`Kept::read_into`]).
pub(super) fn open(dir: &Path, key: u64) -> Option<Kept> {
    let path = file(dir, key);
    let mut file = File::open(&path).ok()?;
    let len = usize::try_from(file.metadata().ok()?.len()).ok()?;
    let body = len.checked_sub(HEADER)?;
    if body % ROW_BYTES != 0 || body == 0 {
        return None;
    }
    let mut header = [0u8; HEADER];
    file.read_exact(&mut header).ok()?;
    let word = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().unwrap_or_default());
    let count = body / ROW_BYTES;
    if &header[..8] != MAGIC || word(16) != count as u64 {
        return None;
    }
    Some(Kept {
        file,
        path,
        base: word(8),
        count,
        span: u32::try_from(word(24)).ok()?,
    })
}

/// Keeps `rows` under `key` (written aside, then renamed), and drops the oldest files past
/// [`KEEP_FILES`]. Rows a table cannot hold (more than 4 GiB past the first) are not kept.
/// Failures are ignored: the cache only saves time.
pub(super) fn store(dir: &Path, key: u64, rows: &[KernelRow]) {
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return;
    };
    let base = first.svma;
    if last.svma - base > u64::from(u32::MAX) {
        return;
    }
    rootline_image::cache_file::keep(dir, &name(key), KEEP_FILES, |w| {
        w.write_all(MAGIC)?;
        w.write_all(&base.to_le_bytes())?;
        w.write_all(&(rows.len() as u64).to_le_bytes())?;
        w.write_all(&(last.svma - base).to_le_bytes())?;
        for chunk in rows.chunks(4096) {
            let table: Vec<Row> = chunk.iter().map(|r| Row::new(r, base)).collect();
            w.write_all(bytemuck::cast_slice(&table))?;
        }
        Ok(())
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(svma: u64, kind: RowKind, cfa_offset: i32, rbp_offset: i16, arg: u8) -> KernelRow {
        KernelRow {
            svma,
            kind,
            cfa_offset,
            rbp_offset,
            arg,
        }
    }

    fn read(dir: &Path, key: u64) -> Option<Vec<Row>> {
        let kept = open(dir, key)?;
        let mut table = vec![Row::default(); kept.count];
        kept.read_into(&mut table).then_some(table)
    }

    #[test]
    fn rows_read_back_as_the_table_holds_them_and_damage_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let rows = vec![
            row(0x1000, RowKind::Rsp, 336, -48, 0),
            row(0x1010, RowKind::Plt, 0, 0, 11),
            row(0x2000, RowKind::Stop, 0, 0, 0),
        ];
        store(dir.path(), 7, &rows);
        let kept = open(dir.path(), 7).expect("kept");
        assert_eq!((kept.base, kept.count, kept.span), (0x1000, 3, 0x1000));
        let want: Vec<Row> = rows.iter().map(|r| Row::new(r, 0x1000)).collect();
        assert_eq!(read(dir.path(), 7), Some(want));
        assert!(read(dir.path(), 8).is_none());

        let path = file(dir.path(), 7);
        let bytes = std::fs::read(&path).expect("written");
        let damaged = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut b = bytes.clone();
            edit(&mut b);
            std::fs::write(&path, &b).expect("rewritten");
            read(dir.path(), 7)
        };
        // Cut anywhere (a whole row too), or grown by a row.
        for len in 0..bytes.len() {
            assert!(damaged(&|b| b.truncate(len)).is_none(), "cut at {len}");
        }
        assert!(damaged(&|b| b.extend_from_slice(&[0; 16])).is_none());
        // A row of an unknown kind, rows out of order, another magic.
        let first_row = HEADER;
        assert!(damaged(&|b| b[first_row + 16 + 10] = 6).is_none());
        assert!(!path.exists(), "a file whose rows are damaged is removed");
        assert!(
            damaged(&|b| b[first_row + 16..first_row + 20].copy_from_slice(&[0, 0x20, 0, 0]))
                .is_none()
        );
        assert!(damaged(&|b| b[0] ^= 1).is_none());
        // A span other than the last row's.
        assert!(damaged(&|b| b[24] ^= 1).is_none());
        // The file as written still reads.
        assert!(damaged(&|_| {}).is_some());
    }

    #[test]
    fn rows_a_table_cannot_hold_are_not_kept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let far = 0x1000 + u64::from(u32::MAX) + 1;
        store(
            dir.path(),
            7,
            &[
                row(0x1000, RowKind::Rsp, 8, 0, 0),
                row(far, RowKind::Rsp, 8, 0, 0),
            ],
        );
        assert!(open(dir.path(), 7).is_none());
        store(dir.path(), 8, &[]);
        assert!(open(dir.path(), 8).is_none());
    }
}
