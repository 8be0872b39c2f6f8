//! `rootline record` end to end: a launched command recorded to `.rlp` and re-read, and the
//! exit codes of DESIGN.md §6 (3: target gone, 2: permission, with the fix named).
#![cfg(target_os = "linux")]

use std::process::Command;

fn rootline() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rootline"))
}

#[test]
fn records_a_command_into_a_readable_rlp() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sh.rlp");
    // A shell loop: CPU time in a process that exits by itself.
    let status = rootline()
        .args(["record", "-F", "2000", "-o"])
        .arg(&out)
        .args([
            "--",
            "sh",
            "-c",
            "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done",
        ])
        .output()
        .expect("rootline runs");
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert!(status.status.success(), "{stderr}");
    assert!(stderr.contains("samples on"), "summary on stderr: {stderr}");
    let report = rootline().arg("report").arg(&out).output().unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(report.status.success());
    assert!(text.contains("Profile from rootline record"), "{text}");
}

#[test]
fn a_missing_pid_exits_with_3() {
    // PIDs above the kernel's pid_max do not exist.
    let out = rootline()
        .args([
            "record",
            "-p",
            "2147483647",
            "--duration",
            "1",
            "-o",
            "/dev/null",
            "--format",
            "folded",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("does not exist"), "{stderr}");
}

#[test]
fn no_permission_exits_with_2_and_names_the_fix() {
    let paranoid: i32 = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(2);
    let is_root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    if !is_root || paranoid < 1 || Command::new("setpriv").arg("--help").output().is_err() {
        eprintln!("skipped: needs root, setpriv and kernel.perf_event_paranoid >= 1");
        return;
    }
    // System-wide sampling as an unprivileged user is refused when paranoid >= 1.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_rootline"))
        .args([
            "record",
            "-a",
            "--duration",
            "0.1",
            "-o",
            "/dev/null",
            "--format",
            "folded",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("perf_event_paranoid"), "{stderr}");
    assert!(stderr.contains("CAP_PERFMON"), "{stderr}");
}
