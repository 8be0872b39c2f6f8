//! A Rust binary recorded while it runs known functions: this test's own executable, run again as
//! the workload. rustc links binaries whose executable segment starts mid-page (the kernel maps it
//! from an offset inside the read-only segment before it), which once shifted every code and CFI
//! lookup by a page and truncated nearly every stack with `not-after-call`. Every stack must be
//! whole (thread entry to leaf, no truncation) and the known caller edge must hold.

use std::hint::black_box;
use std::sync::atomic::AtomicBool;

use rootline_capture::recorder::{RecordOptions, Target, record};

#[inline(never)]
fn spin_inner(x: u64) -> u64 {
    let mut h = x;
    for i in 0..2_000u64 {
        h = black_box(h.rotate_left(5) ^ i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    h
}

#[inline(never)]
fn spin_outer(rounds: u64) -> u64 {
    let mut h = 0;
    let mut i = 0;
    while i < rounds {
        h = spin_inner(h ^ i);
        i += 1;
    }
    h
}

/// CPU time of the calling thread (`/proc/thread-self/schedstat`, first field), in ns.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .expect("schedstat is readable")
}

/// Not a check: the workload that `own_rust_binary_is_unwound_whole` records, run in a child
/// process.
#[test]
#[ignore = "workload of own_rust_binary_is_unwound_whole"]
fn spin_workload() {
    // 1.5 s of this thread's CPU time (however busy the machine), then a fixed sample count.
    let mut h = 0;
    while thread_cpu_ns() < 1_500_000_000 {
        h = spin_outer(black_box(100));
    }
    println!("{h}");
}

#[test]
fn own_rust_binary_is_unwound_whole() {
    let exe = std::env::current_exe().expect("test binary path");
    let mut opts = RecordOptions::new(Target::Command(vec![
        exe.into(),
        "--exact".into(),
        "spin_workload".into(),
        "--ignored".into(),
        "--test-threads=1".into(),
    ]));
    opts.frequency_hz = 2_000;
    let stop = AtomicBool::new(false);
    let recording = record(&opts, &stop, None).expect("recording works");
    assert!(recording.exit_status.is_some_and(|s| s.success()));
    let profile = &recording.profile;
    let samples = profile.samples();
    let (mut total, mut in_spin, mut not_rooted, mut wrong_caller) = (0u64, 0u64, 0u64, 0u64);
    let mut examples = Vec::new();
    let mut frames = Vec::new();
    for i in 0..samples.len() {
        total += 1;
        profile.stack_frames_root_first(samples.stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| profile.frame_name(f)).collect();
        let entry = names.first().copied().unwrap_or("");
        if !matches!(entry, "_start" | "_dl_start_user" | "[kernel: exec]")
            && !entry.ends_with("clone3")
        {
            not_rooted += 1;
            if examples.len() < 5 {
                examples.push(names.join(";"));
            }
        }
        if let Some(k) = names.iter().position(|n| n.ends_with("spin_inner")) {
            in_spin += 1;
            if k == 0 || !names[k - 1].ends_with("spin_outer") {
                wrong_caller += 1;
                if examples.len() < 10 {
                    examples.push(names.join(";"));
                }
            }
        }
    }
    println!(
        "samples={total} in_spin_inner={in_spin} not_rooted={not_rooted} wrong_caller={wrong_caller} truncated={:?}",
        recording.stats.truncated
    );
    for e in &examples {
        println!("  {e}");
    }
    assert!(total >= 1_000, "only {total} samples");
    assert!(in_spin * 2 >= total, "the workload ran elsewhere");
    assert_eq!(recording.stats.truncated_total(), 0, "truncated stacks");
    assert_eq!(not_rooted, 0, "stacks not reaching the thread entry");
    assert_eq!(wrong_caller, 0, "spin_inner without spin_outer as caller");
}
