//! A program executed from an anonymous memory file (`memfd_create` + `fexecve`, as container
//! runtimes, sandboxes and self-extracting tools run programs): its code is mapped from
//! `/memfd:NAME (deleted)`, a path that names no file on disk, yet it is an ELF file with symbols
//! and CFI, read through `/proc/PID/map_files`. Its stacks must be whole and named like any
//! binary's (before, such mappings were taken for JIT code: unnamed frames, frame pointers only).

use std::sync::atomic::AtomicBool;

#[path = "common/c_program.rs"]
mod c_program;

use rootline_capture::recorder::{KernelWalkMode, RecordOptions, Target, record};

#[test]
fn a_program_run_from_a_memory_file_is_unwound_and_named_by_its_own_elf() {
    const DEPTH: usize = 50;
    let launcher = c_program::build_c("memfd_exec.c", "memfd-exec", &["-O2"]);
    // Without frame pointers: only its CFI unwinds it.
    let program = c_program::build_c("deep.c", "memfd-deep", &["-O2", "-fomit-frame-pointer"]);
    for walk in [KernelWalkMode::Auto, KernelWalkMode::Off] {
        let args = vec![
            launcher.clone().into_os_string(),
            program.clone().into_os_string(),
            DEPTH.to_string().into(),
            "1.5".into(),
            "thread".into(),
        ];
        let mut opts = RecordOptions::new(Target::Command(args));
        opts.kernel_walk = walk;
        let recording = record(&opts, &AtomicBool::new(false), None).expect("records");
        let p = &recording.profile;
        let mut frames = Vec::new();
        let (mut in_spin, mut whole, mut truncated, mut other) = (0u64, 0u64, 0u64, Vec::new());
        for i in 0..p.samples().len() {
            p.stack_frames_root_first(p.samples().stacks[i], &mut frames);
            let names: Vec<&str> = frames.iter().map(|&f| p.frame_name(f)).collect();
            if !names.iter().any(|n| *n == "spin" || n.contains("memfd:")) {
                continue;
            }
            if names.last() != Some(&"spin") {
                // A frame named by its memfd path (no symbol) in a sample elsewhere: wrong.
                if names.iter().any(|n| n.contains("memfd:")) && other.len() < 5 {
                    other.push(names.join(";"));
                }
                continue;
            }
            in_spin += 1;
            let rooted = names.first().is_some_and(|n| n.ends_with("clone3"));
            let recursion = names.iter().filter(|&&n| n == "recurse").count();
            let at = names.iter().position(|&n| n == "worker");
            if rooted && recursion == DEPTH && at.is_some_and(|w| names.len() == w + DEPTH + 2) {
                whole += 1;
            } else if names[0].starts_with("[truncated") && recursion < DEPTH {
                // With live reads (no in-kernel walk), a thread's first samples past the copy,
                // before a watch proves its outer frames.
                truncated += 1;
            } else if other.len() < 5 {
                other.push(names.join(";"));
            }
        }
        println!(
            "{walk:?}: {whole} of {in_spin} samples in spin whole, {truncated} cut; others: \
             {other:?}; truncated: {:?}",
            recording.stats.truncated
        );
        assert!(in_spin >= 500, "only {in_spin} samples in spin");
        assert!(other.is_empty(), "{walk:?}: {other:?}");
        assert!(
            truncated * 100 <= in_spin,
            "{walk:?}: {truncated} truncated"
        );
        if walk == KernelWalkMode::Auto && recording.stats.kernel_walk.is_some() {
            assert_eq!(whole, in_spin, "walked in the kernel: every stack whole");
        }
    }
}
