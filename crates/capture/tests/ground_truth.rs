//! Ground truth: record small C programs with a known call graph, built four ways (frame pointers
//! + CFI, CFI only, frame pointers only, and an -O2 sibling-call mix), and check every stack.
//!
//! For each sample: the stack must run from the thread entry (`_start` or `clone3`) through
//! `main`/`worker`; no edge between the program's functions may be impossible; no frame may be
//! invented (a program frame outside the known set, or a foreign frame between program frames);
//! no stack may end in `[truncated: …]`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;

use rootline_capture::recorder::{RecordOptions, Target, record};
use rootline_profile::Profile;

/// The program's functions (`atof`, `atoi` and `atol` are glibc's inline wrappers of `strtod`
/// and `strtol`, inlined into `main` with -O2: a sample in a lazy binding of `strtol` at start-up
/// truly runs `main` → `atoi` → the trampoline).
const PROGRAM_FUNCTIONS: [&str; 10] = [
    "main", "work", "worker", "watcher", "a", "b", "leaf", "atof", "atoi", "atol",
];

fn c_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c")
}

/// Compiles the two translation units with their own flags and links them.
fn build(name: &str, main_flags: &[&str], b_flags: &[&str]) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let cc = |src: &str, flags: &[&str], obj: &Path| {
        let status = Command::new("cc")
            .args(flags)
            .arg("-g")
            .arg("-c")
            .arg(c_dir().join(src))
            .arg("-o")
            .arg(obj)
            .status()
            .expect("cc runs");
        assert!(status.success(), "cc failed for {src} {flags:?}");
    };
    let m = out.with_extension("main.o");
    let b = out.with_extension("b.o");
    cc("callgraph_main.c", main_flags, &m);
    cc("callgraph_b.c", b_flags, &b);
    // Bound lazily (the default): library calls go through ld.so's lazy-binding trampoline,
    // whose CFI bases the frame on rbx, on their first call.
    let status = Command::new("cc")
        .arg(&m)
        .arg(&b)
        .arg("-lpthread")
        .arg("-o")
        .arg(&out)
        .status()
        .expect("cc links");
    assert!(status.success());
    if main_flags.contains(&"-fno-asynchronous-unwind-tables") {
        // Without unwind tables, -g still writes the CFI to .debug_frame: remove it, so that the
        // program's code truly has no CFI (its other debug info stays).
        let status = Command::new("objcopy")
            .arg("--remove-section=.debug_frame")
            .arg(&out)
            .status()
            .expect("objcopy runs");
        assert!(status.success(), "objcopy failed");
    }
    out
}

/// Compiles the lazy-binding workload (one translation unit).
fn build_lazy(name: &str, flags: &[&str]) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let status = Command::new("cc")
        .args(flags)
        .arg("-g")
        .arg(c_dir().join("callgraph_lazy.c"))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("cc runs");
    assert!(status.success(), "cc failed for callgraph_lazy.c {flags:?}");
    out
}

#[derive(Debug, Default)]
struct Verdict {
    samples: u64,
    impossible_edges: u64,
    invented_frames: u64,
    not_reaching_root: u64,
    truncated: u64,
    not_copied: u64,
    lazy_binding: u64,
    startup: u64,
    examples: Vec<String>,
}

fn check(profile: &Profile, allow_tail_edge: bool) -> Verdict {
    let mut allowed: HashSet<(&str, &str)> = [
        ("main", "work"),
        ("main", "atof"),
        ("main", "atoi"),
        ("main", "atol"),
        ("worker", "work"),
        ("work", "a"),
        ("work", "b"),
        ("a", "leaf"),
        ("b", "leaf_tail"),
    ]
    .into_iter()
    .collect();
    if allow_tail_edge {
        allowed.insert(("work", "leaf_tail"));
    }
    let program: HashSet<&str> = PROGRAM_FUNCTIONS
        .iter()
        .copied()
        .chain(["leaf_tail"])
        .collect();
    let mut v = Verdict::default();
    let mut frames = Vec::new();
    let samples = profile.samples();
    for i in 0..samples.len() {
        v.samples += 1;
        profile.stack_frames_root_first(samples.stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| profile.frame_name(f)).collect();
        let is_program = |f: rootline_profile::FrameId| {
            profile.frame(f).mapping.is_some_and(|m| {
                profile
                    .string(profile.mapping(m).path)
                    .contains("callgraph")
            })
        };
        let mut bad = None;
        // The kernel sometimes copies no stack at all (the page at SP not yet resident: a new
        // thread's first instruction, a stack page fault); such stacks are explicitly marked and
        // counted apart.
        if names.first() == Some(&"[truncated: stack-not-copied]") {
            v.not_copied += 1;
            continue;
        }
        // Samples in ld.so's lazy-binding trampoline are checked like all others (their frame
        // base is rbx); counted to show they occur.
        if names.iter().any(|n| n.starts_with("_dl_runtime_resolve")) {
            v.lazy_binding += 1;
        }
        if names.iter().any(|n| n.starts_with("[truncated")) {
            v.truncated += 1;
            bad = Some("truncated");
        }
        // Every stack starts at a thread entry: the program's or the loader's `_start` (the
        // loader continues at its `_dl_start_user` label), or `clone3` for other threads.
        let entry = names.first().copied().unwrap_or("");
        // `[kernel: exec]`: time in the launcher's execve, before the program's first instruction.
        if !matches!(entry, "_start" | "_dl_start_user" | "[kernel: exec]")
            && !entry.ends_with("clone3")
        {
            v.not_reaching_root += 1;
            bad.get_or_insert("not rooted");
        }
        // Program code below the entry: through `main` (main thread, after libc's start code)
        // or `worker`/`watcher` (after `start_thread`).
        let is_known = |j: usize| is_program(frames[j]) && program.contains(names[j]);
        let body = frames
            .iter()
            .enumerate()
            .skip(1)
            .position(|(j, &f)| is_program(f) && names[j] != "_start")
            .map(|p| p + 1);
        // The C runtime's own helpers (destructors at exit, constructors at start) are the
        // program's code too, but outside the known call graph.
        const CRT: [&str; 6] = [
            "__do_global_dtors_aux",
            "frame_dummy",
            "register_tm_clones",
            "deregister_tm_clones",
            "_init",
            "_fini",
        ];
        match body {
            Some(j) if CRT.contains(&names[j]) => v.startup += 1,
            None => v.startup += 1,
            Some(j) => {
                let prefix_ok = match &names[..j] {
                    ["_start", start, "__libc_start_call_main"] => {
                        start.starts_with("__libc_start_main") && names[j] == "main"
                    }
                    [clone, "start_thread"] => {
                        clone.ends_with("clone3") && matches!(names[j], "worker" | "watcher")
                    }
                    _ => false,
                };
                if !prefix_ok {
                    v.not_reaching_root += 1;
                    bad.get_or_insert("not reaching main");
                }
                // From the entry function on: program frames with known names, possible edges
                // only, then (optionally) library frames the leaf called.
                let last = (j..frames.len())
                    .take_while(|&k| is_program(frames[k]))
                    .last();
                let last = last.unwrap_or(j);
                // (A leaf may also sit in the program's PLT stub of a library call.)
                if (j..=last).any(|k| !is_known(k) && !names[k].ends_with("@plt"))
                    || frames[last + 1..].iter().any(|&f| is_program(f))
                {
                    v.invented_frames += 1;
                    bad.get_or_insert("invented frame");
                }
                let edge_ok = |k: usize| {
                    allowed.contains(&(names[k], names[k + 1]))
                        || (k + 1 == last && names[last].ends_with("@plt"))
                };
                if (j..last).any(|k| !edge_ok(k)) {
                    v.impossible_edges += 1;
                    bad.get_or_insert("impossible edge");
                }
            }
        }
        if let Some(why) = bad
            && v.examples.iter().filter(|e| e.starts_with(why)).count() < 3
        {
            // With each frame's address (and `L` for one read from live memory), to tell which
            // instruction a wrong stack was sampled at.
            let detail: Vec<String> = frames
                .iter()
                .zip(&names)
                .map(|(&f, n)| {
                    let frame = profile.frame(f);
                    let live = if frame.from_live_memory { "L" } else { "" };
                    format!("{n}@{:#x}{live}", frame.address)
                })
                .collect();
            v.examples.push(format!("{why}: {}", detail.join(";")));
        }
    }
    v
}

/// One recording at a time: they sample at 10 kHz and the machine may have only two cores.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run_build(name: &str, main_flags: &[&str], b_flags: &[&str], allow_tail_edge: bool) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let binary = build(name, main_flags, b_flags);
    let cpu_seconds = std::env::var("ROOTLINE_GT_CPU_SECONDS").unwrap_or_else(|_| "6".into());
    record_and_check(
        name,
        vec![binary.into(), cpu_seconds.into(), "1".into()],
        allow_tail_edge,
    );
}

/// Records `command` at 10 kHz, checks every stack, prints the counts and asserts the verdict.
fn record_and_check(
    name: &str,
    command: Vec<std::ffi::OsString>,
    allow_tail_edge: bool,
) -> (Verdict, u64) {
    let mut opts = RecordOptions::new(Target::Command(command));
    opts.frequency_hz = 10_000;
    // The default stack copy (16 KiB), as `rootline record` uses.
    opts.stack_bytes = 16 * 1024;
    let stop = AtomicBool::new(false);
    let recording = record(&opts, &stop, None).expect("recording works");
    assert!(
        recording.exit_status.is_some_and(|s| s.success()),
        "workload exits cleanly"
    );
    let v = check(&recording.profile, allow_tail_edge);
    println!(
        "{name}: samples={} lost={} startup_or_exit={} impossible_edges={} invented_frames={} not_reaching_root={} truncated={} stack_not_copied={} in_lazy_binding={} full_register_unwinds={}",
        v.samples,
        recording.stats.lost,
        v.startup,
        v.impossible_edges,
        v.invented_frames,
        v.not_reaching_root,
        v.truncated,
        v.not_copied,
        v.lazy_binding,
        recording.stats.full_register_unwinds
    );
    for e in &v.examples {
        println!("  {e}");
    }
    let min: u64 = std::env::var("ROOTLINE_GT_MIN_SAMPLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50_000);
    assert!(v.samples >= min, "{name}: only {} samples", v.samples);
    assert_eq!(v.impossible_edges, 0, "{name}: impossible caller edges");
    assert_eq!(v.invented_frames, 0, "{name}: invented frames");
    assert_eq!(
        v.not_reaching_root, 0,
        "{name}: stacks not reaching the thread entry"
    );
    assert_eq!(v.truncated, 0, "{name}: truncated stacks");
    assert!(
        v.not_copied * 10_000 <= v.samples,
        "{name}: {} samples without a stack copy",
        v.not_copied
    );
    let full = recording.stats.full_register_unwinds;
    (v, full)
}

#[test]
fn o0_frame_pointers_and_cfi() {
    let f = ["-O0", "-fno-omit-frame-pointer"];
    run_build("callgraph-o0-fp-cfi", &f, &f, false);
}

#[test]
fn o2_cfi_only() {
    let f = ["-O2", "-fomit-frame-pointer"];
    run_build("callgraph-o2-cfi", &f, &f, true);
}

#[test]
fn frame_pointers_without_cfi() {
    let f = [
        "-O0",
        "-fno-omit-frame-pointer",
        "-fno-asynchronous-unwind-tables",
    ];
    run_build("callgraph-fp-nocfi", &f, &f, false);
}

#[test]
fn o2_sibling_call_mix() {
    run_build(
        "callgraph-o2-sibling-mix",
        &["-O2", "-fno-optimize-sibling-calls"],
        &["-O2"],
        true,
    );
}

#[test]
fn lazy_binding_trampoline() {
    // Every library call resolves again in ld.so (LD_BIND_NOT), so a large share of samples land
    // in `_dl_runtime_resolve_*` or below it, where the caller is found only through rbx. The
    // workload inherits the variable from this test, run again in a child process that has it.
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if std::env::var_os("LD_BIND_NOT").is_none() {
        let status = Command::new(std::env::current_exe().expect("test binary path"))
            .args(["--exact", "lazy_binding_trampoline", "--nocapture"])
            .env("LD_BIND_NOT", "1")
            .status()
            .expect("the test binary runs");
        assert!(
            status.success(),
            "lazy_binding_trampoline failed in its child process"
        );
        return;
    }
    let name = "callgraph-lazy-o2";
    let binary = build_lazy(name, &["-O2", "-fomit-frame-pointer"]);
    let cpu_seconds = std::env::var("ROOTLINE_GT_CPU_SECONDS").unwrap_or_else(|_| "6".into());
    let (v, full) = record_and_check(name, vec![binary.into(), cpu_seconds.into()], false);
    assert!(
        v.lazy_binding * 4 >= v.samples,
        "{name}: only {} of {} samples in the trampoline: the workload does not exercise it",
        v.lazy_binding,
        v.samples
    );
    assert!(
        full >= v.lazy_binding / 2,
        "{name}: {full} full-register unwinds for {} trampoline samples",
        v.lazy_binding
    );
}
