//! Which processes the agent profiles: the whole host, a PID list, processes whose name or command
//! line matches a regex, or processes in a cgroup (a pod). Targets come and go while the agent runs,
//! so a process is judged when its first sample arrives, and [`Targets::scan`] lists the current
//! matches for sources that sample per process.

use std::fs;
use std::path::{Path, PathBuf};

use regex::Regex;

use crate::process::ProcessInfo;

/// What to profile, as configured.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// Profile every process on the host (per-CPU sampling). The default when nothing else is set.
    #[serde(default)]
    pub host: bool,
    /// Process ids to profile.
    #[serde(default)]
    pub pids: Vec<u32>,
    /// Regexes matched against each process's `comm` and its command line.
    #[serde(default)]
    pub regex: Vec<String>,
    /// Cgroup paths (as in `/proc/PID/cgroup`, e.g. `/kubepods/burstable/pod<uid>`); a process in
    /// that cgroup or below it matches.
    #[serde(default)]
    pub cgroups: Vec<String>,
}

/// A target error: a regex that does not compile.
#[derive(Debug, thiserror::Error)]
#[error("target regex {pattern:?} is invalid: {source}")]
pub struct TargetError {
    /// The pattern as configured.
    pub pattern: String,
    /// Why it does not compile.
    #[source]
    pub source: regex::Error,
}

/// Compiled target rules.
#[derive(Debug, Clone)]
pub struct Targets {
    host: bool,
    pids: Vec<u32>,
    regexes: Vec<Regex>,
    cgroups: Vec<String>,
    proc_root: PathBuf,
}

impl Targets {
    /// Compiles the configured rules; with no rule at all, the whole host is the target.
    pub fn new(config: &TargetConfig, proc_root: &Path) -> Result<Targets, TargetError> {
        let regexes = config
            .regex
            .iter()
            .map(|pattern| {
                Regex::new(pattern).map_err(|source| TargetError {
                    pattern: pattern.clone(),
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let nothing = config.pids.is_empty() && regexes.is_empty() && config.cgroups.is_empty();
        Ok(Targets {
            host: config.host || nothing,
            pids: config.pids.clone(),
            regexes,
            cgroups: config
                .cgroups
                .iter()
                .map(|c| c.trim_end_matches('/').to_string())
                .collect(),
            proc_root: proc_root.to_path_buf(),
        })
    }

    /// True when every process is a target.
    pub fn is_host(&self) -> bool {
        self.host
    }

    /// True when the process described by `info` is a target.
    pub fn matches(&self, info: &ProcessInfo) -> bool {
        if self.host || self.pids.contains(&info.pid) {
            return true;
        }
        let text_match = |re: &Regex| {
            info.comm.as_deref().is_some_and(|c| re.is_match(c))
                || info.command_line.as_deref().is_some_and(|c| re.is_match(c))
        };
        if self.regexes.iter().any(text_match) {
            return true;
        }
        info.cgroups.iter().chain(&info.cgroup).any(|path| {
            self.cgroups.iter().any(|want| {
                path == want
                    || path
                        .strip_prefix(want.as_str())
                        .is_some_and(|rest| rest.starts_with('/'))
                    || want.is_empty()
            })
        })
    }

    /// The processes that match now (`None` for the whole host), for sources that sample per
    /// process. Processes that exit during the scan are skipped.
    pub fn scan(&self) -> Option<Vec<u32>> {
        if self.host {
            return None;
        }
        let mut pids = Vec::new();
        let Ok(dir) = fs::read_dir(&self.proc_root) else {
            return Some(self.pids.clone());
        };
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if self.pids.contains(&pid) || self.matches(&ProcessInfo::read(&self.proc_root, pid)) {
                pids.push(pid);
            }
        }
        pids.sort_unstable();
        Some(pids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(pid: u32, comm: &str, cmd: &str, cgroup: &str) -> ProcessInfo {
        ProcessInfo {
            pid,
            comm: Some(comm.into()),
            command_line: Some(cmd.into()),
            cgroup: Some(cgroup.into()),
            ..ProcessInfo::default()
        }
    }

    #[test]
    fn empty_config_means_host() {
        let t = Targets::new(&TargetConfig::default(), Path::new("/proc")).unwrap();
        assert!(t.is_host());
        assert!(t.matches(&ProcessInfo::unknown(1)));
        assert_eq!(t.scan(), None);
    }

    #[test]
    fn pid_regex_and_cgroup_rules() {
        let config = TargetConfig {
            pids: vec![7],
            regex: vec!["^java$".into(), "--profile-me".into()],
            cgroups: vec!["/kubepods/pod1/".into()],
            ..TargetConfig::default()
        };
        let t = Targets::new(&config, Path::new("/proc")).unwrap();
        assert!(t.matches(&info(7, "x", "x", "/")));
        assert!(t.matches(&info(8, "java", "java -jar a", "/")));
        assert!(t.matches(&info(9, "py", "py app.py --profile-me", "/")));
        assert!(t.matches(&info(10, "py", "py", "/kubepods/pod1/abc")));
        assert!(t.matches(&info(10, "py", "py", "/kubepods/pod1")));
        assert!(!t.matches(&info(11, "py", "py", "/kubepods/pod10")));
        assert!(!t.matches(&info(12, "javac", "javac", "/")));
    }

    #[test]
    fn bad_regex_is_an_error() {
        let config = TargetConfig {
            regex: vec!["(".into()],
            ..TargetConfig::default()
        };
        assert!(Targets::new(&config, Path::new("/proc")).is_err());
    }

    #[test]
    fn scan_finds_this_test_process() {
        let config = TargetConfig {
            pids: vec![std::process::id()],
            ..TargetConfig::default()
        };
        let t = Targets::new(&config, Path::new("/proc")).unwrap();
        assert!(t.scan().unwrap().contains(&std::process::id()));
    }
}
