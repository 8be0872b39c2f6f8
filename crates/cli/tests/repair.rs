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

const GAP: &str = rootline_profile::pseudo::REPAIR_GAP;

/// Three kinds of cut samples, EventPipe-style (100 managed frames): thread 7 runs `Main;F1;…`
/// (distinct frames: an exact repair) and once `Main;G1;…` that no other sample shows below the cut
/// (unrepairable); thread 8 recurses `Main;R;R;…` (how many `R` the cut hid is a guess: two
/// ambiguous repairs).
fn write_mixed_input(path: &Path) {
    let mut p = Profile::new(vec![SampleType::samples()]);
    p.metadata.producer = "dotnet-trace".to_string();
    let t7 = p.intern_thread(7, 7);
    let t8 = p.intern_thread(7, 8);
    for (time, depth, f) in [(1u64, 90usize, "F"), (2, 150, "F"), (3, 150, "G")] {
        let frames = stack(&mut p, f, depth, "App!Leaf");
        let s = p.intern_stack_root_first(frames).unwrap();
        p.push_sample(time * 1_000_000, t7, s, &[1]).unwrap();
    }
    for (time, depth, leaf) in [
        (1u64, 60usize, "App!Leaf0"),
        (2, 150, "App!Leaf1"),
        (3, 150, "App!Leaf2"),
    ] {
        let mut frames = vec![
            p.intern_named_frame("Threads", FrameKind::Managed),
            p.intern_named_frame("Thread (8)", FrameKind::Managed),
        ];
        let main = p.intern_named_frame("App!Main", FrameKind::Managed);
        let r = p.intern_named_frame("App!R", FrameKind::Managed);
        let mut managed = vec![main];
        managed.extend(std::iter::repeat_n(r, depth - 1));
        managed.push(p.intern_named_frame(leaf, FrameKind::Managed));
        frames.extend_from_slice(&managed[managed.len().saturating_sub(100)..]);
        let s = p.intern_stack_root_first(frames).unwrap();
        p.push_sample(time * 1_000_000, t8, s, &[1]).unwrap();
    }
    let mut w = RlpWriter::new(std::fs::File::create(path).unwrap()).unwrap();
    w.write_chunk(&p).unwrap();
}

/// Per sample of `p` with the repair gap: its names root first, pseudo frames of the producer left
/// out (the gap stays).
fn gapped_stacks(p: &Profile) -> Vec<Vec<String>> {
    let s = p.samples();
    (0..s.len())
        .map(|i| {
            let mut v: Vec<String> = p
                .stack_frames(s.stacks[i])
                .map(|f| p.frame_name(f).to_string())
                .filter(|n| n == GAP || !rootline_profile::pseudo::is_pseudo_name(n))
                .collect();
            v.reverse();
            v
        })
        .filter(|v| v.iter().any(|n| n == GAP))
        .collect()
}

#[test]
fn an_ambiguous_join_shows_as_a_gap_frame_in_every_output_format() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("cut.rlp");
    write_mixed_input(&input);
    let repair_to = |name: &str| {
        let output = dir.path().join(name);
        let out = rootline(&[
            "repair",
            input.to_str().unwrap(),
            "-o",
            output.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{out:?}");
        output
    };

    // The metadata counts all three outcomes; exactly the ambiguous samples carry one gap, right
    // between the re-attached `Main` and the frames the cap left; the unrepairable one ends in the
    // truncation frame instead.
    let fixed = read(&repair_to("fixed.rlp"));
    let extra = &fixed.metadata.extra;
    let counts: Vec<&str> = ["repair.exact", "repair.ambiguous", "repair.unrepairable"]
        .iter()
        .map(|k| extra[*k].as_str())
        .collect();
    assert_eq!(counts, ["1", "2", "1"], "{extra:?}");
    assert_eq!(fixed.metadata.truncated_samples, 1);
    let gapped = gapped_stacks(&fixed);
    assert_eq!(gapped.len(), 2, "{gapped:?}");
    for n in &gapped {
        assert_eq!(n[..3], ["App!Main", GAP, "App!R"]);
        assert_eq!(n.iter().filter(|f| *f == GAP).count(), 1);
    }
    let gap = (0..fixed.frames().len() as u32)
        .map(FrameId)
        .find(|&f| fixed.frame_name(f) == GAP)
        .unwrap();
    assert_eq!(fixed.frame(gap).kind, FrameKind::Pseudo);

    // Folded: the two ambiguous samples, and only they, read `Main;[repair: frames unknown];R…`.
    let folded = std::fs::read_to_string(repair_to("fixed.folded")).unwrap();
    let with_gap: Vec<&str> = folded.lines().filter(|l| l.contains(GAP)).collect();
    assert_eq!(with_gap.len(), 2, "{folded}");
    for line in &with_gap {
        assert!(line.contains(&format!(";App!Main;{GAP};App!R;")), "{line}");
    }
    // Formats rootline reads back: the gap is there, in place, once per ambiguous sample.
    for (name, format) in [
        ("fixed.pb.gz", "pprof"),
        ("fixed.speedscope.json", "speedscope"),
        ("fixed.json", "chromium"),
    ] {
        let path = repair_to(name);
        let format = rootline_formats::Format::from_name(format).unwrap();
        let back = rootline_formats::read(
            format,
            std::io::BufReader::new(std::fs::File::open(&path).unwrap()),
        )
        .unwrap();
        let gapped = gapped_stacks(&back);
        assert!(!gapped.is_empty(), "{name}: no gap frame");
        for n in &gapped {
            assert_eq!(n[..2], ["App!Main", GAP], "{name}");
        }
        if format != rootline_formats::Format::Chromium {
            // Chromium merges equal neighbouring samples into one span; the others keep samples.
            assert_eq!(gapped.len(), 2, "{name}");
        }
    }
    // Write-only formats: the gap is one of the frame names they carry.
    for name in ["fixed.svg", "fixed.fxprof.json", "fixed.otlp.pb"] {
        let bytes = std::fs::read(repair_to(name)).unwrap();
        assert!(
            bytes.windows(GAP.len()).any(|w| w == GAP.as_bytes()),
            "{name}: no gap frame"
        );
    }
}
