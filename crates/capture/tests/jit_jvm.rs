//! The JVM (HotSpot, `-XX:+PreserveFramePointer`, perf map written by
//! `jcmd PID Compiler.perfmap`): compiled frames named from the perf map, unwound through
//! compiled code, the interpreter and the call stub into libjvm's native frames, checked against
//! the target's known call graph (`tests/jit/Calls.java`).

mod jit;

use std::process::Command;

use jit::{Graph, Running, SERIAL, check, is_native_root, record_pid, require, sources, which};

const DEEP: usize = 20;

fn short(name: &str) -> Option<&'static str> {
    Some(match name {
        "Calls.worker(int, long)" => "worker",
        "Calls.down(int, int)" => "down",
        "Calls.spin(int)" => "spin",
        "Calls.step(int, int)" => "step",
        _ => return None,
    })
}

#[test]
fn jvm_frames_are_named_whole_and_true() {
    let test = "jvm_frames_are_named_whole_and_true";
    let tools = which("java").zip(which("javac")).zip(which("jcmd"));
    let Some(((java, javac), jcmd)) = require(
        test,
        "a JDK (apt-get install openjdk-17-jdk-headless)",
        tools,
    ) else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(javac)
        .arg("-d")
        .arg(dir.path())
        .arg(sources().join("Calls.java"))
        .status()
        .expect("run javac");
    assert!(status.success(), "javac failed");
    let mut cmd = Command::new(java);
    // Without tiered compilation the code is compiled once (by C2), before `ready`, so the perf
    // map written then names all of it.
    cmd.args([
        "-XX:+PreserveFramePointer",
        "-XX:-Inline",
        "-XX:-TieredCompilation",
        "-cp",
    ])
    .arg(dir.path())
    .args(["Calls", &DEEP.to_string(), "2", "90"]);
    let target = Running::start(cmd);
    let out = Command::new(jcmd)
        .arg(target.pid().to_string())
        .arg("Compiler.perfmap")
        .output()
        .expect("run jcmd");
    assert!(out.status.success(), "jcmd failed: {out:?}");
    let recording = record_pid(target.pid(), 20_000, 12.0, 16);
    let graph = Graph {
        short: &short,
        entries: &["worker"],
        edges: &[
            ("worker", "down"),
            ("down", "down"),
            ("down", "spin"),
            ("spin", "step"),
        ],
        recursion: Some(("down", "spin", &[("worker", DEEP + 1)])),
        is_root: &is_native_root,
    };
    let v = check(&recording.profile, &graph);
    v.print("jvm");
    assert!(
        v.program_samples >= 20_000,
        "{} program samples",
        v.program_samples
    );
    v.assert_whole_and_true();
}
