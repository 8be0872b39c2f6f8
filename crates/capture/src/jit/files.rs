//! The runtime's files of a process (perf map, perfinfo): where the process wrote them, seen
//! through its own PID and mount namespaces, and opening them only when they are safe to read.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;

/// The last `NSpid` entry of `/proc/PID/status`: the process's id in its own PID namespace.
pub fn namespace_pid(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|v| v.split_whitespace().last()?.parse().ok())
        })
        .unwrap_or(pid)
}

/// Where process `pid` writes its perf map, as a path this process can open:
/// `/proc/PID/root/tmp/perf-NSPID.map`.
pub fn perf_map_path(pid: u32) -> PathBuf {
    PathBuf::from(format!(
        "/proc/{pid}/root/tmp/perf-{}.map",
        namespace_pid(pid)
    ))
}

/// Where a .NET process writes its image loads: `/proc/PID/root/tmp/perfinfo-NSPID.map`.
pub fn perf_info_path(pid: u32) -> PathBuf {
    PathBuf::from(format!(
        "/proc/{pid}/root/tmp/perfinfo-{}.map",
        namespace_pid(pid)
    ))
}

/// Why a JIT map was not used.
#[derive(Debug, thiserror::Error)]
pub enum MapRefused {
    /// The file does not exist (yet), or cannot be opened.
    #[error("cannot open {path}: {source}")]
    Open {
        /// The path tried.
        path: PathBuf,
        /// The cause (a symlink shows as ELOOP).
        source: std::io::Error,
    },
    /// Not a regular file.
    #[error("{0} is not a regular file")]
    NotRegular(PathBuf),
    /// Last written before the process started: a dead process's file under a reused pid.
    #[error("{0} predates the process (a dead process's under the same pid)")]
    Stale(PathBuf),
    /// Owned by someone other than the target's user or root.
    #[error("{path} is owned by uid {owner}, not by the target's uid {target} or root")]
    WrongOwner {
        /// The path.
        path: PathBuf,
        /// The file's owner.
        owner: u32,
        /// The target's uid.
        target: u32,
    },
}

/// Opens a JIT map of process `pid` safely: no symlink in the last component (`O_NOFOLLOW`), a
/// regular file, owned by the process's uid or root, and written since the process started.
pub fn open_map(pid: u32, path: &std::path::Path) -> Result<File, MapRefused> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| MapRefused::Open {
            path: path.to_path_buf(),
            source,
        })?;
    let meta = file.metadata().map_err(|source| MapRefused::Open {
        path: path.to_path_buf(),
        source,
    })?;
    if !meta.file_type().is_file() {
        return Err(MapRefused::NotRegular(path.to_path_buf()));
    }
    if meta
        .modified()
        .is_ok_and(|m| rootline_dotnet::discover::predates_process(pid, m))
    {
        return Err(MapRefused::Stale(path.to_path_buf()));
    }
    let target = std::fs::metadata(format!("/proc/{pid}"))
        .map(|m| m.uid())
        .unwrap_or(0);
    if meta.uid() != 0 && meta.uid() != target {
        return Err(MapRefused::WrongOwner {
            path: path.to_path_buf(),
            owner: meta.uid(),
            target,
        });
    }
    Ok(file)
}
