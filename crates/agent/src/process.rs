//! What the agent knows about a sampled process, read once from `/proc` when it is first seen.

use std::fs;
use std::path::{Path, PathBuf};

/// Facts about a process, used for target matching and for resource attributes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Process id (host PID namespace).
    pub pid: u32,
    /// Short command name (`/proc/PID/comm`).
    pub comm: Option<String>,
    /// Command line, arguments joined by spaces (`/proc/PID/cmdline`).
    pub command_line: Option<String>,
    /// Executable path (`/proc/PID/exe`).
    pub executable: Option<String>,
    /// The process's cgroup v2 path (or the first v1 path), e.g. `/kubepods/burstable/pod…/…`.
    pub cgroup: Option<String>,
    /// Container id found in the cgroup path (64 hex digits), when in a container.
    pub container_id: Option<String>,
}

impl ProcessInfo {
    /// Reads what `/proc` (at `proc_root`, normally `/proc`) says about `pid`. Whatever cannot be
    /// read (the process exited, permissions) is left `None`; this never fails.
    pub fn read(proc_root: &Path, pid: u32) -> ProcessInfo {
        let dir = proc_root.join(pid.to_string());
        let comm = fs::read_to_string(dir.join("comm"))
            .ok()
            .map(|s| s.trim_end_matches('\n').to_string());
        let command_line = fs::read(dir.join("cmdline")).ok().and_then(|raw| {
            let parts: Vec<String> = raw
                .split(|&b| b == 0)
                .filter(|p| !p.is_empty())
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect();
            (!parts.is_empty()).then(|| parts.join(" "))
        });
        let executable = fs::read_link(dir.join("exe"))
            .ok()
            .map(|p: PathBuf| p.to_string_lossy().into_owned());
        let cgroup = fs::read_to_string(dir.join("cgroup"))
            .ok()
            .and_then(|text| cgroup_path(&text));
        let container_id = cgroup.as_deref().and_then(container_id);
        ProcessInfo {
            pid,
            comm,
            command_line,
            executable,
            cgroup,
            container_id,
        }
    }

    /// A process known only by its id.
    pub fn unknown(pid: u32) -> ProcessInfo {
        ProcessInfo {
            pid,
            ..ProcessInfo::default()
        }
    }
}

/// The cgroup path from `/proc/PID/cgroup`: the v2 line (`0::/path`), else the first v1 line's path.
pub fn cgroup_path(text: &str) -> Option<String> {
    let mut first = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(_controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" {
            return Some(path.to_string());
        }
        first.get_or_insert_with(|| path.to_string());
    }
    first
}

/// The container id in a cgroup path: the last component holding a run of 64 hex digits
/// (`…/docker-<id>.scope`, `…/cri-containerd-<id>.scope`, `…/<id>`).
pub fn container_id(cgroup: &str) -> Option<String> {
    cgroup.rsplit('/').find_map(|component| {
        let bytes = component.as_bytes();
        let mut run_start = 0;
        for i in 0..=bytes.len() {
            let hex = i < bytes.len() && bytes[i].is_ascii_hexdigit();
            if !hex {
                if i - run_start == 64 {
                    return Some(component[run_start..i].to_ascii_lowercase());
                }
                run_start = i + 1;
            }
        }
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        let me = ProcessInfo::read(Path::new("/proc"), std::process::id());
        assert!(me.comm.is_some());
        assert!(me.command_line.is_some());
        assert!(me.cgroup.is_some());
    }

    #[test]
    fn container_ids_from_common_layouts() {
        let id = "a".repeat(60) + "0f9e";
        assert_eq!(
            container_id(&format!("/kubepods/burstable/pod1234/{id}")).as_deref(),
            Some(id.as_str())
        );
        assert_eq!(
            container_id(&format!("/system.slice/docker-{id}.scope")).as_deref(),
            Some(id.as_str())
        );
        assert_eq!(
            container_id("/user.slice/user-0.slice/session-3.scope"),
            None
        );
    }

    #[test]
    fn cgroup_v2_line_wins() {
        assert_eq!(cgroup_path("12:cpu:/a\n0::/b/c\n").as_deref(), Some("/b/c"));
        assert_eq!(cgroup_path("12:cpu:/a\n").as_deref(), Some("/a"));
    }
}
