//! Decompressed debug sections kept on disk between recordings. A distribution's separate
//! debug file for libc holds about 10 MB of zlib-compressed DWARF that naming reads
//! ([`super::by_unit`]); inflating it took about 40% of the builder thread's CPU on a rustc
//! recording, on every run that met libc. The inflated sections are kept under the debug file's
//! identity (device, inode, size, modification and change times: a file written again is read
//! afresh), with a checksum of their bytes, and read back each straight into its own memory.
//!
//! Only files whose sections inflate to at least [`MIN_BYTES`] are kept, and at most
//! [`KEEP_FILES`] files (the oldest go first). A file that cannot be read back whole, well
//! formed, of that very debug file and matching its checksum is not used.

use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rootline_image::FileKey;

/// Files whose kept sections come to fewer bytes are inflated every time.
pub(super) const MIN_BYTES: usize = 1 << 20;
/// Most files kept.
const KEEP_FILES: usize = 8;
const MAGIC: &[u8; 8] = b"RLDBGZ02";
/// The cache files' extension.
const EXT: &str = "sections";

/// One section as kept: its name, and its inflated bytes (None: the file has no such section).
pub(super) type Kept = (&'static str, Option<Arc<[u8]>>);

/// The cache directory, when one can be named.
pub(super) fn dir() -> Option<PathBuf> {
    crate::cache_dir::cache_dir("debug-sections")
}

/// The name of the file kept for `key`.
fn name(key: &FileKey) -> String {
    format!("{}.{EXT}", rootline_image::file_key_name(key))
}

fn file(dir: &Path, key: &FileKey) -> PathBuf {
    dir.join(name(key))
}

/// The checksum of the kept sections' bytes, in order.
fn checksum<'a>(sections: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut h = foldhash::fast::FixedState::with_seed(0x6465_6275_675f_7a32).build_hasher();
    for s in sections {
        h.write(s);
    }
    h.finish()
}

/// The sections named `names` kept for the debug file `key`, in that order, if a file is there
/// that is whole, well formed, of that very file and holds exactly those sections. Each section
/// is read from the file straight into its own memory.
pub(super) fn load(dir: &Path, key: &FileKey, names: &[&'static str]) -> Option<Vec<Kept>> {
    let file = std::fs::File::open(file(dir, key)).ok()?;
    let len = file.metadata().ok()?.len();
    decode(std::io::BufReader::new(file), len, key, names)
}

fn u64_le(r: &mut impl Read) -> Option<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b).ok()?;
    Some(u64::from_le_bytes(b))
}

/// The sections `r` holds (`len` bytes in all), if they are what [`store`] wrote for the file
/// `key` with exactly the sections `names`. Lengths are checked against `len` before anything is
/// allocated.
fn decode(mut r: impl Read, len: u64, key: &FileKey, names: &[&'static str]) -> Option<Vec<Kept>> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).ok()?;
    if &magic != MAGIC {
        return None;
    }
    for &k in key {
        if u64_le(&mut r)? != k {
            return None;
        }
    }
    if u64_le(&mut r)? != names.len() as u64 {
        return None;
    }
    // Each section: its name's length and name, then its length plus one (0: absent).
    let mut header = 8 + 8 * key.len() as u64 + 8 + 8;
    let mut lens = Vec::with_capacity(names.len());
    for &name in names {
        let mut name_len = [0u8; 1];
        r.read_exact(&mut name_len).ok()?;
        let mut kept_name = vec![0u8; usize::from(name_len[0])];
        r.read_exact(&mut kept_name).ok()?;
        if kept_name != name.as_bytes() {
            return None;
        }
        lens.push(u64_le(&mut r)?.checked_sub(1));
        header += 1 + kept_name.len() as u64 + 8;
    }
    let sum = u64_le(&mut r)?;
    let total = lens
        .iter()
        .flatten()
        .try_fold(0u64, |t, &l| t.checked_add(l))?;
    if header.checked_add(total)? != len {
        return None;
    }
    let mut kept = Vec::with_capacity(names.len());
    for (&name, len) in names.iter().zip(lens) {
        let section = match len {
            Some(len) => {
                // Every length is within the file (their sum is what follows the header).
                let mut s: Arc<[u8]> =
                    std::iter::repeat_n(0u8, usize::try_from(len).ok()?).collect();
                r.read_exact(Arc::get_mut(&mut s)?).ok()?;
                Some(s)
            }
            None => None,
        };
        kept.push((name, section));
    }
    if !matches!(r.read(&mut [0u8; 1]), Ok(0)) {
        return None;
    }
    let bytes = kept.iter().filter_map(|(_, s)| s.as_deref());
    (checksum(bytes) == sum).then_some(kept)
}

/// Keeps `sections` for the debug file `key` when they come to at least [`MIN_BYTES`] (written
/// aside, then renamed), and drops the oldest files past [`KEEP_FILES`]. Failures are ignored:
/// the cache only saves time.
pub(super) fn store(dir: &Path, key: &FileKey, sections: &[(&str, Option<&[u8]>)]) {
    let total: usize = sections.iter().filter_map(|s| s.1).map(<[u8]>::len).sum();
    if total < MIN_BYTES {
        return;
    }
    rootline_image::cache_file::keep(dir, &name(key), KEEP_FILES, |w| {
        w.write_all(MAGIC)?;
        for k in key {
            w.write_all(&k.to_le_bytes())?;
        }
        w.write_all(&(sections.len() as u64).to_le_bytes())?;
        for &(name, bytes) in sections {
            let name_len = u8::try_from(name.len()).map_err(std::io::Error::other)?;
            w.write_all(&[name_len])?;
            w.write_all(name.as_bytes())?;
            let len = bytes.map_or(0, |d| d.len() as u64 + 1);
            w.write_all(&len.to_le_bytes())?;
        }
        let present = || sections.iter().filter_map(|s| s.1);
        w.write_all(&checksum(present()).to_le_bytes())?;
        for bytes in present() {
            w.write_all(bytes)?;
        }
        Ok(())
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
        let decode = |bytes: &[u8], key: &FileKey, names: &[&'static str]| {
            decode(bytes, bytes.len() as u64, key, names)
        };
        assert!(decode(&bytes, &key, &NAMES).is_some());
        assert!(decode(&bytes, &[1, 2, 3, 4, 5, 6, 8], &NAMES).is_none());
        assert!(decode(&bytes, &key, &NAMES[..2]).is_none());
        assert!(decode(&bytes, &key, &[NAMES[0], NAMES[2], NAMES[1]]).is_none());
        // A length that says more than the file holds is refused before anything is allocated.
        let mut huge = bytes.clone();
        let info_len = 8 + 7 * 8 + 8 + 1 + NAMES[0].len();
        huge[info_len..info_len + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        assert!(decode(&huge, &key, &NAMES).is_none());
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
