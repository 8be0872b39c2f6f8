//! Node (V8, `--perf-basic-prof`): JIT frames named from the perf map, unwound through JIT code
//! into node's native frames, checked against the target's known call graph
//! (`tests/jit/calls.js`).

mod jit;

use std::process::Command;

use jit::{Graph, Running, SERIAL, check, is_native_root, record_pid, require, sources, which};

const DEEP: usize = 20;

fn short(name: &str) -> Option<&'static str> {
    Some(match name {
        "main" => "main",
        "down" => "down",
        "spin" => "spin",
        "step" => "step",
        _ => return None,
    })
}

/// Records node running `calls.js` with `flag` in `dir` and checks every stack.
fn run(test: &str, flag: &str, dir: &std::path::Path) {
    let Some(node) = require(test, "node (apt-get install nodejs)", which("node")) else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut cmd = Command::new(node);
    cmd.current_dir(dir)
        .args([flag, "--no-turbo-inlining"])
        .arg(sources().join("calls.js"))
        .args([DEEP.to_string(), "60".into()]);
    let target = Running::start(cmd);
    let recording = record_pid(target.pid(), 20_000, 12.0, 16);
    let graph = Graph {
        short: &short,
        entries: &["main"],
        edges: &[
            ("main", "down"),
            ("down", "down"),
            ("down", "spin"),
            ("spin", "step"),
        ],
        recursion: Some(("down", "spin", &[("main", DEEP + 1)])),
        is_root: &is_native_root,
    };
    let v = check(&recording.profile, &graph);
    v.print(&format!("node {flag}"));
    assert!(
        v.program_samples >= 20_000,
        "{} program samples",
        v.program_samples
    );
    v.assert_whole_and_true();
}

#[test]
fn node_frames_are_named_whole_and_true() {
    let dir = tempfile::tempdir().unwrap();
    run(
        "node_frames_are_named_whole_and_true",
        "--perf-basic-prof",
        dir.path(),
    );
}
