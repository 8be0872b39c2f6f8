//! Files in a directory: one file per export and process, in any format rootline-formats writes
//! (pprof for `[exporters.pprof]`), rotating under a byte cap: once the directory's files from this
//! exporter exceed the cap, the oldest are deleted. Files are written as `NAME.partial` and renamed
//! when complete; partial files left by an agent that died are removed at start.

use std::collections::VecDeque;
use std::fs;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use rootline_formats::Format;

use super::{ExportError, Exporter};
use crate::batch::{ExportBatch, ProcessProfile};

/// Writes one file per process and export into a directory, under a byte cap.
pub struct DirExporter {
    name: String,
    format: Format,
    extension: &'static str,
    directory: PathBuf,
    max_bytes: u64,
    files: VecDeque<(PathBuf, u64)>,
    total: u64,
}

impl DirExporter {
    /// An exporter named `name` writing `format` files (ending `extension`) into `directory`, which
    /// is created if missing. Files already there with that ending count against `max_bytes`,
    /// oldest first, so a restarted agent keeps rotating them; leftover `…{extension}.partial`
    /// files are removed.
    pub fn new(
        name: &str,
        format: Format,
        extension: &'static str,
        directory: &Path,
        max_bytes: u64,
    ) -> Result<DirExporter, ExportError> {
        fs::create_dir_all(directory)
            .map_err(|e| ExportError::Io(format!("cannot create {}: {e}", directory.display())))?;
        // Half-written files of an agent that died mid-write count against no cap: they are
        // removed now. Complete files are kept, oldest first.
        let partial = format!("{extension}.partial");
        let mut existing: Vec<(std::time::SystemTime, PathBuf, u64)> = Vec::new();
        for entry in fs::read_dir(directory)
            .map_err(|e| ExportError::Io(format!("cannot list {}: {e}", directory.display())))?
            .flatten()
        {
            let file_name = entry.file_name();
            let file_name = file_name.to_string_lossy();
            if file_name.ends_with(&partial) {
                let _ = fs::remove_file(entry.path());
            } else if file_name.ends_with(extension)
                && let Ok(meta) = entry.metadata()
                && let Ok(modified) = meta.modified()
            {
                existing.push((modified, entry.path(), meta.len()));
            }
        }
        existing.sort();
        let total = existing.iter().map(|(_, _, len)| len).sum();
        Ok(DirExporter {
            name: name.to_string(),
            format,
            extension,
            directory: directory.to_path_buf(),
            max_bytes,
            files: existing.into_iter().map(|(_, p, len)| (p, len)).collect(),
            total,
        })
    }

    /// Bytes of this exporter's files in the directory now.
    pub fn total_bytes(&self) -> u64 {
        self.total
    }

    fn file_name(&self, batch: &ExportBatch, process: &ProcessProfile) -> PathBuf {
        let comm: String = process
            .process
            .comm
            .as_deref()
            .unwrap_or("unknown")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.directory.join(format!(
            "{}-{}-{}-{:06}{}",
            comm,
            process.process.pid,
            batch.end_ns / 1_000_000,
            batch.sequence,
            self.extension
        ))
    }

    fn rotate(&mut self) {
        while self.total > self.max_bytes {
            let Some((path, len)) = self.files.pop_front() else {
                break;
            };
            if let Err(e) = fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(
                    exporter = self.name.as_str(),
                    "cannot remove {}: {e}",
                    path.display()
                );
            }
            self.total -= len;
        }
    }
}

impl Exporter for DirExporter {
    fn name(&self) -> &str {
        &self.name
    }

    fn export_process(
        &mut self,
        batch: &ExportBatch,
        process: &ProcessProfile,
    ) -> Result<(), ExportError> {
        let path = self.file_name(batch, process);
        let mut tmp = path.clone().into_os_string();
        tmp.push(".partial");
        let tmp = PathBuf::from(tmp);
        let write = || -> Result<u64, String> {
            let file = fs::File::create(&tmp).map_err(|e| e.to_string())?;
            let mut out = BufWriter::new(file);
            rootline_formats::write(self.format, &process.profile, &mut out)
                .map_err(|e| e.to_string())?;
            let file = out.into_inner().map_err(|e| e.to_string())?;
            file.sync_data().map_err(|e| e.to_string())?;
            let len = file.metadata().map_err(|e| e.to_string())?.len();
            fs::rename(&tmp, &path).map_err(|e| e.to_string())?;
            Ok(len)
        };
        match write() {
            Ok(len) => {
                self.files.push_back((path, len));
                self.total += len;
                self.rotate();
                Ok(())
            }
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(ExportError::Io(format!(
                    "cannot write {}: {e}",
                    path.display()
                )))
            }
        }
    }
}
