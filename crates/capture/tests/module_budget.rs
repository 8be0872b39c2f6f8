//! The memory budget for loaded binaries: a binary that does not fit is not loaded, and stacks
//! that reach it end there with an explicit `[truncated: module-memory-limit]`, never with a guess.
//! The recording counts its modules in a budget the test owns, so the test reads that budget's
//! live memory.

use std::fs::File;
use std::sync::atomic::AtomicBool;

#[path = "common/callgraph.rs"]
mod callgraph;

use callgraph::build_callgraph;
use rootline_capture::recorder::{RecordOptions, Target, record};
use rootline_image::{CodeModule, ModuleBudget, PAGE_CACHE_BYTES};

#[test]
fn binaries_past_the_budget_end_stacks_explicitly() {
    let binary = build_callgraph(
        "module_budget_callgraph",
        &["-O0", "-fno-omit-frame-pointer"],
    );
    let modules = ModuleBudget::new();
    let own = CodeModule::open("prog", File::open(&binary).unwrap(), &modules, None)
        .expect("the test program parses")
        .heap_bytes();
    let libc = CodeModule::open(
        "libc",
        File::open("/lib/x86_64-linux-gnu/libc.so.6").unwrap(),
        &modules,
        None,
    )
    .expect("libc parses")
    .heap_bytes();
    assert_eq!(modules.live_bytes(), 0, "modules are freed when dropped");
    // Room for the program (mapped first, at the lowest address), the in-memory vDSO and the
    // code page cache, not for libc.
    let slack = 64 * 1024;
    assert!(libc > 2 * slack, "libc needs {libc} bytes");
    let budget = own + slack + PAGE_CACHE_BYTES;

    let mut opts = RecordOptions::new(Target::Command(vec![binary.into(), "2".into(), "0".into()]));
    opts.module_budget = Some(budget);
    opts.modules = modules.clone();
    let recording = record(&opts, &AtomicBool::new(false), None).expect("records");
    let profile = &recording.profile;
    let samples = profile.samples();
    let (mut leaf, mut ended_at_budget) = (0, 0);
    let mut frames = Vec::new();
    for i in 0..samples.len() {
        profile.stack_frames_root_first(samples.stacks[i], &mut frames);
        let names: Vec<&str> = frames
            .iter()
            .rev()
            .map(|&f| profile.frame_name(f))
            .collect();
        if names.first() != Some(&"leaf") {
            continue;
        }
        leaf += 1;
        // leaf, a, work, main, then main's caller in libc (a checked return address), then the
        // explicit end: libc's unwind tables were not loaded.
        assert_eq!(&names[..4], ["leaf", "a", "work", "main"], "{names:?}");
        assert_eq!(names.len(), 6, "{names:?}");
        assert_eq!(names[5], "[truncated: module-memory-limit]", "{names:?}");
        ended_at_budget += 1;
    }
    println!(
        "budget {budget} bytes (program {own}, libc {libc}): {leaf} leaf samples, \
         {ended_at_budget} ended at the budget"
    );
    assert!(leaf > 200, "{leaf} leaf samples");
    assert_eq!(ended_at_budget, leaf);
    drop(recording);
    assert_eq!(
        modules.live_bytes(),
        0,
        "the recording's modules are freed with it"
    );
}
