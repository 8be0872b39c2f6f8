//! Node (V8): JIT frames named from the perf map (`--perf-basic-prof`) or from the jitdump file
//! (`--perf-prof`), unwound through JIT code into node's native frames, checked against the
//! target's known call graph (`tests/jit/calls.js`).

mod jit;

use std::process::Command;

use jit::{Rate, Running, Setup, node, record_and_check};
use rootline_profile::FrameKind;

const DEEP: usize = 20;
const RATE: Rate = Rate {
    hz: 20_000,
    seconds: 12.0,
    stack_kib: 16,
};

#[test]
fn node_frames_are_named_whole_and_true() {
    let Some(node) = node::node("node_frames_are_named_whole_and_true") else {
        return;
    };
    let setup = Setup::new();
    let mut cmd = Command::new(node);
    // node writes a V8 log into its working directory: keep it out of the source tree.
    cmd.current_dir(setup.path())
        .args(node::args(&["--perf-basic-prof"], DEEP, 60));
    let target = Running::start(cmd);
    let (_, v) = record_and_check(
        "node --perf-basic-prof",
        target.pid(),
        RATE,
        &node::graph(DEEP),
        20_000,
    );
    v.assert_whole_and_true();
}

/// `--perf-prof` writes no perf map, only `jit-PID.dump` in the working directory, which node
/// maps so that profilers find it: every name comes from there.
///
/// V8 writes the dump through a buffered stream: the code it logged last stays invisible to a
/// live reader until more code is logged (or node exits). On-stack replacement compiles a
/// function's loop while it runs, possibly after the target said `ready`, so that code could
/// stay unnamed for the whole recording; with `--no-use-osr` and `--always-sparkplug` every
/// function gets its code when it is called, long before the measured loop.
#[test]
fn node_jitdump_frames_are_named_whole_and_true() {
    let Some(node) = node::node("node_jitdump_frames_are_named_whole_and_true") else {
        return;
    };
    let setup = Setup::new();
    let mut cmd = Command::new(node);
    cmd.current_dir(setup.path()).args(node::args(
        &["--perf-prof", "--no-use-osr", "--always-sparkplug"],
        DEEP,
        60,
    ));
    let target = Running::start(cmd);
    let pid = target.pid();
    let dump = setup.path().join(format!("jit-{pid}.dump"));
    assert!(dump.is_file(), "node writes {}", dump.display());
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(
        maps.contains(&format!("jit-{pid}.dump")),
        "node maps its jitdump file"
    );
    let perf_map = format!("/tmp/perf-{pid}.map");
    assert!(
        std::fs::metadata(&perf_map).is_err(),
        "{perf_map} exists: names could come from it"
    );
    let (_, v) = record_and_check(
        "node --perf-prof (jitdump)",
        pid,
        RATE,
        &node::graph(DEEP),
        20_000,
    );
    assert!(
        std::fs::metadata(&perf_map).is_err(),
        "{perf_map} appeared while recording"
    );
    v.assert_whole_and_true();
}

/// Code kept in Sparkplug's baseline tier (`--no-opt --always-sparkplug`): every call enters
/// `Builtins_BaselineOutOfLinePrologue` (which pops its return address into a register and builds
/// its caller's frame) and every return leaves through `Builtins_BaselineLeaveFrame` (which drops
/// the arguments under a return address held in a register) or the interpreter's bytecode
/// handlers, whose frames are built in deferred code. Samples in those builtins must unwind
/// through them, not end at `[truncated: not-after-call]`: at least 99 in 100 stacks whole.
#[test]
fn node_baseline_builtins_unwind_whole() {
    let Some(node) = node::node("node_baseline_builtins_unwind_whole") else {
        return;
    };
    let setup = Setup::new();
    let mut cmd = Command::new(node);
    cmd.current_dir(setup.path()).args(node::args(
        &[
            "--perf-basic-prof",
            "--no-opt",
            "--always-sparkplug",
            "--no-use-osr",
        ],
        DEEP,
        60,
    ));
    let target = Running::start(cmd);
    let (recording, v) = record_and_check(
        "node --no-opt --always-sparkplug",
        target.pid(),
        RATE,
        &node::graph(DEEP),
        20_000,
    );
    assert_eq!(v.impossible_edges, 0, "impossible caller edges");
    assert_eq!(v.invented, 0, "invented frames");
    assert_eq!(v.unnamed, 0, "unnamed frames");
    assert_eq!(v.wrong_recursion, 0, "wrong recursion counts");
    assert_eq!(v.not_rooted, 0, "unmarked stacks not reaching the root");
    assert_eq!(v.not_reaching_entry, 0, "unmarked stacks not reaching main");
    assert!(
        v.truncated * 100 <= v.program_samples,
        "{} of {} stacks truncated",
        v.truncated,
        v.program_samples
    );
    // The workload does run in the builtins: leaves there, unwound to the thread's root.
    let profile = &recording.profile;
    let samples = profile.samples();
    let mut frames = Vec::new();
    let mut whole_in_builtins = 0;
    for i in 0..samples.len() {
        profile.stack_frames_root_first(samples.stacks[i], &mut frames);
        let Some(&leaf) = frames.last() else {
            continue;
        };
        let in_builtin = matches!(
            profile.frame_name(leaf),
            "Builtins_BaselineOutOfLinePrologue" | "Builtins_BaselineLeaveFrame"
        );
        let truncated = frames
            .iter()
            .any(|&f| profile.frame(f).kind == FrameKind::Truncated);
        if in_builtin && !truncated {
            whole_in_builtins += 1;
        }
    }
    println!("whole stacks with their leaf in the baseline builtins: {whole_in_builtins}");
    assert!(
        whole_in_builtins * 200 >= v.program_samples,
        "only {whole_in_builtins} whole stacks of {} end in the baseline builtins",
        v.program_samples
    );
}
