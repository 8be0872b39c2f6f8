//! Unwinding through signal frames: a C program whose SIGPROF handler spins, recorded while the
//! handler interrupts its main loop. A sample in the handler returns into the kernel's signal
//! trampoline (glibc's `__restore_rt`, an FDE marked as a signal frame), whose CFI restores every
//! register of the interrupted function from the signal context; the stack must run on through it
//! to `main` and `_start` with nothing truncated, and the interrupted function must be one the
//! loop really runs.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::AtomicBool;

use rootline_capture::recorder::{RecordOptions, Target, record};

#[test]
fn handler_stacks_run_through_the_signal_frame() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/signal_handler.c");
    let binary = Path::new(env!("CARGO_TARGET_TMPDIR")).join("signal_handler");
    let status = Command::new("cc")
        .args(["-O2", "-g", "-fomit-frame-pointer", "-o"])
        .arg(&binary)
        .arg(&src)
        .status()
        .expect("cc runs");
    assert!(status.success());
    let mut opts = RecordOptions::new(Target::Command(vec![binary.into(), "3".into()]));
    opts.frequency_hz = 4_000;
    let stop = AtomicBool::new(false);
    let recording = record(&opts, &stop, None).expect("recording works");
    assert!(recording.exit_status.is_some_and(|s| s.success()));
    let profile = &recording.profile;
    let samples = profile.samples();
    let (mut total, mut in_handler, mut bad) = (0u64, 0u64, 0u64);
    let mut examples = Vec::new();
    let mut frames = Vec::new();
    for i in 0..samples.len() {
        total += 1;
        profile.stack_frames_root_first(samples.stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| profile.frame_name(f)).collect();
        if names.iter().any(|n| n.starts_with("[truncated")) && examples.len() < 8 {
            examples.push(names.join(";"));
        }
        let Some(h) = names.iter().position(|&n| n == "in_handler") else {
            continue;
        };
        in_handler += 1;
        // _start … main → work [→ leaf, or clock_gettime → vdso] → __restore_rt → handler →
        // in_handler
        let interrupted = h.checked_sub(3).map(|k| names[k]);
        let known_interrupted = interrupted.is_some_and(|n| {
            matches!(n, "work" | "leaf" | "clock_gettime" | "__clock_gettime")
                || n.starts_with("[vdso]")
        });
        // (The timer may still fire once main has returned: the interrupted code is then the
        // exit path, `_start` … `exit` → … → `__restore_rt`.)
        let in_work = known_interrupted && names[..h - 2].windows(2).any(|w| w == ["main", "work"]);
        let exiting = h >= 3 && names[..h - 2].contains(&"exit");
        let ok = h >= 5
            && names[h - 1] == "handler"
            && names[h - 2] == "__restore_rt"
            && (in_work || exiting)
            && names.first() == Some(&"_start")
            && !names.iter().any(|n| n.starts_with("[truncated"));
        if !ok {
            bad += 1;
            if examples.len() < 5 {
                examples.push(names.join(";"));
            }
        }
    }
    println!(
        "samples={total} in_handler={in_handler} not_whole={bad} truncated={:?} full_register_unwinds={}",
        recording.stats.truncated, recording.stats.full_register_unwinds
    );
    for e in &examples {
        println!("  {e}");
    }
    assert!(
        in_handler >= 100,
        "only {in_handler} samples in the handler"
    );
    assert_eq!(bad, 0, "handler stacks not whole through the signal frame");
    assert_eq!(recording.stats.truncated_total(), 0, "truncated stacks");
}
