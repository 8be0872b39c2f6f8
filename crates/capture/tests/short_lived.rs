//! Processes that live a few milliseconds (a build's compilers, assemblers and linkers, a
//! shell's commands): by the time their first samples are read, a process may be gone from
//! `/proc`, so its name cannot be read there. The name its `exec` gave it, which the kernel
//! reports before the samples, must name them.

use std::sync::atomic::AtomicBool;

#[path = "common/c_program.rs"]
mod c_program;

use rootline_capture::recorder::{RecordOptions, Target, record};

#[test]
fn samples_of_processes_gone_before_they_are_read_carry_their_exec_name() {
    let program = c_program::build_c("deep.c", "brief-spinner", &["-O2"]);
    // 40 processes one after another, each spinning ~15 ms on its main thread.
    let script = format!(
        "for i in $(seq 40); do {} 2 0.015 main; done",
        program.display()
    );
    let opts = RecordOptions::new(Target::Command(vec![
        "sh".into(),
        "-c".into(),
        script.into(),
    ]));
    let recording = record(&opts, &AtomicBool::new(false), None).expect("records");
    let p = &recording.profile;
    let samples = p.samples();
    let mut frames = Vec::new();
    let (mut in_spin, mut named) = (0u64, 0u64);
    let mut names = std::collections::BTreeMap::<String, u64>::new();
    for i in 0..samples.len() {
        p.stack_frames_root_first(samples.stacks[i], &mut frames);
        if frames.last().map(|&f| p.frame_name(f)) != Some("spin") {
            continue;
        }
        in_spin += 1;
        let name = p.thread_name(samples.threads[i]).unwrap_or("(none)");
        *names.entry(name.to_string()).or_default() += 1;
        named += u64::from(name == "brief-spinner");
    }
    println!("{in_spin} samples in spin; thread names: {names:?}");
    assert!(in_spin >= 200, "only {in_spin} samples in spin");
    assert_eq!(named, in_spin, "{names:?}");
}
