//! A JIT process in its own mount and PID namespace (as in a container): it is pid 1 there and
//! writes `/tmp/perf-1.map` into a private `/tmp` that the host cannot see at that path. Its JIT
//! frames must still be named, through `/proc/PID/root` and the in-namespace pid (`NSpid`).

mod jit;

use std::process::Command;
use std::time::{Duration, Instant};

use jit::{Graph, Running, SERIAL, check, is_native_root, record_pid, require, sources, which};

const DEEP: usize = 10;

fn short(name: &str) -> Option<&'static str> {
    Some(match name {
        "main" => "main",
        "down" => "down",
        "spin" => "spin",
        "step" => "step",
        _ => return None,
    })
}

/// The first child of `pid` (unshare --fork runs the command as its child).
fn child_of(pid: u32) -> u32 {
    let t0 = Instant::now();
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(c) = children.split_whitespace().next() {
            return c.parse().unwrap();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "unshare has no child"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn jit_frames_are_named_inside_a_pid_and_mount_namespace() {
    let test = "jit_frames_are_named_inside_a_pid_and_mount_namespace";
    let Some(node) = require(test, "node", which("node")) else {
        return;
    };
    let Some(unshare) = require(test, "unshare (util-linux)", which("unshare")) else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let script = format!(
        "mount -t tmpfs rootline-private-tmp /tmp && exec {} --perf-basic-prof \
         --no-turbo-inlining {} {DEEP} 60",
        node.display(),
        sources().join("calls.js").display()
    );
    // node writes a V8 log into its working directory: keep it out of the source tree.
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(unshare);
    cmd.current_dir(dir.path()).args([
        "--fork",
        "--pid",
        "--mount-proc",
        "--mount",
        "sh",
        "-c",
        &script,
    ]);
    let target = Running::start(cmd);
    let pid = child_of(target.pid());
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let nspid = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>();
    assert_eq!(nspid.len(), 2, "the target is in a child PID namespace");
    assert_eq!(nspid[1], "1");
    // The map exists only inside the target's mount namespace.
    assert!(
        std::fs::metadata(format!("/proc/{pid}/root/tmp/perf-1.map")).is_ok(),
        "the target writes its perf map into its own /tmp"
    );
    assert!(std::fs::metadata(format!("/tmp/perf-{pid}.map")).is_err());

    let recording = record_pid(pid, 10_000, 5.0, 16);
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
    v.print("node in a namespace");
    assert!(
        v.program_samples >= 1000,
        "{} program samples",
        v.program_samples
    );
    assert_eq!(v.impossible_edges, 0);
    assert_eq!(v.unnamed, 0);
    assert_eq!(v.invented, 0);
    assert_eq!(v.truncated, 0);
    assert_eq!(v.wrong_recursion, 0);
}
