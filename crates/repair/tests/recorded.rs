//! No false positives on real whole stacks: a native program recursing up to 400 frames deep,
//! recorded with rootline's own sampler (stacks deeper than perf's 127-frame cap, all reaching the
//! thread's root), comes out of repair unchanged — with the cap detected and with `--cap 127`.

#![cfg(target_os = "linux")]

use std::path::Path;
use std::process::Command;
use std::sync::atomic::AtomicBool;

use rootline_capture::recorder::{RecordError, RecordOptions, Target, record};
use rootline_repair::{RepairOptions, SampleOutcome, repair};

#[test]
fn recorded_whole_stacks_deeper_than_the_cap_are_left_unchanged() {
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("repair-deep");
    let status = Command::new("cc")
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/deep.c"))
        .status()
        .expect("cc runs (apt-get install gcc)");
    assert!(status.success(), "cc failed");

    let mut opts = RecordOptions::new(Target::Command(vec![exe.into(), "1.5".into()]));
    opts.frequency_hz = 2000;
    let recording = match record(&opts, &AtomicBool::new(false), None) {
        Ok(r) => r,
        Err(RecordError::Permission(e)) if std::env::var_os("CI").is_none() => {
            eprintln!("skipping: perf events not permitted here: {e}");
            return;
        }
        Err(e) => panic!("recording failed: {e}"),
    };
    let whole = recording.profile;
    let depths: Vec<u32> = whole
        .samples()
        .stacks
        .iter()
        .map(|&s| whole.stack_depth(s))
        .collect();
    let deeper = depths.iter().filter(|&&d| d > 127).count();
    eprintln!(
        "{} samples, {deeper} deeper than 127, {} exactly 127, max depth {:?}",
        depths.len(),
        depths.iter().filter(|&&d| d == 127).count(),
        depths.iter().max()
    );
    assert!(
        deeper > 100,
        "the workload should run deeper than 127 frames"
    );

    for cap in [None, Some(127)] {
        let mut p = whole.clone();
        let report = repair(
            &mut p,
            &RepairOptions {
                cap,
                ..RepairOptions::default()
            },
        )
        .unwrap();
        assert!(
            report.outcomes.iter().all(|&o| o == SampleOutcome::Whole),
            "cap {cap:?}: {:?}",
            report.totals()
        );
        assert_eq!(p.samples(), whole.samples(), "cap {cap:?}");
        assert_eq!(p.stacks().len(), whole.stacks().len(), "cap {cap:?}");
    }
}
