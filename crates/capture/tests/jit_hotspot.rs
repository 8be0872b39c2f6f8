//! HotSpot attached by pid with no manual step: the recorder asks the JVM for its perf map over
//! HotSpot's attach protocol (no `jcmd` run before or during the recording), with default JVM
//! flags and with `-XX:+PreserveFramePointer`. Checked against the target's known call graph
//! (`tests/jit/Rec.java`) and against HotSpot's own stack walk (`jcmd PID Thread.print`, run by
//! the test only after recording, for comparison); methods first compiled while the recording
//! runs are named too. A JVM deoptimizing compiled frames on the stack over and over
//! (`tests/jit/Deopt.java`) keeps its stacks whole. A JVM with attach off gets a note; a process
//! that is not a JVM is never signalled.

mod jit;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use jit::{
    Graph, Running, Setup, check, is_native_root, record_pid, require, sources, start_in_namespace,
    visible_beside_private_tmp, which,
};
use rootline_capture::recorder::{RecordOptions, Target, record};
use rootline_profile::Profile;

const DEEP: usize = 20;
/// Seconds after `ready` at which the late thread first calls its methods.
const LATE: f64 = 3.0;

/// The worker threads' methods, compiled before recording starts (`step`, a leaf C2 inlines,
/// is left out of both graphs).
fn main_short(name: &str) -> Option<&'static str> {
    Some(match name {
        "Rec.worker(int)" => "worker",
        "Rec.down(int, int)" => "down",
        "Rec.spin(int)" => "spin",
        _ => return None,
    })
}

/// The late thread's methods, first run (and compiled) while the recording runs.
fn late_short(name: &str) -> Option<&'static str> {
    Some(match name {
        "Rec.lateWorker(int)" => "lateWorker",
        "Rec.lateDown(int, int)" => "lateDown",
        "Rec.lateSpin(int)" => "lateSpin",
        _ => return None,
    })
}

struct Jdk {
    java: std::path::PathBuf,
    jcmd: std::path::PathBuf,
}

/// The JDK, and `Rec` compiled into `setup`'s directory.
fn jdk(test: &str, setup: &Setup) -> Option<Jdk> {
    let tools = which("java").zip(which("javac")).zip(which("jcmd"));
    let ((java, javac), jcmd) = require(
        test,
        "a JDK (apt-get install openjdk-17-jdk-headless)",
        tools,
    )?;
    let status = Command::new(javac)
        .arg("-d")
        .arg(setup.path())
        .arg(sources().join("Rec.java"))
        .status()
        .expect("run javac");
    assert!(status.success(), "javac failed");
    Some(Jdk { java, jcmd })
}

fn start(jdk: &Jdk, setup: &Setup, flags: &[&str]) -> Running {
    let mut cmd = Command::new(&jdk.java);
    cmd.args(flags).arg("-cp").arg(setup.path()).args([
        "Rec",
        &DEEP.to_string(),
        "2",
        &LATE.to_string(),
        "120",
    ]);
    let started = std::time::SystemTime::now();
    let target = Running::start(cmd);
    let pid = target.pid();
    // Nobody asked the JVM anything yet: no perf map, no attach listener. (A file older than
    // the JVM is a dead process's that had the same pid, such as a node test's perf map: gone.)
    for file in [format!("perf-{pid}.map"), format!(".java_pid{pid}")] {
        let path = Path::new("/tmp").join(&file);
        if let Ok(made) = std::fs::metadata(&path).and_then(|m| m.modified())
            && made < started
        {
            let _ = std::fs::remove_file(&path);
        }
        assert!(!path.exists(), "/tmp/{file} exists before recording");
    }
    target
}

/// How many `Rec.down` frames HotSpot's own stack walk shows below worker-0 while it is in
/// `Rec.spin`.
fn hotspot_recursion(jcmd: &Path, pid: u32) -> usize {
    for _ in 0..50 {
        let out = Command::new(jcmd)
            .arg(pid.to_string())
            .arg("Thread.print")
            .output()
            .expect("run jcmd");
        assert!(out.status.success(), "jcmd Thread.print failed: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let Some(thread) = text.split("\n\n").find(|t| t.starts_with("\"worker-0\"")) else {
            continue;
        };
        if thread.contains("at Rec.spin(") {
            return thread.matches("at Rec.down(").count();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("jcmd Thread.print never showed worker-0 in Rec.spin");
}

/// Frames between a sample's first and last program frame, and how many of them are program
/// frames (the others: unnamed JIT code, interpreted frames, anything foreign).
fn frames_named(profile: &Profile, short: &dyn Fn(&str) -> Option<&'static str>) -> (u64, u64) {
    let (mut all, mut named) = (0, 0);
    let mut frames = Vec::new();
    let samples = profile.samples();
    for i in 0..samples.len() {
        profile.stack_frames_root_first(samples.stacks[i], &mut frames);
        let program: Vec<bool> = frames
            .iter()
            .map(|&f| short(profile.frame_name(f)).is_some())
            .collect();
        if let (Some(first), Some(last)) = (
            program.iter().position(|&s| s),
            program.iter().rposition(|&s| s),
        ) {
            all += (last - first + 1) as u64;
            named += program[first..=last].iter().filter(|&&s| s).count() as u64;
        }
    }
    (all, named)
}

/// Samples cut right above a compiled method of `short`'s that called an interpreted one: the
/// interpreter frame's caller found at `rbp+16`, below the compiled caller's real stack pointer
/// (see `NoCfiRule::InterpreterFrame`), made that caller's frame read at the wrong place.
fn cut_above_interpreted(profile: &Profile, short: &dyn Fn(&str) -> Option<&'static str>) -> u64 {
    let mut cut = 0;
    let mut frames = Vec::new();
    let samples = profile.samples();
    for i in 0..samples.len() {
        profile.stack_frames_root_first(samples.stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| profile.frame_name(f)).collect();
        if let [first, compiled, interpreted, ..] = names.as_slice()
            && first.starts_with("[truncated")
            && short(compiled).is_some()
            && *interpreted == "[interpreted Java]"
        {
            cut += 1;
        }
    }
    cut
}

/// Checks the samples `graph` picks and prints the counts; returns the share of them whole and
/// true and the share of frames in their program part that are named program frames.
fn measure(
    test: &str,
    what: &str,
    profile: &Profile,
    graph: &Graph<'_>,
) -> (jit::Verdict, f64, f64) {
    let v = check(profile, graph);
    v.print(&format!("{test} ({what})"));
    let (all, named) = frames_named(profile, graph.short);
    let bad = v.unnamed + v.invented + v.not_reaching_entry + v.not_rooted + v.truncated;
    let whole = v.program_samples - bad.min(v.program_samples);
    let whole_share = whole as f64 / v.program_samples.max(1) as f64;
    let named_share = named as f64 / all.max(1) as f64;
    println!(
        "{test} ({what}): {whole} of {} samples whole and true ({:.2}%), {named} of {all} \
         frames named ({:.2}%), {} exact recursion counts",
        v.program_samples,
        100.0 * whole_share,
        100.0 * named_share,
        v.exact_recursion,
    );
    (v, whole_share, named_share)
}

fn whole_and_true_by_pid(test: &str, flags: &[&str]) {
    let setup = Setup::new();
    let Some(jdk) = jdk(test, &setup) else {
        return;
    };
    let target = start(&jdk, &setup, flags);
    let pid = target.pid();
    let recording = record_pid(pid, 4_000, 10.0, 16);
    println!(
        "{test}: unnamed JIT frames {:?}, notes {:?}",
        recording.stats.jit_unnamed, recording.stats.jit_notes
    );
    assert!(
        recording.stats.jit_notes.is_empty(),
        "{:?}",
        recording.stats.jit_notes
    );
    let depth = hotspot_recursion(&jdk.jcmd, pid);
    println!("{test}: HotSpot's stack walk shows {depth} Rec.down frames below worker-0");
    assert_eq!(depth, DEEP + 1, "the program's own recursion");
    let main = Graph {
        short: &main_short,
        entries: &["worker"],
        edges: &[("worker", "down"), ("down", "down"), ("down", "spin")],
        recursion: Some(("down", "spin", vec![("worker", depth)])),
        is_root: &is_native_root,
    };
    let (v, whole, named) = measure(test, "compiled before recording", &recording.profile, &main);
    assert!(v.program_samples >= 5_000, "{} samples", v.program_samples);
    assert_eq!(v.impossible_edges, 0, "impossible caller edges");
    assert_eq!(v.wrong_recursion, 0, "recursion counts unlike HotSpot's");
    assert!(v.exact_recursion > 1_000, "{} exact", v.exact_recursion);
    assert!(whole >= 0.99, "whole and true < 99%");
    assert!(named >= 0.99, "frames named < 99%");
    let late = Graph {
        short: &late_short,
        entries: &["lateWorker"],
        edges: &[
            ("lateWorker", "lateDown"),
            ("lateDown", "lateDown"),
            ("lateDown", "lateSpin"),
        ],
        recursion: Some(("lateDown", "lateSpin", vec![("lateWorker", depth)])),
        is_root: &is_native_root,
    };
    // Their first samples run interpreted (whole, but the interpreted frames are unnamed).
    let (v, whole, named) = measure(test, "compiled while recording", &recording.profile, &late);
    assert!(v.program_samples >= 500, "{} samples", v.program_samples);
    assert!(whole >= 0.9, "whole and true < 90%");
    assert!(named >= 0.99, "frames named < 99%");
    // Interpreted frames entered from compiled code (through the adapter that lowers the stack
    // below the caller's frame) are unwound like any other.
    let cut = cut_above_interpreted(&recording.profile, &late_short);
    println!("{test} (compiled while recording): {cut} stacks cut above an interpreted frame");
    assert_eq!(cut, 0, "stacks cut above an interpreted frame");
    assert_eq!(v.impossible_edges, 0, "impossible caller edges");
    assert_eq!(v.wrong_recursion, 0, "recursion counts unlike HotSpot's");
}

#[test]
fn jvm_by_pid_default_flags() {
    whole_and_true_by_pid("jvm_by_pid_default_flags", &[]);
}

#[test]
fn jvm_by_pid_preserve_frame_pointer() {
    whole_and_true_by_pid(
        "jvm_by_pid_preserve_frame_pointer",
        &["-XX:+PreserveFramePointer"],
    );
}

#[test]
fn jvm_with_attach_off_gets_a_note() {
    let test = "jvm_with_attach_off_gets_a_note";
    let setup = Setup::new();
    let Some(jdk) = jdk(test, &setup) else {
        return;
    };
    let target = start(&jdk, &setup, &["-XX:+DisableAttachMechanism"]);
    let recording = record_pid(target.pid(), 1_000, 2.0, 16);
    println!("{test}: notes {:?}", recording.stats.jit_notes);
    assert_eq!(recording.stats.jit_notes.len(), 1);
    // Seen in its options: not signalled (that would print a thread dump on its output).
    assert!(
        recording.stats.jit_notes[0]
            .contains("was started with -XX:+DisableAttachMechanism, so it cannot be asked"),
        "{:?}",
        recording.stats.jit_notes
    );
    assert!(recording.stats.samples > 0);
}

#[test]
fn a_process_that_is_not_a_jvm_is_not_signalled() {
    let _setup = Setup::new();
    // SIGQUIT would end `sleep` (its default action).
    let mut sleep = Command::new("sleep").arg("30").spawn().expect("run sleep");
    let recording = record_pid(sleep.id(), 1_000, 1.0, 16);
    assert!(recording.stats.jit_notes.is_empty());
    assert!(
        sleep.try_wait().expect("wait").is_none(),
        "sleep was signalled"
    );
    let _ = sleep.kill();
    let _ = sleep.wait();
}

#[test]
fn launched_jvm_is_asked_once_up() {
    let test = "launched_jvm_is_asked_once_up";
    let setup = Setup::new();
    let Some(jdk) = jdk(test, &setup) else {
        return;
    };
    let argv: Vec<std::ffi::OsString> = vec![
        jdk.java.clone().into(),
        "-cp".into(),
        setup.path().into(),
        "Rec".into(),
        DEEP.to_string().into(),
        "2".into(),
        "1".into(),
        "8".into(),
    ];
    let mut opts = RecordOptions::new(Target::Command(argv));
    opts.frequency_hz = 2_000;
    opts.duration = Some(Duration::from_secs(30));
    let recording =
        record(&opts, &AtomicBool::new(false), None).expect("recording a launched JVM works");
    println!(
        "{test}: {} samples; unnamed JIT frames {:?}, notes {:?}",
        recording.stats.samples, recording.stats.jit_unnamed, recording.stats.jit_notes
    );
    assert!(
        recording.stats.jit_notes.is_empty(),
        "{:?}",
        recording.stats.jit_notes
    );
    // The code is compiled while recording (from the JVM's start): the warm-up's interpreted
    // and on-stack-replaced frames count against wholeness, so only naming is checked.
    for (what, short) in [
        (
            "main methods",
            &main_short as &dyn Fn(&str) -> Option<&'static str>,
        ),
        ("late methods", &late_short),
    ] {
        let (all, named) = frames_named(&recording.profile, short);
        println!(
            "{test} ({what}): {named} of {all} frames between program frames named ({:.2}%)",
            100.0 * named as f64 / all.max(1) as f64
        );
        assert!(named >= 10_000, "{what}: {named} named frames");
        assert!(named * 100 >= all * 99, "{what}: frames named < 99%");
    }
    // The JVM leaves its perf map behind; the pid will be reused.
    let pids: std::collections::BTreeSet<u32> =
        recording.profile.threads().iter().map(|t| t.pid).collect();
    for pid in pids {
        let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    }
}

/// `tests/jit/Deopt.java`'s methods.
fn deopt_short(name: &str) -> Option<&'static str> {
    Some(match name {
        "void Deopt.work(int, long)" | "Deopt.work(int, long)" => "work",
        "int Deopt.down(int, int)" | "Deopt.down(int, int)" => "down",
        _ => return None,
    })
}

/// HotSpot deoptimizing compiled frames while they are on the stack (`tests/jit/Deopt.java`: a
/// call site that `down`'s compiled code inlined is retargeted every 20 ms): the `down` frames
/// on the worker's stack return into their methods' deoptimization handlers, run on in methods
/// made not entrant (their entries overwritten by a jump), and are unpacked into interpreter
/// frames under compiled callers; the main thread calls native methods (through native
/// wrappers) all the while. Stacks stay whole: no caller skipped or invented, at most 1% cut
/// (the VM's own transitions: safepoint and adapter stubs); before these layouts were modelled,
/// 8% were.
#[test]
fn jvm_deoptimizing_frames_on_the_stack_keeps_them_whole() {
    let test = "jvm_deoptimizing_frames_on_the_stack_keeps_them_whole";
    let setup = Setup::new();
    let Some(jdk) = jdk(test, &setup) else {
        return;
    };
    let javac = which("javac").expect("javac, found for Rec");
    let status = Command::new(javac)
        .arg("-d")
        .arg(setup.path())
        .arg(sources().join("Deopt.java"))
        .status()
        .expect("run javac");
    assert!(status.success(), "javac failed");
    let mut cmd = Command::new(&jdk.java);
    cmd.arg("-cp")
        .arg(setup.path())
        .args(["Deopt", &DEEP.to_string(), "120"]);
    let target = Running::start(cmd);
    let recording = record_pid(target.pid(), 4_000, 6.0, 16);
    let graph = Graph {
        short: &deopt_short,
        entries: &["work"],
        edges: &[("work", "down"), ("down", "down")],
        // Frames deoptimized and not yet compiled again run interpreted (unnamed): the count
        // of named `down` frames varies.
        recursion: None,
        is_root: &is_native_root,
    };
    let v = check(&recording.profile, &graph);
    v.print(test);
    let samples = recording.profile.samples();
    let mut frames = Vec::new();
    let cut = (0..samples.len())
        .filter(|&i| {
            recording
                .profile
                .stack_frames_root_first(samples.stacks[i], &mut frames);
            frames
                .iter()
                .any(|&f| recording.profile.frame_name(f).starts_with("[truncated"))
        })
        .count();
    println!(
        "{test}: {cut} of {} samples cut (all threads)",
        samples.len()
    );
    assert!(v.program_samples >= 5_000, "{} samples", v.program_samples);
    assert_eq!(v.impossible_edges, 0, "impossible caller edges");
    assert_eq!(v.invented, 0, "invented frames");
    assert_eq!(
        v.not_rooted, 0,
        "unmarked stacks not reaching the thread root"
    );
    assert!(
        v.truncated * 100 <= v.program_samples,
        "{} of {} worker stacks cut",
        v.truncated,
        v.program_samples
    );
    assert!(
        cut * 100 <= samples.len(),
        "{cut} of {} stacks cut",
        samples.len()
    );
}

/// A JVM as pid 1 of its own PID and mount namespace with a private `/tmp` (as in a container):
/// the trigger file, the attach socket and the perf map are all `…1` in a `/tmp` the host sees
/// only through `/proc/PID/root`.
#[test]
fn jvm_in_a_pid_and_mount_namespace() {
    let test = "jvm_in_a_pid_and_mount_namespace";
    let Some(unshare) = require(test, "unshare (util-linux)", which("unshare")) else {
        return;
    };
    let setup = Setup::new();
    // Outside /tmp, which the target's private /tmp hides.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    if !visible_beside_private_tmp(test, dir.path()) {
        return;
    }
    let Some(jdk) = jdk(test, &setup) else {
        return;
    };
    std::fs::copy(setup.path().join("Rec.class"), dir.path().join("Rec.class")).unwrap();
    let args: Vec<std::ffi::OsString> = ["-cp", ".", "Rec", &DEEP.to_string(), "2", "60", "120"]
        .iter()
        .map(Into::into)
        .collect();
    let started = std::time::SystemTime::now();
    let (_target, pid) = start_in_namespace(&unshare, dir.path(), &jdk.java, &args, &[]);
    let recording = record_pid(pid, 4_000, 5.0, 16);
    assert!(
        recording.stats.jit_notes.is_empty(),
        "{:?}",
        recording.stats.jit_notes
    );
    assert!(
        std::fs::metadata(format!("/proc/{pid}/root/tmp/perf-1.map")).is_ok(),
        "the JVM wrote its perf map into its own /tmp"
    );
    // None in the host's /tmp (one older than the target is a dead process's under the same pid).
    let host_map = std::fs::metadata(format!("/tmp/perf-{pid}.map")).and_then(|m| m.modified());
    assert!(!host_map.is_ok_and(|made| made >= started));
    let main = Graph {
        short: &main_short,
        entries: &["worker"],
        edges: &[("worker", "down"), ("down", "down"), ("down", "spin")],
        recursion: Some(("down", "spin", vec![("worker", DEEP + 1)])),
        is_root: &is_native_root,
    };
    let (v, whole, named) = measure(test, "in a namespace", &recording.profile, &main);
    assert!(v.program_samples >= 2_000, "{} samples", v.program_samples);
    assert_eq!(v.impossible_edges, 0, "impossible caller edges");
    assert_eq!(v.wrong_recursion, 0, "wrong recursion counts");
    assert!(whole >= 0.99, "whole and true < 99%");
    assert!(named >= 0.99, "frames named < 99%");
}
