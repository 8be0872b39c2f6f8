//! Files kept in a cache directory between recordings: written aside and renamed into place (a
//! reader never sees half a file), the oldest dropped past a number kept. Failures are ignored
//! by the callers: a cache only saves time.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes the file `name` in `dir` (created if need be) with `write`, aside first and then renamed
/// into place, and drops the oldest files with `name`'s extension past the newest `keep`. False
/// when it could not be written (nothing is left behind).
pub fn keep(
    dir: &Path,
    name: &str,
    keep: usize,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> bool {
    let _ = std::fs::create_dir_all(dir);
    let path = dir.join(name);
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = std::fs::File::create(&tmp).and_then(|f| {
        let mut w = std::io::BufWriter::new(f);
        write(&mut w)?;
        w.flush()
    });
    if written.is_err() || std::fs::rename(&tmp, &path).is_err() {
        let _ = std::fs::remove_file(&tmp);
        return false;
    }
    if let Some(ext) = path.extension().and_then(|e| e.to_str()) {
        prune(dir, ext, keep);
    }
    true
}

/// Removes the oldest files with extension `ext` in `dir` past the newest `keep`.
pub fn prune(dir: &Path, ext: &str, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == ext))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    files.sort();
    let excess = files.len().saturating_sub(keep);
    for (_, old) in files.into_iter().take(excess) {
        let _ = std::fs::remove_file(old);
    }
}

/// Reads a kept file's values off the front of its bytes (little-endian), each read None once
/// the bytes run out.
pub struct BytesReader<'a>(pub &'a [u8]);

impl<'a> BytesReader<'a> {
    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    /// The next 8 bytes as a number.
    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    /// The next 8 bytes as 0 (false) or 1 (true); anything else is None.
    pub fn flag(&mut self) -> Option<bool> {
        match self.u64()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }

    /// A flag, then (when set) a range's start and end.
    pub fn range(&mut self) -> Option<Option<std::ops::Range<u64>>> {
        Some(match self.flag()? {
            false => None,
            true => Some(self.u64()?..self.u64()?),
        })
    }

    /// A length, then that many items of `size` bytes each (the length is checked against the
    /// bytes left before anything is allocated).
    pub fn list<T>(
        &mut self,
        size: usize,
        item: impl Fn(&mut Self) -> Option<T>,
    ) -> Option<Vec<T>> {
        let n = usize::try_from(self.u64()?).ok()?;
        if n.checked_mul(size)? > self.0.len() {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(item(self)?);
        }
        Some(out)
    }

    /// The next 4 bytes as a number.
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    /// Whether every byte was read.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_written_whole_and_the_oldest_go_past_the_number_kept() {
        let dir = tempfile::tempdir().expect("temp dir");
        for i in 0..4u8 {
            assert!(keep(dir.path(), &format!("{i}.kept"), 3, |w| w
                .write_all(&[i; 10])));
            // Distinct modification times.
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(keep(dir.path(), "other.else", 3, |w| w.write_all(b"x")));
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["1.kept", "2.kept", "3.kept", "other.else"]);
        assert_eq!(std::fs::read(dir.path().join("3.kept")).unwrap(), [3; 10]);
        // A write that fails leaves nothing behind.
        assert!(!keep(dir.path(), "4.kept", 3, |_| Err(
            std::io::Error::other("no")
        )));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 4);
    }
}
