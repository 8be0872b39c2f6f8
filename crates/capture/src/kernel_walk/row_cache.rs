//! Compiled rows kept on disk between recordings, keyed by the content of the binary's unwind
//! sections: a large library's rows (a compiler's has over a million) take a few hundred
//! milliseconds to compile, during which its frames are walked by guesswork. Only binaries with
//! many rows are kept, and at most [`KEEP_FILES`] files (the oldest go first).
//!
//! The directory is `kernel-rows` in [`crate::cache_dir`]; a cache that cannot be read or written
//! is simply not used.

use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use rootline_unwind::UnwindSections;
use rootline_unwind::kernel_rows::{KernelRow, RowKind};

/// Binaries with fewer rows are compiled every time.
pub(super) const MIN_ROWS: usize = 100_000;
/// Most files kept.
const KEEP_FILES: usize = 16;
const MAGIC: &[u8; 8] = b"RLKROWS1";

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

/// How many rows are kept under `key`, if a file is there (not checked further).
pub(super) fn count(dir: &Path, key: u64) -> Option<usize> {
    let len = std::fs::metadata(file(dir, key)).ok()?.len();
    let body = usize::try_from(len).ok()?.checked_sub(MAGIC.len())?;
    Some(body / 16)
}

/// The rows kept under `key`, if any (and well formed). The file is read a megabyte at a time:
/// only the rows themselves are held.
pub(super) fn load(dir: &Path, key: u64) -> Option<Vec<KernelRow>> {
    use std::io::Read;
    let mut f = std::fs::File::open(file(dir, key)).ok()?;
    let len = usize::try_from(f.metadata().ok()?.len()).ok()?;
    let body = len.checked_sub(MAGIC.len())?;
    if body % 16 != 0 {
        return None;
    }
    let mut magic = [0u8; 8];
    f.read_exact(&mut magic).ok()?;
    if &magic != MAGIC {
        return None;
    }
    let mut rows = Vec::with_capacity(body / 16);
    let mut buf = vec![0u8; 1 << 20];
    let mut left = body;
    while left > 0 {
        let chunk = &mut buf[..left.min(1 << 20)];
        f.read_exact(chunk).ok()?;
        for row in chunk.chunks_exact(16) {
            rows.push(parse_row(row.try_into().ok()?)?);
        }
        left -= chunk.len();
    }
    // The file must end where its length said.
    if f.read(&mut magic).ok()? != 0 {
        return None;
    }
    Some(rows)
}

/// One row as [`store`] writes it.
fn parse_row(r: &[u8; 16]) -> Option<KernelRow> {
    let kind = match r[14] {
        0 => RowKind::None,
        1 => RowKind::Rsp,
        2 => RowKind::Rbp,
        3 => RowKind::Plt,
        4 => RowKind::Root,
        5 => RowKind::Stop,
        _ => return None,
    };
    Some(KernelRow {
        svma: u64::from_le_bytes(r[0..8].try_into().ok()?),
        cfa_offset: i32::from_le_bytes(r[8..12].try_into().ok()?),
        rbp_offset: i16::from_le_bytes(r[12..14].try_into().ok()?),
        kind,
        arg: r[15],
    })
}

/// Keeps `rows` under `key` (written aside, then renamed), and drops the oldest files past
/// [`KEEP_FILES`]. Failures are ignored: the cache only saves time.
pub(super) fn store(dir: &Path, key: u64, rows: &[KernelRow]) {
    rootline_image::cache_file::keep(dir, &name(key), KEEP_FILES, |w| {
        w.write_all(MAGIC)?;
        for r in rows {
            w.write_all(&r.svma.to_le_bytes())?;
            w.write_all(&r.cfa_offset.to_le_bytes())?;
            w.write_all(&r.rbp_offset.to_le_bytes())?;
            w.write_all(&[r.kind as u8, r.arg])?;
        }
        Ok(())
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_read_back_as_written_and_damage_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let rows = vec![
            KernelRow {
                svma: 0x1000,
                kind: RowKind::Rsp,
                cfa_offset: 336,
                rbp_offset: -48,
                arg: 0,
            },
            KernelRow {
                svma: 0x1010,
                kind: RowKind::Plt,
                cfa_offset: 0,
                rbp_offset: 0,
                arg: 11,
            },
        ];
        store(dir.path(), 7, &rows);
        assert_eq!(load(dir.path(), 7), Some(rows));
        assert_eq!(load(dir.path(), 8), None);
        let path = file(dir.path(), 7);
        let mut bytes = std::fs::read(&path).expect("written");
        bytes.pop();
        std::fs::write(&path, &bytes).expect("rewritten");
        assert_eq!(load(dir.path(), 7), None);
    }
}
