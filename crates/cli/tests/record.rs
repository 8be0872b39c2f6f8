//! `rootline record` end to end: a launched command recorded to `.rlp` and re-read, how the command
//! ended, a command that cannot start, and the exit codes of docs/design.md (3: target gone, 2:
//! permission, with the fix named).
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
    assert!(
        stderr.contains("rootline: the command exited with status 0"),
        "{stderr}"
    );
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

/// Records `sh -c SCRIPT` into a folded file; returns rootline's exit code and stderr.
fn record_shell(script: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = rootline()
        .args(["record", "-o"])
        .arg(dir.path().join("sh.folded"))
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_summary_says_how_the_command_ended() {
    let (code, stderr) = record_shell("exit 3");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("rootline: the command exited with status 3\n"),
        "{stderr}"
    );
    let (code, stderr) = record_shell("kill -KILL $$");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("rootline: the command was killed by signal 9 (SIGKILL)\n"),
        "{stderr}"
    );
}

/// `rootline record -o DIR/out.rlp -- PROGRAM`: exit 1, exactly `expected` on stderr, no profile.
fn assert_cannot_run(program: &std::path::Path, expected: &str) {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("out.rlp");
    let out = rootline()
        .args(["record", "-o"])
        .arg(&profile)
        .arg("--")
        .arg(program)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("{expected}\n")
    );
    assert!(out.stdout.is_empty(), "{out:?}");
    assert!(!profile.exists(), "a profile was written");
}

#[test]
fn a_command_that_cannot_start_is_a_one_line_error() {
    assert_cannot_run(
        "/no/such/program".as_ref(),
        "rootline: error: cannot run /no/such/program: No such file or directory (os error 2)",
    );
    // Looked up in PATH, as a shell would.
    assert_cannot_run(
        "rootline-no-such-program".as_ref(),
        "rootline: error: cannot run rootline-no-such-program: No such file or directory (os error 2)",
    );
    // A file without execute permission.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    assert_cannot_run(
        &script,
        &format!(
            "rootline: error: cannot run {}: Permission denied (os error 13)",
            script.display()
        ),
    );
    // A directory.
    assert_cannot_run(
        dir.path(),
        &format!(
            "rootline: error: cannot run {}: Permission denied (os error 13)",
            dir.path().display()
        ),
    );
}

/// `--kernel-walk-mib` sizes the in-kernel walk's rules table: at 1 MiB (65,536 rows) a compiler's
/// binaries do not fit, and the summary says so and names the option; at the default they fit.
#[test]
fn the_kernel_walk_table_is_sized_by_option_and_a_full_one_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("many.c");
    // About two seconds of cc1: its rows are compiled and refused well before it ends.
    let functions: String = (0..600)
        .map(|i| format!("int f{i}(int x) {{ int s = 0; for (int j = 0; j < x; j++) s += j * {i} ^ (s >> 3); return s; }}\n"))
        .collect();
    std::fs::write(&source, functions).unwrap();
    let summary = |mib: &str| {
        let out = rootline()
            .args(["record", "--kernel-walk-mib", mib, "-o"])
            .arg(dir.path().join("cc.rlp"))
            .args(["--", "cc", "-O2", "-c"])
            .arg(&source)
            .arg("-o")
            .arg(dir.path().join("many.o"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        stderr
    };
    let small = summary("1");
    if !small.contains("in-kernel stack walk:") && std::env::var_os("CI").is_none() {
        eprintln!("skipped: no in-kernel walk here: {small}");
        return;
    }
    assert!(
        small.contains("binaries did not fit (a larger table: --kernel-walk-mib)"),
        "{small}"
    );
    let default = summary("64");
    assert!(default.contains("in-kernel stack walk:"), "{default}");
    assert!(!default.contains("did not fit"), "{default}");
}
