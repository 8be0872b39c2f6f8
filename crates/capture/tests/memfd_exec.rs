//! A program executed from an anonymous memory file (`memfd_create` + `fexecve`, as container
//! runtimes, sandboxes and self-extracting tools run programs): its code is mapped from
//! `/memfd:NAME (deleted)`, a path that names no file on disk, yet it is an ELF file with symbols
//! and CFI, read through `/proc/PID/map_files`. Its stacks must be whole and named like any
//! binary's (before, such mappings were taken for JIT code: unnamed frames, frame pointers only).

use std::sync::atomic::AtomicBool;

#[path = "common/c_program.rs"]
mod c_program;
#[path = "common/deep_thread.rs"]
mod deep_thread;

use deep_thread::{DeepStack, deep_command, deep_stack, each_stack};

use rootline_capture::recorder::{KernelWalkMode, RecordOptions, Target, record};

#[test]
fn a_program_run_from_a_memory_file_is_unwound_and_named_by_its_own_elf() {
    const DEPTH: usize = 50;
    let launcher = c_program::build_c("memfd_exec.c", "memfd-exec", &["-O2"]);
    // Without frame pointers: only its CFI unwinds it.
    let program = c_program::build_c("deep.c", "memfd-deep", &["-O2", "-fomit-frame-pointer"]);
    for walk in [KernelWalkMode::Auto, KernelWalkMode::Off] {
        let args = deep_command(Some(&launcher), &program, DEPTH, "1.5");
        let mut opts = RecordOptions::new(Target::Command(args));
        opts.kernel_walk = walk;
        let recording = record(&opts, &AtomicBool::new(false), None).expect("records");
        let (mut in_spin, mut whole, mut truncated, mut other) = (0u64, 0u64, 0u64, Vec::new());
        each_stack(&recording.profile, |names| {
            let verdict = deep_stack(names, DEPTH);
            // A thread's first samples past the copy may end `[truncated: live-unproven]`: with
            // live reads until a watch proves their outer frames, and with the in-kernel walk
            // on a machine reading the program for the first time (its rules not kept yet, 2 of
            // 1,481 in a fresh CI run). A frame named by its memory file's path (no symbol),
            // anywhere, is wrong: before, every sample's was.
            let unnamed = names.iter().any(|n| n.contains("memfd:"));
            in_spin += u64::from(verdict.is_some());
            match verdict {
                Some(DeepStack::Whole) if !unnamed => whole += 1,
                Some(DeepStack::Truncated) if !unnamed => truncated += 1,
                Some(_) => other.push(names.join(";")),
                None if unnamed => other.push(names.join(";")),
                None => {}
            }
        });
        other.truncate(5);
        println!(
            "{walk:?}: {whole} of {in_spin} samples in spin whole, {truncated} cut; others: \
             {other:?}; truncated: {:?}",
            recording.stats.truncated
        );
        assert!(in_spin >= 300, "only {in_spin} samples in spin");
        assert!(other.is_empty(), "{walk:?}: {other:?}");
        assert!(truncated <= 20, "{walk:?}: {truncated} truncated");
    }
}
