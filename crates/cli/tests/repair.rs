//! `rootline repair` end to end on files: a dotnet-trace-like profile with stacks cut at 100 frames.

use std::path::Path;
use std::process::{Command, Output};

use rootline_profile::{FrameId, FrameKind, Profile, RlpWriter, SampleType, read_rlp};

fn rootline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args(args)
        .output()
        .expect("run rootline")
}

/// `Threads;Thread (7);App!Main;App!{f}1;…;App!{f}{depth-1};leaf` cut to its 100 leaf-most
/// managed frames.
fn stack(p: &mut Profile, f: &str, depth: usize, leaf: &str) -> Vec<FrameId> {
    let mut managed: Vec<FrameId> = (0..depth)
        .map(|i| {
            let name = if i == 0 {
                "App!Main".to_string()
            } else {
                format!("App!{f}{i}")
            };
            p.intern_named_frame(&name, FrameKind::Managed)
        })
        .collect();
    managed.push(p.intern_named_frame(leaf, FrameKind::Managed));
    let keep = managed.len().saturating_sub(100);
    let mut frames = vec![
        p.intern_named_frame("Threads", FrameKind::Managed),
        p.intern_named_frame("Thread (7)", FrameKind::Managed),
    ];
    frames.extend_from_slice(&managed[keep..]);
    frames
}

fn write_input(path: &Path) {
    let mut p = Profile::new(vec![SampleType::samples()]);
    p.metadata.producer = "dotnet-trace".to_string();
    let t = p.intern_thread(7, 7);
    // Samples 3-5 run 150 deep through F…, sample 7 through G…; EventPipe keeps 100 frames, so
    // they lose `Main` and 50 more.
    for (time, depth) in [
        (1u64, 20usize),
        (2, 90),
        (3, 150),
        (4, 150),
        (5, 150),
        (6, 10),
        (7, 150),
    ] {
        // The last sample runs code (`G…`) that no other sample shows below the cut.
        let f = if time == 7 { "G" } else { "F" };
        let frames = stack(&mut p, f, depth, &format!("App!Leaf{}", time % 2));
        let s = p.intern_stack_root_first(frames).unwrap();
        p.push_sample(time * 1_000_000, t, s, &[1]).unwrap();
    }
    let mut w = RlpWriter::new(std::fs::File::create(path).unwrap()).unwrap();
    w.write_chunk(&p).unwrap();
}

fn read(path: &Path) -> Profile {
    read_rlp(std::fs::File::open(path).unwrap())
        .unwrap()
        .profile
}

#[test]
fn repair_restores_main_and_reports_per_thread() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("cut.rlp");
    let output = dir.path().join("fixed.rlp");
    write_input(&input);
    let out = rootline(&[
        "repair",
        input.to_str().unwrap(),
        "-o",
        output.to_str().unwrap(),
        "--report",
    ]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("depth cap: 100 (producer)"), "{stdout}");
    let row: Vec<&str> = stdout
        .lines()
        .find(|l| l.starts_with("7 "))
        .expect("a row for thread 7")
        .split_whitespace()
        .collect();
    // tid, samples, truncated, exact, ambiguous, unrepairable, spans before, spans merged
    assert_eq!(row[1..6], ["7", "4", "3", "0", "1"], "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("4 of 7 samples truncated"), "{stderr}");

    let fixed = read(&output);
    let names = |i: usize| -> Vec<String> {
        let mut v: Vec<String> = fixed
            .stack_frames(fixed.samples().stacks[i])
            .map(|f| fixed.frame_name(f).to_string())
            .collect();
        v.reverse();
        v
    };
    for i in 2..5 {
        let n = names(i);
        assert_eq!(n[..3], ["Threads", "Thread (7)", "App!Main"], "sample {i}");
        assert_eq!(n.len(), 2 + 151);
    }
    // The last deep sample shares nothing with any other sample: kept, marked.
    let n = names(6);
    assert_eq!(
        n[..3],
        ["Threads", "Thread (7)", "[truncated: depth cap 100]"]
    );
    assert_eq!(fixed.metadata.extra["repair.exact"], "3");
}

#[test]
fn output_format_follows_the_output_name() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("cut.rlp");
    let output = dir.path().join("fixed.folded");
    write_input(&input);
    let out = rootline(&[
        "repair",
        input.to_str().unwrap(),
        "-o",
        output.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let folded = std::fs::read_to_string(&output).unwrap();
    assert!(
        folded.lines().any(|l| l.contains("App!Main;App!F1;")),
        "{folded}"
    );
    // An unknown output extension keeps the input's format.
    let kept = dir.path().join("fixed.out");
    let out = rootline(&[
        "repair",
        input.to_str().unwrap(),
        "-o",
        kept.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(read(&kept).samples().len(), 7);
}
