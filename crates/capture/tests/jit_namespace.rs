//! A JIT process in its own mount and PID namespace (as in a container): it is pid 1 there and
//! writes `/tmp/perf-1.map` into a private `/tmp` that the host cannot see at that path. Its JIT
//! frames must still be named, through `/proc/PID/root` and the in-namespace pid (`NSpid`).

mod jit;

use std::process::Command;
use std::time::{Duration, Instant};

use jit::{Rate, Running, Setup, node, record_and_check, require, which};

const DEEP: usize = 10;

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
    let Some(node) = node::node(test) else {
        return;
    };
    let Some(unshare) = require(test, "unshare (util-linux)", which("unshare")) else {
        return;
    };
    let setup = Setup::new();
    let mut cmd = Command::new(unshare);
    cmd.current_dir(setup.path())
        .args(["--fork", "--pid", "--mount-proc", "--mount", "sh", "-c"])
        .arg("mount -t tmpfs rootline-private-tmp /tmp && exec \"$@\"")
        .arg("sh")
        .arg(node)
        .args(node::args(&["--perf-basic-prof"], DEEP, 60));
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

    let rate = Rate {
        hz: 10_000,
        seconds: 5.0,
        stack_kib: 16,
    };
    let (_, v) = record_and_check("node in a namespace", pid, rate, &node::graph(DEEP), 1000);
    v.assert_whole_and_true();
}
