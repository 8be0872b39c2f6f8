//! Turning perf maps on in a live .NET process for the length of a recording.
//!
//! What the caller does: before sampling process `pid`, call [`PerfMapGuard::enable`]; keep the
//! guard while recording; drop it (or call [`PerfMapGuard::finish`]) afterwards. What this does:
//! finds the process's diagnostics socket ([`crate::discover`], through `/proc/PID/root`), sends
//! `EnablePerfMap` (.NET 8+), and on the way out `DisablePerfMap` — but only if the process was
//! not writing a perf map already (one started with `DOTNET_PerfMapEnabled=1` keeps it).

use std::path::PathBuf;

use crate::discover;
use crate::ipc::{DiagnosticsClient, E_UNKNOWN_COMMAND, IpcError, PerfMapType};

/// How to tell a user to get perf maps from a runtime that cannot switch them on while running.
pub const START_TIME_HINT: &str = "start it with DOTNET_PerfMapEnabled=1 \
     (COMPlus_PerfMapEnabled=1 before .NET 5) to get names for its JIT-compiled code";

/// What [`PerfMapGuard::enable`] found.
#[derive(Debug)]
pub enum Outcome {
    /// Perf maps are on (switched on now, or already on).
    Enabled(PerfMapGuard),
    /// The process has no diagnostics socket: not a .NET process (or diagnostics are off).
    NotDotnet,
    /// A runtime older than .NET 8 answered "unknown command"; the message says what to do.
    Unsupported(String),
    /// Talking to the runtime failed.
    Failed(IpcError),
}

/// Perf maps switched on in one process; switches them off again when dropped if it switched
/// them on.
#[derive(Debug)]
pub struct PerfMapGuard {
    pid: u32,
    client: DiagnosticsClient,
    disable: bool,
}

/// Where the process writes its perf map, as this process can see it.
fn map_path(pid: u32) -> PathBuf {
    let nspid = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|v| v.split_whitespace().last()?.parse::<u32>().ok())
        })
        .unwrap_or(pid);
    PathBuf::from(format!("/proc/{pid}/root/tmp/perf-{nspid}.map"))
}

impl PerfMapGuard {
    /// Sends `EnablePerfMap` to process `pid` if it is a .NET process.
    pub fn enable(pid: u32) -> Outcome {
        let socket = match discover::find_socket(pid) {
            Ok(s) => s,
            Err(IpcError::NoSocket { .. } | IpcError::NoProcess { .. }) => {
                return Outcome::NotDotnet;
            }
            Err(e) => return Outcome::Failed(e),
        };
        Self::enable_at(pid, DiagnosticsClient::new(socket))
    }

    /// Sends `EnablePerfMap` through `client` (the socket of process `pid`).
    pub fn enable_at(pid: u32, client: DiagnosticsClient) -> Outcome {
        let already = std::fs::symlink_metadata(map_path(pid)).is_ok_and(|m| m.is_file());
        match client.enable_perf_map(PerfMapType::PerfMap) {
            Ok(()) => Outcome::Enabled(PerfMapGuard {
                pid,
                client,
                disable: !already,
            }),
            Err(IpcError::Server {
                hresult: E_UNKNOWN_COMMAND,
                ..
            }) => Outcome::Unsupported(format!(
                "process {pid} runs a .NET older than 8, which cannot switch perf maps on while \
                 running (it answered \"unknown command\" to EnablePerfMap); {START_TIME_HINT}"
            )),
            Err(e) => Outcome::Failed(e),
        }
    }

    /// The process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether dropping the guard sends `DisablePerfMap` (false when the map was already being
    /// written before).
    pub fn will_disable(&self) -> bool {
        self.disable
    }

    /// Sends `DisablePerfMap` now if this guard switched perf maps on, reporting the result.
    pub fn finish(mut self) -> Result<(), IpcError> {
        let disable = std::mem::replace(&mut self.disable, false);
        if disable {
            self.client.disable_perf_map()
        } else {
            Ok(())
        }
    }
}

impl Drop for PerfMapGuard {
    fn drop(&mut self) {
        if self.disable {
            let _ = self.client.disable_perf_map();
        }
    }
}
