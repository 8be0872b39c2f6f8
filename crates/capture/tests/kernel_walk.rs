//! Ground truth for the in-kernel stack walk on stacks that are rebuilt between samples: the main
//! thread and a second thread of `tests/c/rebuild.c` each recurse 1,000 (and 10,000) levels with
//! 1 KiB of locals per frame (a megabyte, and ten, of stack, far past the 16 KiB a sample
//! copies), spin about a millisecond in the leaf, return all the way and recurse again. Live
//! reads after the sample cannot be proven here (the stack is gone and rebuilt hundreds of times
//! a second); frames read by the kernel at the sample's instant need no proof. At 10,000 levels
//! the walk passes the interrupt's frame limit and goes on as task work before the thread
//! returns to user space.
//!
//! Attached by PID, built with frame pointers and without (CFI only): of the samples in the
//! leaf, at least 99% must run from the thread's root through exactly DEPTH + 1 `recurse`
//! frames, none may be wrong (every other one ends in an explicit `[truncated: …]`), and frames
//! read live appear only in samples whose walk stopped early.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

#[path = "common/alternate.rs"]
mod alternate;
#[path = "common/c_program.rs"]
mod c_program;

use rootline_capture::recorder::{KernelWalkMode, RecordOptions, Recording, Target, record};

fn build(name: &str, flags: &[&str]) -> PathBuf {
    c_program::build_c("rebuild.c", name, flags)
}

/// One workload at a time: a 10,000-deep walk sends ~300 KiB a sample, and with the others'
/// spinning threads on the same CPUs the reader would measure the machine's load, not the walk.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Records with `opts`; None (said) where BPF cannot load outside CI.
fn record_or_skip(opts: &RecordOptions) -> Option<Recording> {
    match record(opts, &AtomicBool::new(false), None) {
        Ok(r) => Some(r),
        Err(e) if std::env::var_os("CI").is_none() && e.to_string().contains("BPF") => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("record failed: {e}"),
    }
}

/// Starts `command`, lets it run 300 ms, then records it by PID with the walk on for `seconds`
/// (None where BPF cannot load outside CI).
fn record_by_pid(command: &mut Command, seconds: u64) -> Option<Recording> {
    let child = Killed(command.spawn().expect("starts the workload"));
    std::thread::sleep(Duration::from_millis(300));
    let mut opts = RecordOptions::new(Target::Pids(vec![child.0.id()]));
    opts.kernel_walk = KernelWalkMode::On;
    opts.duration = Some(Duration::from_secs(seconds));
    record_or_skip(&opts)
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[derive(Debug, Default)]
struct Verdict {
    in_leaf: u64,
    complete: [u64; 2],
    truncated: u64,
    wrong: u64,
    live_marked: u64,
    examples: Vec<String>,
}

fn check(recording: &Recording, depth: usize) -> Verdict {
    let profile = &recording.profile;
    let mut v = Verdict::default();
    let mut frames = Vec::new();
    let samples = profile.samples();
    for i in 0..samples.len() {
        profile.stack_frames_root_first(samples.stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| profile.frame_name(f)).collect();
        if names.last() != Some(&"spin") {
            continue;
        }
        v.in_leaf += 1;
        if names[0].starts_with("[truncated") {
            v.truncated += 1;
            if v.examples.len() < 4 {
                v.examples.push(format!(
                    "{} at {} frames from the leaf, recurse×{}",
                    names[0],
                    names.len() - 1,
                    names.iter().filter(|&&n| n == "recurse").count()
                ));
            }
            continue;
        }
        let main = matches!(
            &names[..names.len().min(3)],
            ["_start", start, "__libc_start_call_main"] if start.starts_with("__libc_start_main")
        );
        // `main` runs `cycle`; in a forked child, `children` does (which `main` may tail-call).
        let from_main = match names.get(3..6) {
            Some(["main", "children", "cycle"]) => 6,
            Some(["main" | "children", "cycle", _]) => 5,
            _ => 0,
        };
        let main = main && from_main > 0;
        let second = matches!(
            &names[..names.len().min(4)],
            [clone, "start_thread", "second", "cycle"] if clone.ends_with("clone3")
        );
        let body = if main { from_main } else { 4 };
        let recursion = &names[body.min(names.len())..names.len() - 1];
        if (main || second)
            && recursion.len() == depth + 1
            && recursion.iter().all(|&n| n == "recurse")
        {
            v.complete[usize::from(second)] += 1;
            if frames.iter().any(|&f| profile.frame(f).from_live_memory) {
                v.live_marked += 1;
            }
        } else {
            v.wrong += 1;
            if v.examples.len() < 4 {
                let head: Vec<_> = names.iter().take(6).collect();
                v.examples.push(format!(
                    "wrong: {head:?} … recurse×{} ({} frames)",
                    names.iter().filter(|&&n| n == "recurse").count(),
                    names.len()
                ));
            }
        }
    }
    v
}

/// Records the workload at `depth` and checks its stacks; returns how samples used the walk
/// (None where BPF cannot load outside CI).
fn run(
    name: &str,
    flags: &[&str],
    depth: usize,
) -> Option<rootline_capture::recorder::KernelWalkUse> {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let binary = build(name, flags);
    // The main thread's stack must hold the recursion (a KiB a level).
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg("ulimit -s unlimited && exec \"$0\" \"$@\"")
        .arg(&binary)
        .args([depth.to_string(), "30".into()]);
    let recording = record_by_pid(&mut command, 3)?;
    let v = check(&recording, depth);
    let kw = recording.stats.kernel_walk.clone().unwrap_or_default();
    println!(
        "{name}: samples={} in_leaf={} complete(main, second)={:?} truncated={} wrong={} live={} \
         kernel_walk: unwound={} fell_back={} no_walk={} stops={:?} lost_chunks={} continued={} \
         shared={} truncated_by={:?}",
        recording.stats.samples,
        v.in_leaf,
        v.complete,
        v.truncated,
        v.wrong,
        v.live_marked,
        kw.unwound,
        kw.fell_back,
        kw.no_walk,
        kw.walk.stops,
        kw.walk.lost_chunks,
        kw.walk.join.continued,
        kw.walk.join.shared,
        recording.stats.truncated,
    );
    for e in &v.examples {
        println!("  {e}");
    }
    assert!(
        v.in_leaf >= 200,
        "{name}: only {} samples in the leaf",
        v.in_leaf
    );
    assert_eq!(
        v.wrong, 0,
        "{name}: stacks neither whole nor marked truncated"
    );
    let complete = v.complete[0] + v.complete[1];
    assert!(
        complete * 100 >= v.in_leaf * 99,
        "{name}: {complete} of {} stacks whole",
        v.in_leaf
    );
    assert!(
        v.complete.iter().all(|&n| n * 4 >= v.in_leaf),
        "{name}: each thread has at least a quarter of the whole stacks: {:?}",
        v.complete
    );
    assert!(
        v.live_marked <= kw.fell_back,
        "{name}: only a sample unwound the usual way (its walk stopped early) reads frames live"
    );
    // The program's own time in the sampled threads, by the kernel's BPF run-time statistics:
    // it ran at every walk, and took time.
    let (time, runs) = kw.walk.run_time.expect("the walk's run time is measured");
    println!("{name}: the program ran {runs} times, {time:?}");
    assert!(
        runs >= kw.walk.walks && time > std::time::Duration::ZERO,
        "{name}: {runs} runs in {time:?} for {} walks",
        kw.walk.walks
    );
    Some(kw)
}

/// The same program recursing 4 levels: each thread's whole stack fits in the 16 KiB a sample
/// copies, so once a thread has one whole sample the program stops walking its samples (they
/// are unwound from their copy), and the stacks stay whole.
#[test]
fn shallow_stacks_are_not_walked_once_their_threads_root_is_known() {
    for (name, flags) in [
        ("rebuild-shallow-fp", &["-O2", "-fno-omit-frame-pointer"]),
        ("rebuild-shallow-nofp", &["-O2", "-fomit-frame-pointer"]),
    ] {
        let Some(kw) = run(name, flags, 4) else {
            return;
        };
        let sampled = kw.unwound + kw.fell_back + kw.no_walk + kw.in_copy;
        assert!(
            kw.in_copy * 10 >= sampled * 9,
            "{name}: {} of {sampled} samples not walked",
            kw.in_copy
        );
    }
}

#[test]
fn rebuilt_deep_stacks_with_frame_pointers_are_whole() {
    run("rebuild-fp", &["-O2", "-fno-omit-frame-pointer"], 1000);
}

#[test]
fn rebuilt_deep_stacks_with_cfi_only_are_whole() {
    run("rebuild-nofp", &["-O2", "-fomit-frame-pointer"], 1000);
}

#[test]
fn ten_thousand_deep_rebuilt_stacks_with_frame_pointers_are_whole() {
    run(
        "rebuild-fp-10k",
        &["-O2", "-fno-omit-frame-pointer"],
        10_000,
    );
}

#[test]
fn ten_thousand_deep_rebuilt_stacks_with_cfi_only_are_whole() {
    run("rebuild-nofp-10k", &["-O2", "-fomit-frame-pointer"], 10_000);
}

/// Reused outer frames must never be wrong: `alternate.c` swaps its outermost frames (outer_a /
/// outer_b) every 150 ms under a 10,000-deep recursion whose frames are identical in both phases,
/// so the part of one sample's walk a later sample may reuse (`recorder::walk_memo`) is the same
/// but for the outermost words. Every stack in a leaf must pair spin_a with outer_a and spin_b
/// with outer_b, nearly all whole, and the outer frames must have been reused within phases.
#[test]
fn reused_outer_frames_follow_the_outer_stack_when_it_changes() {
    const DEPTH: usize = 10_000;
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let binary = c_program::build_c(
        "alternate.c",
        "alternate-kw",
        &["-O2", "-fomit-frame-pointer"],
    );
    let mut opts = RecordOptions::new(Target::Command(vec![
        "sh".into(),
        "-c".into(),
        "ulimit -s unlimited && exec \"$0\" \"$@\"".into(),
        binary.into(),
        DEPTH.to_string().into(),
        "4".into(),
        "150".into(),
    ]));
    opts.kernel_walk = KernelWalkMode::On;
    // As the agent records: the host's BPF statistics are left as they are.
    opts.kernel_walk_run_time = false;
    let Some(recording) = record_or_skip(&opts) else {
        return;
    };
    let alternate::Alternation {
        whole,
        wrong,
        truncated,
    } = alternate::judge(&recording.profile, DEPTH);
    let kw = recording.stats.kernel_walk.clone().unwrap_or_default();
    println!(
        "alternate: whole={whole} wrong={} truncated={truncated} outer_reused={} frames_reused={} \
         continued={} stops={:?} no_walk={} truncated_by={:?}",
        wrong.len(),
        kw.outer_reused,
        kw.frames_reused,
        kw.walk.join.continued,
        kw.walk.stops,
        kw.no_walk,
        recording.stats.truncated
    );
    assert!(
        wrong.is_empty(),
        "{} wrong stacks: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(4)]
    );
    assert!(whole >= 500, "only {whole} whole stacks in a leaf");
    // Launched, the program's first samples come while its binary is still being read: a walk
    // there sends at most 1 MiB of its 10 MiB stack, and those stacks end `live-unproven` (how
    // many depends on how long the reading takes: 8–500 of ~4,200 from quiet machines to
    // loaded fresh-clone runs). The others must stay whole.
    let pending = kw
        .walk
        .stops
        .get(&rootline_capture::kernel_walk::WalkStop::Pending)
        .copied()
        .unwrap_or(0);
    assert!(
        truncated.saturating_sub(pending) * 100 <= whole * 5,
        "{truncated} truncated ({pending} walks ended at a binary being read) against {whole} whole"
    );
    assert!(
        kw.outer_reused > 0,
        "outer frames were reused within phases"
    );
    assert_eq!(
        kw.walk.run_time, None,
        "run time measured though not asked for"
    );
}

/// On a kernel without BPF task work (before 6.18) the program's call of it is linked as a call
/// that fails: the program must still load, its walks then ending at the frame limit.
#[test]
fn the_program_loads_where_walks_cannot_go_on_as_task_work() {
    use rootline_capture::kernel_walk::{KernelWalk, KernelWalkOptions};
    let opts = KernelWalkOptions {
        continue_in_task: false,
        rows: 1024,
        ring_bytes: 1 << 16,
        ..KernelWalkOptions::default()
    };
    match KernelWalk::load(opts) {
        Ok(_) => {}
        Err(e) if std::env::var_os("CI").is_none() => eprintln!("skipped: {e}"),
        Err(e) => panic!("the program without task work does not load: {e}"),
    }
}

/// `tests/c/fresh_page.c`: the leaf lowers the stack pointer onto a page the thread never
/// touched and spins there, so the kernel copies nothing with those samples (its copy stops at
/// the first page it cannot read). The walk sends the words it reads from where the copy will
/// end, not from where it would end whole: the stacks are whole, not `stack-not-copied`.
#[test]
fn stacks_are_whole_when_the_kernel_copies_nothing() {
    fresh_page_stacks_are_whole(None, "hold", 0);
}

/// The same with a leaf whose frame is found through rbx, a rule the walk does not evaluate: it
/// stops at the leaf having read nothing, and sends what the copy would have held instead.
#[test]
fn stacks_are_whole_when_the_kernel_copies_nothing_and_the_walk_cannot_start() {
    fresh_page_stacks_are_whole(Some("rbx"), "hold_rbx", 0);
}

/// Such a leaf with its copy whole, under 40 frames of 1 KiB (past the copy): the walk reads
/// nothing, so it sends the stack as for a binary still being read, and the frames past the copy
/// need no live read (which the stack, rebuilt every millisecond, could not prove).
#[test]
fn stacks_are_whole_when_the_walk_cannot_take_its_first_step() {
    fresh_page_stacks_are_whole(Some("deep"), "hold_in_place", 41);
}

/// Of the samples `selected` picks: how many, how many `is_whole` accepts (both given the frame
/// names, root first), and the others' stacks with their counts.
fn whole_among(
    profile: &rootline_profile::Profile,
    selected: impl Fn(&[&str]) -> bool,
    is_whole: impl Fn(&[&str]) -> bool,
) -> (u64, u64, std::collections::BTreeMap<String, u64>) {
    let (mut chosen, mut whole) = (0u64, 0u64);
    let mut frames = Vec::new();
    let mut other = std::collections::BTreeMap::new();
    let samples = profile.samples();
    for i in 0..samples.len() {
        profile.stack_frames_root_first(samples.stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| profile.frame_name(f)).collect();
        if !selected(&names) {
            continue;
        }
        chosen += 1;
        if is_whole(&names) {
            whole += 1;
        } else {
            *other.entry(names.join(";")).or_insert(0u64) += 1;
        }
    }
    (chosen, whole, other)
}

/// [`whole_among`] the samples whose leaf is `leaf`.
fn whole_in_leaf(
    profile: &rootline_profile::Profile,
    leaf: &str,
    is_whole: impl Fn(&[&str]) -> bool,
) -> (u64, u64, std::collections::BTreeMap<String, u64>) {
    whole_among(profile, |names| names.last() == Some(&leaf), is_whole)
}

/// Records `tests/c/fresh_page.c` in `mode`; at least 99% of the samples in `leaf` must run from
/// the thread's root through `deep` frames of `deep`.
fn fresh_page_stacks_are_whole(mode: Option<&str>, leaf: &str, deep: usize) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let binary = c_program::build_c("fresh_page.c", "fresh-page", &["-O2"]);
    let mut command = Command::new(&binary);
    command.arg("30").args(mode);
    let Some(recording) = record_by_pid(&mut command, 2) else {
        return;
    };
    let (in_leaf, whole, other) = whole_in_leaf(&recording.profile, leaf, |names| {
        let middle = names.len().saturating_sub(5);
        matches!(
            &names[..names.len().min(4)],
            [clone, "start_thread", "second", "cycle"] if clone.ends_with("clone3")
        ) && middle == deep
            && names[4..4 + middle].iter().all(|n| n.starts_with("deep"))
    });
    println!(
        "fresh page ({leaf}): {whole} of {in_leaf} samples in the leaf whole; others: {other:?}; \
         truncated: {:?}",
        recording.stats.truncated
    );
    assert!(in_leaf >= 200, "only {in_leaf} samples in the leaf");
    assert!(
        whole * 100 >= in_leaf * 99,
        "{whole} of {in_leaf} whole; others: {other:?}"
    );
}

/// `tests/c/early_stack.c`, launched: from the start of `main` its thread spins 64 KiB below
/// where its stack pointer was, on pages never touched, so no sample's copy holds anything. Its
/// first samples come before the recorder has read its `exec`: the recorder readied the walk for
/// the process it launched, which sends their stacks as it does for a binary still being read,
/// and they are unwound once the process is read (before, 1–8 of ~200 a run ended
/// `stack-not-copied`).
#[test]
fn a_launched_commands_first_samples_are_whole() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let binary = c_program::build_c("early_stack.c", "early-stack", &["-O2"]);
    let mut opts = RecordOptions::new(Target::Command(vec![binary.into(), "400".into()]));
    opts.kernel_walk = KernelWalkMode::On;
    let Some(recording) = record_or_skip(&opts) else {
        return;
    };
    let (in_hold, whole, other) = whole_in_leaf(&recording.profile, "hold", |names| {
        names.first() == Some(&"_start") && names.ends_with(&["main", "hold"])
    });
    println!(
        "early stack: {whole} of {in_hold} samples in hold whole; others: {other:?}; truncated: \
         {:?}",
        recording.stats.truncated
    );
    assert!(in_hold >= 100, "only {in_hold} samples in hold");
    assert_eq!(whole, in_hold, "others: {other:?}");
}

/// `tests/c/exec_chain.c`: a launched command that spins in `before_exec` for 15 ms and execs
/// itself, 20 times, then spins in `after_exec`. The samples an image takes in its last moments
/// before its exec are read in the same round as the exec's records, which empty the process's
/// address space before its samples are unwound: they must still be unwound in the image they
/// ran in (before, each such sample ended `[truncated: unmapped-address]` at its leaf).
#[test]
fn samples_just_before_an_exec_are_unwound_in_the_image_they_ran_in() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let binary = c_program::build_c("exec_chain.c", "exec-chain", &["-O2"]);
    let args = vec![binary.into(), "15".into(), "20".into()];
    let mut opts = RecordOptions::new(Target::Command(args));
    opts.kernel_walk = KernelWalkMode::On;
    opts.frequency_hz = 4000;
    let Some(recording) = record_or_skip(&opts) else {
        return;
    };
    let (before, whole_before, other) = whole_through(&recording.profile, "before_exec");
    let (after, whole_after, _) = whole_through(&recording.profile, "after_exec");
    let unmapped = recording
        .stats
        .truncated
        .get(&rootline_capture::unwind::TruncateReason::UnmappedAddress)
        .copied()
        .unwrap_or(0);
    println!(
        "exec chain: {whole_before} of {before} samples in before_exec whole, {whole_after} of \
         {after} in after_exec; others: {other:?}; truncated: {:?}",
        recording.stats.truncated
    );
    assert!(before >= 500 && after >= 30, "{before} and {after} samples");
    assert_eq!(unmapped, 0, "others: {other:?}");
    assert!(whole_before * 100 >= before * 99, "others: {other:?}");
    assert!(whole_after * 100 >= after * 99);
}

/// [`whole_among`] the samples with a frame named `function` (for `before_exec`, also every cut
/// stack: one cut at its leaf in the first image's code shows no name): whole when uncut and
/// run from `_start` through `main` into it.
fn whole_through(
    profile: &rootline_profile::Profile,
    function: &str,
) -> (u64, u64, std::collections::BTreeMap<String, u64>) {
    let cut = |names: &[&str]| names.iter().any(|n| n.starts_with("[truncated"));
    whole_among(
        profile,
        |names| names.contains(&function) || (cut(names) && function == "before_exec"),
        |names| {
            let at = names.iter().position(|&n| n == function);
            let through_main = at.is_some_and(|i| i > 0 && names[i - 1] == "main");
            names.first() == Some(&"_start") && through_main && !cut(names)
        },
    )
}

/// `tests/c/rebuild.c` forking: the recorded process forks a child after child, each rebuilding
/// a 300-deep recursion (300 KiB of stack, far past the copy) for 30 ms. A child's first samples
/// come before its fork record has been read: the program has no entry of its own for it, and
/// walks it by its parent's (the child has not exec'd: its mappings are its parent's). Before,
/// it sent those stacks as dumps, which the program refuses when the ring is a quarter full or
/// its CPU's allowance is spent (a lagging reader on a loaded machine).
#[test]
fn new_processes_are_whole_from_their_first_samples() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let depth = 300;
    let binary = build("rebuild-fork", &["-O2", "-fomit-frame-pointer"]);
    let mut command = Command::new(&binary);
    command.args([depth.to_string(), "30".into(), "30".into()]);
    let Some(recording) = record_by_pid(&mut command, 3) else {
        return;
    };
    let v = check(&recording, depth);
    let kw = recording.stats.kernel_walk.clone().unwrap_or_default();
    println!(
        "new processes: {:?} of {} samples in the leaf whole; wrong {}, truncated {} ({:?}); \
         no walk {}; stops: {:?}; {:?}",
        v.complete,
        v.in_leaf,
        v.wrong,
        v.truncated,
        recording.stats.truncated,
        kw.no_walk,
        kw.walk.stops,
        v.examples
    );
    assert!(v.in_leaf >= 200, "only {} samples in the leaf", v.in_leaf);
    assert_eq!(v.wrong, 0, "stacks neither whole nor marked truncated");
    // The rows of the workload's binaries are ready before sampling starts (the recorder waits
    // up to 5 s for them), and every child is walked by its parent's entry: no walk waits.
    let pending = kw
        .walk
        .stops
        .get(&rootline_capture::kernel_walk::WalkStop::Pending);
    assert_eq!(pending, None, "{:?}", kw.walk.stops);
    assert!(
        v.complete[0] * 100 >= v.in_leaf * 99,
        "{} of {} whole ({} samples had no walk)",
        v.complete[0],
        v.in_leaf,
        kw.no_walk
    );
}
