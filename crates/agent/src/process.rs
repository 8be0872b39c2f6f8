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
    /// The process's most specific cgroup path, e.g. `/kubepods/burstable/pod…/…` (see
    /// `cgroup_paths`).
    pub cgroup: Option<String>,
    /// Every distinct cgroup path of the process (the v2 path and each v1 hierarchy's).
    pub cgroups: Vec<String>,
    /// Container id found in the cgroup path (64 hex digits), when in a container.
    pub container_id: Option<String>,
    /// Kubernetes pod UID found in the cgroup path (`…/pod<uid>/…` or
    /// `…-pod<uid_with_underscores>.slice`), when in a pod.
    pub pod_uid: Option<String>,
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
        let cgroups = fs::read_to_string(dir.join("cgroup"))
            .map(|text| cgroup_paths(&text))
            .unwrap_or_default();
        let cgroup = cgroups.first().cloned();
        let container_id = cgroups.iter().find_map(|p| container_id(p));
        let pod_uid = cgroups.iter().find_map(|p| pod_uid(p));
        ProcessInfo {
            pid,
            comm,
            command_line,
            executable,
            cgroup,
            cgroups,
            container_id,
            pod_uid,
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

/// Resident set size of the agent's own process, from `/proc/self/status` (`VmRSS`).
pub fn own_rss_bytes() -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The distinct cgroup paths in `/proc/PID/cgroup`, most specific first: the v2 line (`0::/path`)
/// unless it is the root `/` (as on hybrid v1 hosts, where the v1 lines carry the real placement),
/// then the v1 paths in file order, `/` last.
pub fn cgroup_paths(text: &str) -> Vec<String> {
    let mut v2 = None;
    let mut paths: Vec<String> = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(_controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" {
            v2 = Some(path.to_string());
        } else if !paths.iter().any(|p| p == path) {
            paths.push(path.to_string());
        }
    }
    if let Some(v2) = v2 {
        paths.retain(|p| *p != v2);
        paths.insert(0, v2);
    }
    // The root says nothing; keep it only as the last resort.
    paths.sort_by_key(|p| p == "/");
    paths
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

/// The Kubernetes pod UID in a cgroup path: `pod` followed by a UUID, written with dashes
/// (cgroupfs driver: `/kubepods/burstable/pod<uid>/…`) or underscores (systemd driver:
/// `…/kubepods-burstable-pod<uid>.slice/…`). Returned with dashes, lowercase.
pub fn pod_uid(cgroup: &str) -> Option<String> {
    cgroup.split('/').find_map(|component| {
        let at = component.rfind("pod")?;
        let rest = component[at + 3..].trim_end_matches(".slice");
        let uid = rest.replace('_', "-").to_ascii_lowercase();
        let groups: Vec<&str> = uid.split('-').collect();
        let shape = [8, 4, 4, 4, 12];
        let is_uuid = groups.len() == shape.len()
            && groups
                .iter()
                .zip(shape)
                .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()));
        is_uuid.then_some(uid)
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
    fn own_rss_is_read() {
        let rss = own_rss_bytes().unwrap();
        assert!(rss > 1 << 20 && rss < 1 << 40, "{rss}");
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
    fn pod_uids_from_both_cgroup_drivers() {
        let uid = "0b6e3b0a-9c1f-4d2e-8f00-1234567890ab";
        assert_eq!(
            pod_uid(&format!("/kubepods/burstable/pod{uid}/{}", "a".repeat(64))).as_deref(),
            Some(uid)
        );
        assert_eq!(
            pod_uid(&format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/\
                 cri-containerd-{}.scope",
                uid.replace('-', "_"),
                "b".repeat(64)
            ))
            .as_deref(),
            Some(uid)
        );
        assert_eq!(pod_uid("/kubepods/burstable/podnotauuid"), None);
        assert_eq!(pod_uid("/system.slice/docker.service"), None);
    }

    #[test]
    fn cgroup_paths_most_specific_first() {
        assert_eq!(cgroup_paths("12:cpu:/a\n0::/b/c\n"), ["/b/c", "/a"]);
        assert_eq!(cgroup_paths("12:cpu:/a\n"), ["/a"]);
        // Hybrid v1 host: the v2 line is the root, the memory hierarchy has the placement.
        assert_eq!(
            cgroup_paths("5:devices:/\n4:memory:/kubepods/pod1/abc\n1:cpu:/\n0::/\n"),
            ["/kubepods/pod1/abc", "/"]
        );
    }
}
