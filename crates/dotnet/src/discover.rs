//! Finding a runtime's diagnostics socket, and listing the processes that have one.
//!
//! The runtime listens on `$TMPDIR/dotnet-diagnostic-{pid}-{key}-socket` (`/tmp` when `TMPDIR` is
//! unset), where `pid` is the process id in its own PID namespace and `key` its start time in
//! clock ticks since boot (field 22 of `/proc/PID/stat`). Paths are opened through
//! `/proc/PID/root`, so processes in containers are found too.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::ipc::IpcError;

/// A process with a diagnostics socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DotnetProcess {
    /// Process id (in our PID namespace).
    pub pid: u32,
    /// Short command name (`comm`).
    pub name: String,
    /// Command line, arguments separated by spaces.
    pub command_line: String,
    /// The socket, as a path this process can open.
    pub socket: PathBuf,
}

/// The process's id inside its own PID namespace (the last `NSpid` entry), or `pid` itself.
fn namespace_pid(proc_dir: &Path, pid: u32) -> u32 {
    fs::read_to_string(proc_dir.join("status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|v| v.split_whitespace().last()?.parse().ok())
        })
        .unwrap_or(pid)
}

/// Start time in clock ticks since boot: field 22 of `/proc/PID/stat` (after the `(comm)` field).
fn start_time(proc_dir: &Path) -> Option<u64> {
    let stat = fs::read_to_string(proc_dir.join("stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields from 3 on; field 22 is the 20th of them.
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

/// Clock ticks a second in `/proc/PID/stat` (`USER_HZ`, 100 on every Linux architecture that
/// runs .NET).
const TICKS_PER_SECOND: f64 = 100.0;

/// How much earlier than the computed start of a process a socket of its own may seem made
/// (the start is known to a tick and the uptime to a hundredth of a second; a socket is made
/// well after the runtime starts). A dead process's socket under a reused pid is older by the
/// time the pids took to come round.
const STARTED_SLACK: Duration = Duration::from_secs(1);

/// When a process that started `ticks` clock ticks after boot started, by the wall clock.
fn started_at(proc_root: &Path, ticks: u64) -> Option<SystemTime> {
    let uptime: f64 = fs::read_to_string(proc_root.join("uptime"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let age = uptime - ticks as f64 / TICKS_PER_SECOND;
    SystemTime::now().checked_sub(Duration::from_secs_f64(age.max(0.0)))
}

/// Whether a file of process `pid`'s (a socket, a perf map) modified at `modified` was made
/// before the process started, by more than [`STARTED_SLACK`]: then it is a dead process's that
/// had the same pid. False when the start cannot be read.
pub fn predates_process(pid: u32, modified: SystemTime) -> bool {
    let proc_root = Path::new("/proc");
    start_time(&proc_root.join(pid.to_string()))
        .and_then(|ticks| started_at(proc_root, ticks))
        .is_some_and(|started| made_before(modified, started))
}

/// Whether a file modified at `modified` was made before a process that started at `started`.
fn made_before(modified: SystemTime, started: SystemTime) -> bool {
    modified + STARTED_SLACK < started
}

/// `TMPDIR` from the process's environment, if readable and set.
fn tmpdir_of(proc_dir: &Path) -> Option<String> {
    let env = fs::read(proc_dir.join("environ")).ok()?;
    env.split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"TMPDIR="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .filter(|v| !v.is_empty())
}

/// The directories (as seen from this process) where `pid`'s runtime may have put its socket.
fn socket_dirs(proc_dir: &Path) -> Vec<PathBuf> {
    let root = proc_dir.join("root");
    let mut dirs = Vec::new();
    if let Some(tmp) = tmpdir_of(proc_dir) {
        dirs.push(root.join(tmp.trim_start_matches('/')));
    }
    dirs.push(root.join("tmp"));
    dirs.dedup();
    dirs
}

/// The diagnostics socket of process `pid` under the name the runtime gives it (keyed by the
/// process's start time), without listing its socket directories: cheap enough to poll for a
/// process that may not be a .NET one. [`find_socket`] also finds sockets under other keys.
pub fn find_socket_by_start_key(pid: u32) -> Option<PathBuf> {
    let proc_dir = Path::new("/proc").join(pid.to_string());
    let nspid = namespace_pid(&proc_dir, pid);
    let start = start_time(&proc_dir)?;
    socket_dirs(&proc_dir)
        .into_iter()
        .map(|dir| dir.join(format!("dotnet-diagnostic-{nspid}-{start}-socket")))
        .find(|path| path.exists())
}

/// Finds the diagnostics socket of process `pid`.
pub fn find_socket(pid: u32) -> Result<PathBuf, IpcError> {
    find_socket_in(Path::new("/proc"), pid)
}

fn find_socket_in(proc_root: &Path, pid: u32) -> Result<PathBuf, IpcError> {
    let proc_dir = proc_root.join(pid.to_string());
    if !proc_dir.exists() {
        return Err(IpcError::NoProcess { pid });
    }
    let nspid = namespace_pid(&proc_dir, pid);
    let start = start_time(&proc_dir);
    let started = start.and_then(|ticks| started_at(proc_root, ticks));
    let prefix = format!("dotnet-diagnostic-{nspid}-");
    let dirs = socket_dirs(&proc_dir);
    for dir in &dirs {
        if let Some(start) = start {
            let exact = dir.join(format!("{prefix}{start}-socket"));
            if exact.exists() {
                return Ok(exact);
            }
        }
        // A socket under another key (e.g. a runtime that used another clock): take the newest
        // made since the process started. An older one is a dead process's that had the same
        // pid (a runtime killed outright leaves its socket behind).
        let Ok(entries) = fs::read_dir(dir) else {
            continue;
        };
        let newest = entries
            .flatten()
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with(&prefix) && name.ends_with("-socket")
            })
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .filter(|(made, _)| started.is_none_or(|t| !made_before(*made, t)))
            .max();
        if let Some((_, path)) = newest {
            return Ok(path);
        }
    }
    Err(IpcError::NoSocket {
        pid,
        searched: dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Every process that has a .NET diagnostics socket, by pid.
pub fn list_processes() -> Vec<DotnetProcess> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out: Vec<DotnetProcess> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let socket = find_socket(pid).ok()?;
            let dir = PathBuf::from(format!("/proc/{pid}"));
            let name = fs::read_to_string(dir.join("comm"))
                .map(|s| s.trim_end().to_string())
                .unwrap_or_default();
            let command_line = fs::read(dir.join("cmdline"))
                .map(|b| {
                    b.split(|&c| c == 0)
                        .filter(|a| !a.is_empty())
                        .map(|a| String::from_utf8_lossy(a).into_owned())
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            Some(DotnetProcess {
                pid,
                name,
                command_line,
                socket,
            })
        })
        .collect();
    out.sort_by_key(|p| p.pid);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_skips_a_comm_with_spaces_and_parens() {
        let dir = std::env::temp_dir().join(format!("rootline-dotnet-stat-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let fields: Vec<String> = (3..=30).map(|i| i.to_string()).collect();
        fs::write(
            dir.join("stat"),
            format!("42 (a b) c) {}\n", fields.join(" ")),
        )
        .unwrap();
        assert_eq!(start_time(&dir), Some(22));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_process_and_a_socketless_process_are_told_apart() {
        assert!(matches!(
            find_socket(u32::MAX - 1),
            Err(IpcError::NoProcess { .. })
        ));
        // This test process is not a .NET runtime.
        let err = find_socket(std::process::id()).unwrap_err();
        assert!(matches!(err, IpcError::NoSocket { .. }), "{err}");
        assert!(err.to_string().contains("/tmp"));
    }

    #[test]
    fn a_socket_older_than_the_process_is_a_dead_process_s_under_the_same_pid() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep runs");
        let pid = child.id();
        // Under a key other than the start time, so that only its age can tell.
        let path = PathBuf::from(format!("/tmp/dotnet-diagnostic-{pid}-1-socket"));
        let file = fs::File::create(&path).unwrap();
        file.set_modified(SystemTime::now() - Duration::from_secs(3600))
            .unwrap();
        let stale = find_socket(pid);
        file.set_modified(SystemTime::now()).unwrap();
        let fresh = find_socket(pid);
        let _ = fs::remove_file(&path);
        let _ = child.kill();
        let _ = child.wait();
        assert!(matches!(stale, Err(IpcError::NoSocket { .. })), "{stale:?}");
        let fresh = fresh.expect("a socket made since the process started is its own");
        assert_eq!(fresh.file_name(), path.file_name());
    }
}
