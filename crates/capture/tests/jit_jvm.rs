//! The JVM (HotSpot, `-XX:+PreserveFramePointer`, perf map written by
//! `jcmd PID Compiler.perfmap`): compiled frames named from the perf map, unwound through
//! compiled code, the interpreter and the call stub into libjvm's native frames, checked against
//! the target's known call graph (`tests/jit/Calls.java`).

mod jit;

use std::process::Command;

use jit::{Graph, Rate, Running, Setup, is_native_root, record_and_check, require, sources, which};

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
    let setup = Setup::new();
    let status = Command::new(javac)
        .arg("-d")
        .arg(setup.path())
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
    .arg(setup.path())
    .args(["Calls", &DEEP.to_string(), "2", "90"]);
    let target = Running::start(cmd);
    let out = Command::new(jcmd)
        .arg(target.pid().to_string())
        .arg("Compiler.perfmap")
        .output()
        .expect("run jcmd");
    assert!(out.status.success(), "jcmd failed: {out:?}");
    let graph = Graph {
        short: &short,
        entries: &["worker"],
        edges: &[
            ("worker", "down"),
            ("down", "down"),
            ("down", "spin"),
            ("spin", "step"),
        ],
        recursion: Some(("down", "spin", vec![("worker", DEEP + 1)])),
        is_root: &is_native_root,
    };
    let rate = Rate {
        hz: 20_000,
        seconds: 12.0,
        stack_kib: 16,
    };
    let (_, v) = record_and_check("jvm", target.pid(), rate, &graph, 20_000);
    if v.impossible_edges > 0 {
        // The compiled methods' bounds, to place the addresses of the examples above.
        let map = std::fs::read_to_string(format!("/tmp/perf-{}.map", target.pid()));
        for line in map
            .iter()
            .flat_map(|m| m.lines())
            .filter(|l| l.contains("Calls."))
        {
            println!("  perf map: {line}");
        }
    }
    v.assert_whole_and_true();
}
