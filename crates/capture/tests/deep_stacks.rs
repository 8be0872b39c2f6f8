//! Ground truth for whole deep stacks: a C program recurses 1,000 and 10,000 levels with 1 KiB of
//! locals per frame (10 MiB of stack at the deepest), then spins in a leaf. Far more stack than
//! a sample copies, so the outer frames come from the live process's memory.
//!
//! Built with frame pointers (and no CFI) and without frame pointers (CFI only), recursing on the
//! main thread and on a second thread. Of the samples taken in the leaf, at least 99% must hold
//! every frame from the leaf to the thread entry with the exact recursion count; every other one
//! must end in an explicit `[truncated: …]` frame. A stack that is neither is a failure.
//!
//! These recordings run with the in-kernel stack walk off: they prove the live-read path, which
//! stays the fallback where the walk cannot load or stops early (`tests/kernel_walk.rs` covers
//! the walk, on stacks that are rebuilt between samples).

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

#[path = "common/alternate.rs"]
mod alternate;
#[path = "common/c_program.rs"]
mod c_program;

use alternate::Alternation;

use rootline_capture::recorder::{
    DEFAULT_LIVE_STACK_BUDGET, KernelWalkMode, RecordOptions, Target, record,
};
use rootline_profile::Profile;

fn build(name: &str, flags: &[&str]) -> PathBuf {
    c_program::build_c("deep.c", name, flags)
}

#[derive(Debug, Default)]
struct Verdict {
    /// Samples whose leaf is in `spin` (the recursion at full depth).
    in_leaf: u64,
    complete: u64,
    truncated: u64,
    /// Neither complete nor truncated: a wrong stack.
    wrong: u64,
    /// Complete samples whose outermost frames are marked as read from live memory.
    live_marked: u64,
    examples: Vec<String>,
}

fn check(profile: &Profile, depth: usize, on_main: bool) -> Verdict {
    let mut v = Verdict::default();
    let mut frames = Vec::new();
    let samples = profile.samples();
    for i in 0..samples.len() {
        profile.stack_frames_root_first(samples.stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| profile.frame_name(f)).collect();
        let Some(spin) = names.iter().position(|&n| n == "spin") else {
            continue;
        };
        v.in_leaf += 1;
        if names[0].starts_with("[truncated") {
            v.truncated += 1;
            if v.examples.len() < 4 {
                v.examples.push(format!("truncated: {}", names[0]));
            }
            continue;
        }
        let prefix_ok = if on_main {
            matches!(
                &names[..spin.min(4)],
                ["_start", start, "__libc_start_call_main", "main"]
                    if start.starts_with("__libc_start_main")
            )
        } else {
            matches!(&names[..spin.min(2)], [clone, "start_thread"] if clone.ends_with("clone3"))
        };
        let body = if on_main { 4 } else { 2 };
        let ok = prefix_ok
            && spin == body + 1 + depth
            && names[body] == "worker"
            && names[body + 1..spin].iter().all(|&n| n == "recurse");
        if ok {
            v.complete += 1;
            let root_live = profile.frame(frames[body]).from_live_memory;
            let leaf_live = profile.frame(frames[spin]).from_live_memory;
            assert!(
                !leaf_live,
                "the leaf frame comes from the sample's own copy"
            );
            if root_live {
                v.live_marked += 1;
            }
        } else {
            v.wrong += 1;
            if v.examples.len() < 4 {
                let recursion = names.iter().filter(|&&n| n == "recurse").count();
                let head: Vec<_> = names.iter().take(body + 2).collect();
                v.examples.push(format!(
                    "wrong: {head:?} … recurse×{recursion} … (spin at {spin})"
                ));
            }
        }
    }
    v
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(name: &str, flags: &[&str], mode: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let binary = build(name, flags);
    for depth in [1_000usize, 10_000] {
        // Long enough that the samples queued before the thread's stack is first watched (its
        // first deep sample arms the watch; earlier ones end `live-unproven`) stay well under 1%.
        let seconds = 5;
        // Started by the test and recorded by PID once it is at full depth; killed afterwards,
        // so every sample is unwound while the program is still running.
        let mut child = Command::new(&binary)
            .args([&depth.to_string(), "60", mode])
            .spawn()
            .expect("program starts");
        std::thread::sleep(Duration::from_millis(300));
        let mut opts = RecordOptions::new(Target::Pids(vec![child.id()]));
        opts.kernel_walk = KernelWalkMode::Off;
        opts.live_stack_budget = DEFAULT_LIVE_STACK_BUDGET;
        opts.frequency_hz = 400;
        opts.duration = Some(Duration::from_secs(seconds));
        let stop = AtomicBool::new(false);
        let recording = record(&opts, &stop, None);
        let _ = child.kill();
        let _ = child.wait();
        let recording = recording.expect("recording works");
        let v = check(&recording.profile, depth, mode == "main");
        // The native file keeps every frame: the same verdict after a write and read.
        let file = rootline_profile::write_rlp(Vec::new(), &recording.profile).expect("writes");
        let read = rootline_profile::read_rlp(&file[..]).expect("reads");
        let again = check(&read.profile, depth, mode == "main");
        assert_eq!(
            (again.complete, again.live_marked, again.wrong),
            (v.complete, v.live_marked, v.wrong),
            "the .rlp round trip changes no stack"
        );
        println!(
            "{name} {mode} depth={depth}: samples={} in_leaf={} complete={} truncated={} wrong={} live_marked={} truncated_by_reason={:?} live={:?}",
            recording.stats.samples,
            v.in_leaf,
            v.complete,
            v.truncated,
            v.wrong,
            v.live_marked,
            recording.stats.truncated,
            recording.stats.live,
        );
        for e in &v.examples {
            println!("  {e}");
        }
        assert!(
            v.in_leaf >= 100,
            "{name} depth {depth}: only {} samples in the leaf",
            v.in_leaf
        );
        assert_eq!(
            v.wrong, 0,
            "{name} depth {depth}: stacks neither whole nor marked truncated"
        );
        assert!(
            v.complete * 100 >= v.in_leaf * 99,
            "{name} depth {depth}: {} of {} stacks complete",
            v.complete,
            v.in_leaf
        );
        assert_eq!(
            v.live_marked, v.complete,
            "{name} depth {depth}: outer frames are past the copy and must be marked live"
        );
    }
}

const FP: [&str; 3] = [
    "-O2",
    "-fno-omit-frame-pointer",
    "-fno-asynchronous-unwind-tables",
];
const NO_FP: [&str; 2] = ["-O2", "-fomit-frame-pointer"];

#[test]
fn frame_pointers_main_thread() {
    run("deep-fp", &FP, "main");
}

#[test]
fn frame_pointers_second_thread() {
    run("deep-fp", &FP, "thread");
}

#[test]
fn cfi_only_main_thread() {
    run("deep-nofp", &NO_FP, "main");
}

#[test]
fn cfi_only_second_thread() {
    run("deep-nofp", &NO_FP, "thread");
}

/// A budget too small for the stack: every stack ends in `[truncated: budget]` above an intact
/// leaf part, and none is presented as whole.
#[test]
fn an_exhausted_budget_is_an_explicit_truncation() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let binary = build("deep-nofp", &NO_FP);
    let mut child = Command::new(&binary)
        .args(["10000", "60", "thread"])
        .spawn()
        .expect("program starts");
    std::thread::sleep(Duration::from_millis(300));
    let mut opts = RecordOptions::new(Target::Pids(vec![child.id()]));
    opts.kernel_walk = KernelWalkMode::Off;
    opts.frequency_hz = 400;
    opts.duration = Some(Duration::from_secs(2));
    opts.live_stack_budget = 1 << 20;
    let stop = AtomicBool::new(false);
    let recording = record(&opts, &stop, None);
    let _ = child.kill();
    let _ = child.wait();
    let recording = recording.expect("recording works");
    let p = &recording.profile;
    let (mut in_leaf, mut budget_cut, mut unproven) = (0, 0, 0);
    let mut frames = Vec::new();
    for i in 0..p.samples().len() {
        p.stack_frames_root_first(p.samples().stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| p.frame_name(f)).collect();
        let Some(spin) = names.iter().position(|&n| n == "spin") else {
            continue;
        };
        in_leaf += 1;
        if names[0] == "[truncated: live-unproven]" {
            // Taken before the thread's stack was first watched.
            unproven += 1;
            continue;
        }
        assert_eq!(names[0], "[truncated: budget]", "stack {i} ends explicitly");
        assert!(
            names[1..spin].iter().all(|&n| n == "recurse"),
            "only real frames below the cut"
        );
        // About 1 MiB of 1 KiB frames plus the 16 KiB copy: a thousand frames or so, no more.
        assert!(
            (500..2_000).contains(&(spin - 1)),
            "{} frames kept",
            spin - 1
        );
        budget_cut += 1;
    }
    println!(
        "budget: in_leaf={in_leaf} cut={budget_cut} {:?}",
        recording.stats.truncated
    );
    assert!(in_leaf >= 50, "only {in_leaf} samples in the leaf");
    assert!(unproven * 10 <= in_leaf, "{unproven} unproven of {in_leaf}");
    assert_eq!(
        recording
            .stats
            .truncated
            .get(&rootline_capture::unwind::TruncateReason::Budget),
        Some(&budget_cut)
    );
}

/// Live reads on, many threads being created: a new thread's first samples (in `clone3`, whose
/// fresh stack page the kernel often cannot copy) must never be reported as a changed stack —
/// with nothing copied there is nothing to splice to — and every stack must reach its thread
/// entry (a sample between `clone3`'s system call and the child's first frame included).
#[test]
fn new_threads_with_live_reads_never_splice_or_report_a_changed_stack() {
    use rootline_capture::unwind::TruncateReason;
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let binary = c_program::build_c("churn.c", "churn", &["-O2", "-fno-omit-frame-pointer"]);
    let mut opts = RecordOptions::new(Target::Command(vec![binary.into(), "4".into()]));
    opts.kernel_walk = KernelWalkMode::Off;
    assert_eq!(
        opts.live_stack_budget, DEFAULT_LIVE_STACK_BUDGET,
        "on by default"
    );
    opts.frequency_hz = 10_000;
    let stop = AtomicBool::new(false);
    let recording = record(&opts, &stop, None).expect("recording works");
    let p = &recording.profile;
    let mut frames = Vec::new();
    let (mut rooted, mut not_copied, mut other) = (0u64, 0u64, Vec::new());
    for i in 0..p.samples().len() {
        p.stack_frames_root_first(p.samples().stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| p.frame_name(f)).collect();
        match names.first().copied().unwrap_or("") {
            "_start" | "_dl_start_user" | "[kernel: exec]" => rooted += 1,
            n if n.ends_with("clone3") => rooted += 1,
            "[truncated: stack-not-copied]" => {
                // Mostly a new thread's first instructions in `clone3`; rarely a leaf whose stack
                // page the kernel could not copy at the interrupt (one not yet faulted in, seen in
                // `_dl_catch_exception` once in a CI run). Either way the leaf alone, marked:
                // one physical frame, with the functions inlined at its address (a sample in
                // `_dl_start` names `elf_get_dynamic_info` inlined there).
                let physical = frames[1..]
                    .iter()
                    .filter(|&&f| p.frame(f).inline_depth == 0)
                    .count();
                assert!(
                    physical == 1,
                    "a stack without a copy is its leaf alone: {names:?}"
                );
                not_copied += 1;
            }
            _ => other.push(names.join(";")),
        }
    }
    println!(
        "churn: samples={} rooted={rooted} not_copied={not_copied} other={} truncated={:?} live={:?}",
        recording.stats.samples,
        other.len(),
        recording.stats.truncated,
        recording.stats.live
    );
    for o in other.iter().take(5) {
        println!("  {o}");
    }
    assert!(rooted >= 1_000, "only {rooted} rooted samples");
    assert_eq!(
        recording.stats.truncated.get(&TruncateReason::StackChanged),
        None,
        "no stack of a new thread is reported as changed"
    );
    // A thread sampled between `clone3`'s system call and its first frame is told parent from
    // child by the call's result in rax, so every stack reaches its root.
    assert!(
        other.is_empty(),
        "{} stacks neither rooted nor stack-not-copied",
        other.len()
    );
}

/// Live frames and cached outer frames must never be shown without proof: `alternate.c` swaps
/// its outermost frames (outer_a / outer_b) every 150 ms under a 1,000-deep recursion whose
/// inner frames are identical in both phases, so a splice check on the bytes near the copy's
/// end cannot tell the phases apart. Every whole stack must pair spin_a with outer_a and spin_b
/// with outer_b; samples that cannot be proven (queued from before a watch was armed after a
/// phase change) must be explicitly truncated; within a phase the cache must be used.
#[test]
fn outer_frames_are_proven_when_the_outer_stack_changes() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    for (name, flags) in [("alternate-fp", &FP[..]), ("alternate-nofp", &NO_FP[..])] {
        let binary = c_program::build_c("alternate.c", name, flags);
        let mut opts = RecordOptions::new(Target::Command(vec![
            binary.into(),
            "1000".into(),
            "4".into(),
            "150".into(),
        ]));
        opts.kernel_walk = KernelWalkMode::Off;
        opts.frequency_hz = 1_000;
        let stop = AtomicBool::new(false);
        let recording = record(&opts, &stop, None).expect("recording works");
        let Alternation {
            whole,
            wrong,
            truncated,
        } = alternate::judge(&recording.profile, 1000);
        let c = recording.stats.outer_cache;
        println!(
            "{name}: whole={whole} wrong={} truncated={truncated} outer_cache={c:?}",
            wrong.len()
        );
        for w in wrong.iter().take(4) {
            println!("  {w}");
        }
        assert!(wrong.is_empty(), "{name}: {} wrong stacks", wrong.len());
        assert!(
            whole >= truncated,
            "{name}: {whole} whole stacks, {truncated} truncated"
        );
        assert!(c.hits > 0, "{name}: the cache was used within phases");
        assert!(c.invalidated > 0, "{name}: phase changes invalidated it");
    }
}

/// A shallow stack longer than the copy (a 24 KiB frame over a busy loop): the frames just
/// inside the copy are re-entered all the time, but the watch sits on the long-lived frame and
/// the proof holds whatever the leaf's registers, so nearly every stack is whole; the rest (the
/// samples queued before the first watch) end explicitly.
#[test]
fn a_busy_loop_under_a_large_frame_is_whole() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let binary = c_program::build_c(
        "bigframe.c",
        "bigframe",
        &["-O2", "-fno-omit-frame-pointer", "-DKIB=24"],
    );
    let mut opts = RecordOptions::new(Target::Command(vec![binary.into(), "4".into()]));
    opts.kernel_walk = KernelWalkMode::Off;
    opts.frequency_hz = 4_000;
    let stop = AtomicBool::new(false);
    let recording = record(&opts, &stop, None).expect("recording works");
    let p = &recording.profile;
    let mut frames = Vec::new();
    let (mut in_work, mut whole, mut truncated) = (0u64, 0u64, 0u64);
    for i in 0..p.samples().len() {
        p.stack_frames_root_first(p.samples().stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| p.frame_name(f)).collect();
        if !names.contains(&"work") {
            continue;
        }
        in_work += 1;
        if names[0].starts_with("[truncated") {
            truncated += 1;
        } else if names.starts_with(&["_start"]) && names.get(3..5) == Some(&["main", "big"]) {
            whole += 1;
        }
    }
    println!(
        "bigframe: in_work={in_work} whole={whole} truncated={truncated} {:?} {:?}",
        recording.stats.truncated, recording.stats.outer_cache
    );
    assert!(in_work >= 1_000, "only {in_work} samples in work");
    assert_eq!(whole + truncated, in_work, "every stack whole or marked");
    assert!(
        truncated * 20 <= in_work,
        "{truncated} of {in_work} stacks truncated"
    );
}
