//! `rootline report`'s hottest paths on real recordings: rootline's own demo workload (Rust, two
//! threads) and the C call graph program (main and a worker thread). Identical displayed paths
//! appear once; the runtime's start-up frames are hidden by default and shown with
//! `--show-startup`; a C program's own `main` stays.
#![cfg(target_os = "linux")]

use std::path::Path;
use std::process::Command;

#[path = "../../capture/tests/common/callgraph.rs"]
mod callgraph;

fn rootline() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rootline"))
}

/// Records `command` into `out` (an `.rlp`).
fn record(out: &Path, command: &[&str]) {
    let status = rootline()
        .args(["record", "-F", "999", "-o"])
        .arg(out)
        .arg("--")
        .args(command)
        .output()
        .expect("rootline runs");
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
}

/// The hottest paths `rootline report` prints for `input` (with `extra` arguments).
fn hottest_paths(input: &Path, extra: &[&str]) -> Vec<String> {
    let out = rootline()
        .arg("report")
        .arg(input)
        .args(["--top", "50"])
        .args(extra)
        .output()
        .expect("rootline runs");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let section = text
        .split_once("\nHottest paths")
        .unwrap_or_else(|| panic!("no hottest paths in {text}"))
        .1;
    section
        .lines()
        .skip(1)
        .filter(|l| l.starts_with("      "))
        .map(|l| l.trim().to_string())
        .collect()
}

fn assert_unique(paths: &[String]) {
    for (i, p) in paths.iter().enumerate() {
        assert!(!paths[..i].contains(p), "path shown twice: {p}");
    }
}

/// Whether a displayed frame is one of the start-up frames every path of the demo begins with.
fn is_startup(frame: &str) -> bool {
    frame == "_start"
        || frame.starts_with("__libc_start")
        || frame.contains("lang_start")
        || frame.contains("__rust_begin_short_backtrace")
        || frame == "start_thread"
        || frame.ends_with("clone3")
}

#[test]
fn rust_demo_paths_start_at_the_programs_own_code() {
    let dir = tempfile::tempdir().unwrap();
    let rlp = dir.path().join("demo.rlp");
    let exe = env!("CARGO_BIN_EXE_rootline");
    record(&rlp, &[exe, "demo-workload", "--seconds", "1"]);

    let paths = hottest_paths(&rlp, &[]);
    assert_unique(&paths);
    for path in &paths {
        // A sample in start-up code itself keeps its leaf (the report always shows one frame);
        // start-up frames are never shown before the program's own.
        let frames: Vec<&str> = path.split(" → ").collect();
        assert!(
            frames.len() == 1 || !frames.iter().any(|f| is_startup(f)),
            "start-up frame shown in {path}"
        );
    }
    let main: Vec<_> = paths
        .iter()
        .filter(|p| p.contains("checksum_pass"))
        .collect();
    let render: Vec<_> = paths.iter().filter(|p| p.contains("render_pass")).collect();
    assert!(!main.is_empty() && !render.is_empty(), "{paths:#?}");
    for p in main {
        assert!(p.starts_with("rootline::main → "), "{p}");
    }
    for p in render {
        assert!(
            p.starts_with("rootline::demo::run_workload::{closure#0} → "),
            "{p}"
        );
    }

    let full = hottest_paths(&rlp, &["--show-startup"]);
    assert_unique(&full);
    for p in full.iter().filter(|p| p.contains("checksum_pass")) {
        assert!(p.starts_with("_start → "), "{p}");
        assert!(p.contains("std::rt::lang_start_internal"), "{p}");
    }
    for p in full.iter().filter(|p| p.contains("render_pass")) {
        // clone3 under its own name or glibc's internal alias (__GI___clone3).
        let (root, rest) = p.split_once(" → ").unwrap();
        assert!(
            root.ends_with("clone3") && rest.starts_with("start_thread → "),
            "{p}"
        );
    }
}

#[test]
fn c_paths_keep_main_and_merge_threads() {
    let dir = tempfile::tempdir().unwrap();
    let exe = callgraph::build_callgraph("report_paths_callgraph", &["-O2"]);
    let rlp = dir.path().join("callgraph.rlp");
    // Main and one worker thread run the same work → a → leaf.
    record(&rlp, &[exe.to_str().unwrap(), "1", "1"]);

    let paths = hottest_paths(&rlp, &[]);
    assert_unique(&paths);
    let leaf: Vec<_> = paths.iter().filter(|p| p.ends_with("a → leaf")).collect();
    assert!(
        leaf.contains(&&"main → work → a → leaf".to_string()),
        "{paths:#?}"
    );
    assert!(
        leaf.contains(&&"worker → work → a → leaf".to_string()),
        "{paths:#?}"
    );
    assert_eq!(leaf.len(), 2, "{leaf:#?}");

    let full = hottest_paths(&rlp, &["--show-startup"]);
    assert_unique(&full);
    assert!(
        full.iter()
            .any(|p| p.starts_with("_start → ") && p.ends_with("main → work → a → leaf")),
        "{full:#?}"
    );
}
