//! Decompressed debug sections kept on disk between recordings. A distribution's separate
//! debug file for libc holds about 10 MB of zlib-compressed DWARF that naming reads
//! ([`super::by_unit`]); inflating it took about 40% of the builder thread's CPU on a rustc
//! recording, on every run that met libc. The inflated sections are kept under the debug file's identity (device, inode,
//! size, modification and change times: a file written again is read afresh), with a checksum
//! of their bytes.
//!
//! Only files whose sections inflate to at least [`MIN_BYTES`] are kept, and at most
//! [`KEEP_FILES`] files (the oldest go first). A file that cannot be read back whole, well
//! formed, of that very debug file and matching its checksum is not used.

use std::hash::BuildHasher;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rootline_image::FileKey;

/// Files whose kept sections come to fewer bytes are inflated every time.
pub(super) const MIN_BYTES: usize = 1 << 20;
/// Most files kept.
const KEEP_FILES: usize = 8;
const MAGIC: &[u8; 8] = b"RLDBGZ01";
/// The cache files' extension.
const EXT: &str = "sections";

/// One section as kept: its name, and its inflated bytes (None: the file has no such section).
pub(super) type Kept = (&'static str, Option<Arc<[u8]>>);

/// The cache directory, when one can be named.
pub(super) fn dir() -> Option<PathBuf> {
    crate::cache_dir::cache_dir("debug-sections")
}

fn file(dir: &Path, key: &FileKey) -> PathBuf {
    dir.join(format!("{}.{EXT}", rootline_image::file_key_name(key)))
}

fn checksum(data: &[u8]) -> u64 {
    foldhash::fast::FixedState::with_seed(0x6465_6275_675f_7a31).hash_one(data)
}

/// The sections named `names` kept for the debug file `key`, in that order, if a file is there
/// that is whole, well formed, of that very file and holds exactly those sections.
pub(super) fn load(dir: &Path, key: &FileKey, names: &[&'static str]) -> Option<Vec<Kept>> {
    let bytes = std::fs::read(file(dir, key)).ok()?;
    decode(&bytes, key, names)
}

/// Reads a kept file's fields in order.
struct Cursor<'b> {
    bytes: &'b [u8],
    at: usize,
}

impl<'b> Cursor<'b> {
    fn take(&mut self, n: usize) -> Option<&'b [u8]> {
        let s = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    fn u64_le(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

fn decode(bytes: &[u8], key: &FileKey, names: &[&'static str]) -> Option<Vec<Kept>> {
    let mut c = Cursor { bytes, at: 0 };
    if c.take(8)? != MAGIC {
        return None;
    }
    for &k in key {
        if c.u64_le()? != k {
            return None;
        }
    }
    if c.u64_le()? != names.len() as u64 {
        return None;
    }
    // Each section: its name's length and name, then its length plus one (0: absent).
    let mut lens = Vec::with_capacity(names.len());
    for &name in names {
        let name_len = usize::from(*c.take(1)?.first()?);
        if c.take(name_len)? != name.as_bytes() {
            return None;
        }
        lens.push(c.u64_le()?);
    }
    let sum = c.u64_le()?;
    let data = &bytes[c.at..];
    if checksum(data) != sum {
        return None;
    }
    let total = lens
        .iter()
        .try_fold(0u64, |t, &l| t.checked_add(l.saturating_sub(1)))?;
    if total != data.len() as u64 {
        return None;
    }
    let mut from = 0usize;
    let kept = names
        .iter()
        .zip(lens)
        .map(|(&name, len)| {
            let section = len.checked_sub(1).map(|len| {
                // Every length is within `data` (their sum is its length).
                let len = len as usize;
                let s: Arc<[u8]> = data[from..from + len].into();
                from += len;
                s
            });
            (name, section)
        })
        .collect();
    Some(kept)
}

/// Keeps `sections` for the debug file `key` when they come to at least [`MIN_BYTES`] (written
/// aside, then renamed), and drops the oldest files past [`KEEP_FILES`]. Failures are ignored:
/// the cache only saves time.
pub(super) fn store(dir: &Path, key: &FileKey, sections: &[(&str, Option<&[u8]>)]) {
    let total: usize = sections.iter().filter_map(|s| s.1).map(<[u8]>::len).sum();
    if total < MIN_BYTES {
        return;
    }
    let name = format!("{}.{EXT}", rootline_image::file_key_name(key));
    rootline_image::cache_file::keep(dir, &name, KEEP_FILES, |w| {
        w.write_all(MAGIC)?;
        for k in key {
            w.write_all(&k.to_le_bytes())?;
        }
        w.write_all(&(sections.len() as u64).to_le_bytes())?;
        let mut data = Vec::with_capacity(total);
        for &(name, bytes) in sections {
            let name_len = u8::try_from(name.len()).map_err(std::io::Error::other)?;
            w.write_all(&[name_len])?;
            w.write_all(name.as_bytes())?;
            let len = bytes.map_or(0, |d| d.len() as u64 + 1);
            w.write_all(&len.to_le_bytes())?;
            data.extend_from_slice(bytes.unwrap_or_default());
        }
        w.write_all(&checksum(&data).to_le_bytes())?;
        w.write_all(&data)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: [&str; 3] = [".debug_info", ".debug_addr", ".debug_str"];

    fn sections() -> (Vec<u8>, Vec<u8>) {
        let info: Vec<u8> = (0..MIN_BYTES + 17).map(|i| (i * 7 % 251) as u8).collect();
        (info, b"names\0".to_vec())
    }

    #[test]
    fn sections_read_back_as_kept_and_damage_or_another_file_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let key: FileKey = [1, 2, 3, 4, 5, 6, 7];
        let (info, str_) = sections();
        store(
            dir.path(),
            &key,
            &[
                (NAMES[0], Some(&info)),
                (NAMES[1], None),
                (NAMES[2], Some(&str_)),
            ],
        );
        let kept = load(dir.path(), &key, &NAMES).expect("kept");
        assert_eq!(kept[0].0, ".debug_info");
        assert_eq!(kept[0].1.as_deref(), Some(&info[..]));
        assert!(kept[1].1.is_none());
        assert_eq!(kept[2].1.as_deref(), Some(&str_[..]));

        // Another file's identity, other sections asked for: not these.
        assert!(load(dir.path(), &[1, 2, 3, 4, 5, 6, 8], &NAMES).is_none());
        let bytes = std::fs::read(file(dir.path(), &key)).unwrap();
        assert!(decode(&bytes, &[1, 2, 3, 4, 5, 6, 8], &NAMES).is_none());
        assert!(decode(&bytes, &key, &NAMES[..2]).is_none());
        assert!(decode(&bytes, &key, &[NAMES[0], NAMES[2], NAMES[1]]).is_none());
        // One byte changed anywhere, or the file cut anywhere: refused, never a panic.
        for at in (0..bytes.len()).step_by(4099).chain([bytes.len() - 1]) {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x20;
            assert!(
                decode(&damaged, &key, &NAMES).is_none(),
                "byte {at} changed"
            );
            assert!(decode(&bytes[..at], &key, &NAMES).is_none(), "cut at {at}");
        }
    }

    #[test]
    fn small_sections_are_not_kept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let key: FileKey = [9; 7];
        store(dir.path(), &key, &[(NAMES[0], Some(&[1, 2, 3][..]))]);
        assert!(load(dir.path(), &key, &NAMES[..1]).is_none());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
