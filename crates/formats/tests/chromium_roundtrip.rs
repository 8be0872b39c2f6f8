//! Chromium trace JSON: round trips, the dotnet-trace dialect, and hostile input.

mod common;

use rootline_formats::{FormatError, Position, chromium};
use rootline_profile::{FrameKind, Profile, SampleType};

/// A profile whose samples are 1 ms apart per thread and weigh 1 ms of wall time, with deep stacks
/// that change a little from sample to sample, on several named threads.
fn timed_profile(threads: u32, samples: u32, depth: u32) -> Profile {
    let mut p = Profile::new(vec![SampleType::wall_nanoseconds()]);
    p.set_process_name(42, "demo app");
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for t in 0..threads {
        let thread = p.intern_thread(42, 100 + t);
        p.set_thread_name(thread, &format!("worker \"{t}\""));
        for s in 0..samples {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let keep = depth - (seed % 6) as u32;
            let mut frames = Vec::new();
            for d in 0..depth {
                let name = if d < keep {
                    format!("Module{}!Ns.Type.Method{d}(int32)", d % 3)
                } else {
                    format!("Leaf!Ns.Leaf{}(){}", seed % 4, d)
                };
                frames.push(p.intern_named_frame(&name, FrameKind::Managed));
            }
            let stack = p.intern_stack_root_first(frames).unwrap();
            let time = 1_000_000_000 + u64::from(s) * 1_000_000 + u64::from(t) * 17;
            p.push_sample(time, thread, stack, &[1_000_000]).unwrap();
        }
    }
    p
}

fn write(profile: &Profile) -> Vec<u8> {
    let mut out = Vec::new();
    chromium::write(profile, &mut out).unwrap();
    out
}

#[test]
fn round_trip_keeps_stacks_totals_and_names() {
    let original = timed_profile(3, 200, 100);
    let text = write(&original);
    let back = chromium::read(&text[..]).unwrap();
    assert_eq!(back.totals(), original.totals());
    assert_eq!(
        common::stack_totals(&back, 0),
        common::stack_totals(&original, 0)
    );
    let names: Vec<_> = (0..back.threads().len())
        .map(|i| {
            back.thread_name(rootline_profile::ThreadId(i as u32))
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(names, ["worker \"0\"", "worker \"1\"", "worker \"2\""]);
    assert_eq!(back.process_name(42), Some("demo app"));
    assert_eq!(back.metadata.producer, "rootline (chromium)");
    assert_eq!(back.metadata.depth_cap, None);
    assert_eq!(back.metadata.extra["chromium.unclosed_slices"], "0");
}

#[test]
fn round_trip_across_the_reorder_window() {
    // More events on one thread than the reader's per-thread reorder window holds (65,536), so
    // nesting happens in several batches.
    let original = timed_profile(1, 15_000, 12);
    let text = write(&original);
    let back = chromium::read(&text[..]).unwrap();
    let transitions: u64 = back.metadata.extra["chromium.stack_transitions"]
        .parse()
        .unwrap();
    assert!(transitions > 70_000, "only {transitions} transitions");
    assert_eq!(back.totals(), original.totals());
    assert_eq!(
        common::stack_totals(&back, 0),
        common::stack_totals(&original, 0)
    );
    assert!(
        !back
            .metadata
            .extra
            .contains_key("chromium.out_of_order_events")
    );
}

#[test]
fn samples_without_times_are_laid_end_to_end() {
    // Collapsed stacks carry no times and no time column: each sample is laid after the
    // previous one and lasts 1 ms per count, so the trace keeps the profile's proportions.
    let folded = "a;b;c 3\na;b 2\nx 1\n";
    let original = rootline_formats::folded::read(folded.as_bytes()).unwrap();
    let back = chromium::read(&write(&original)[..]).unwrap();
    let stacks: Vec<String> = common::merged_stack_totals(&back, 0)
        .into_iter()
        .map(|(s, v)| format!("{s} {}", v / 1_000_000))
        .collect();
    assert_eq!(stacks, ["a;b 2", "a;b;c 3", "x 1"]);
}

/// The shape `dotnet-trace convert --format chromium` writes (TraceEvent's
/// ChromiumStackSourceWriter): `ts` in relative milliseconds, `sf` ids, `Module!Method` split into
/// category and name, parents as numbers, `otherData` after the frames.
const DOTNET: &str = r#"{"traceEvents": [{"name": "Process64 Process(4242) (4242) Args: ", "cat": "sampleEvent", "ph": "B", "ts": 0.5, "pid": 0, "tid": 4243, "sf": 0}, {"name": "Threads", "cat": "sampleEvent", "ph": "B", "ts": 0.5, "pid": 0, "tid": 4243, "sf": 1}, {"name": "Thread (4243)", "cat": "sampleEvent", "ph": "B", "ts": 0.5, "pid": 0, "tid": 4243, "sf": 2}, {"name": "Program.Main(class System.String[])", "cat": "sampleEvent", "ph": "B", "ts": 0.5, "pid": 0, "tid": 4243, "sf": 3}, {"name": "CPU_TIME", "cat": "sampleEvent", "ph": "B", "ts": 0.5, "pid": 0, "tid": 4243, "sf": 4}, {"name": "CPU_TIME", "cat": "sampleEvent", "ph": "E", "ts": 3.5, "pid": 0, "tid": 4243, "sf": 4}, {"name": "Program.Work()", "cat": "sampleEvent", "ph": "B", "ts": 3.5, "pid": 0, "tid": 4243, "sf": 5}, {"name": "Program.Work()", "cat": "sampleEvent", "ph": "E", "ts": 4.5, "pid": 0, "tid": 4243, "sf": 5}, {"name": "Program.Main(class System.String[])", "cat": "sampleEvent", "ph": "E", "ts": 4.5, "pid": 0, "tid": 4243, "sf": 3}, {"name": "Thread (4243)", "cat": "sampleEvent", "ph": "E", "ts": 4.5, "pid": 0, "tid": 4243, "sf": 2}, {"name": "Threads", "cat": "sampleEvent", "ph": "E", "ts": 4.5, "pid": 0, "tid": 4243, "sf": 1}], "displayTimeUnit": "ms", "stackFrames": {"0": {"name": "Process64 Process(4242) (4242) Args: ", "category": ""}, "1": {"name": "Threads", "category": "", "parent": 0}, "2": {"name": "Thread (4243)", "category": "", "parent": 1}, "3": {"name": "Program.Main(class System.String[])", "category": "app", "parent": 2}, "4": {"name": "CPU_TIME", "category": "", "parent": 3}, "5": {"name": "Program.Work()", "category": "app", "parent": 3}}, "otherData": { "name": "trace" }}"#;

#[test]
fn reads_the_dotnet_trace_dialect() {
    let p = chromium::read(DOTNET.as_bytes()).unwrap();
    assert_eq!(p.metadata.producer, "dotnet-trace (chromium)");
    assert_eq!(p.metadata.depth_cap, Some(100));
    assert_eq!(p.metadata.extra["chromium.ts_unit"], "ms");
    // The Process frame stays open until 4.5 ms: it is reported as an unclosed slice.
    assert_eq!(p.metadata.extra["chromium.unclosed_slices"], "1");
    let warnings: Vec<_> = rootline_formats::warnings(&p).collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].0, "chromium.unclosed_slices");
    assert!(warnings[0].1.contains("pid 0 tid 4243"), "{warnings:?}");
    let totals = common::merged_stack_totals(&p, 0);
    let process = "Process64 Process(4242) (4242) Args: ";
    let main = format!("{process};Threads;Thread (4243);app!Program.Main(class System.String[])");
    let expected = [
        (format!("{main};CPU_TIME"), 3_000_000),
        (format!("{main};app!Program.Work()"), 1_000_000),
    ];
    assert_eq!(totals, expected.into_iter().collect());
    let kinds: Vec<(String, FrameKind)> = p
        .frames()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            (
                p.frame_name(rootline_profile::FrameId(i as u32)).to_owned(),
                f.kind,
            )
        })
        .collect();
    for (name, kind) in kinds {
        let pseudo = !name.starts_with("app!");
        assert_eq!(kind == FrameKind::Pseudo, pseudo, "{name}");
        if !pseudo {
            assert_eq!(kind, FrameKind::Managed);
        }
    }
    // 11 events, each changes the open stack.
    assert_eq!(p.metadata.extra["chromium.stack_transitions"], "11");

    // Written again (µs, one stackFrames entry per node) it keeps stacks, totals and depth cap.
    let back = chromium::read(&write(&p)[..]).unwrap();
    assert_eq!(common::stack_totals(&back, 0), common::stack_totals(&p, 0));
    assert_eq!(back.metadata.depth_cap, Some(100));
    assert_eq!(back.metadata.extra["chromium.ts_unit"], "us");
}

#[test]
fn reads_x_events_samples_and_metadata() {
    let text = r#"[
      {"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "main"}},
      {"name": "outer", "ph": "X", "ts": 10, "dur": 10, "pid": 1, "tid": 2, "args": {"x": [1, {"y": null}]}},
      {"name": "inner", "ph": "X", "ts": 12, "dur": 3, "pid": 1, "tid": 2, "future": true},
      {"name": "mark", "ph": "i", "ts": 13, "pid": 1, "tid": 2}
    "#;
    let p = chromium::read(text.as_bytes()).unwrap();
    let totals = common::stack_totals(&p, 0);
    let expected = [("1/2:outer", 7_000), ("1/2:outer;inner", 3_000)];
    assert_eq!(
        totals,
        expected
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect()
    );
    assert_eq!(p.thread_name(rootline_profile::ThreadId(0)), Some("main"));

    let samples = r#"{"samples": [{"ts": 5, "tid": 1, "pid": 1, "sf": "7", "weight": "2"}],
      "stackFrames": {"7": {"name": "leaf", "parent": 3}, "3": {"name": "root"}}}"#;
    let p = chromium::read(samples.as_bytes()).unwrap();
    assert_eq!(
        p.sample_types(),
        [SampleType::wall_nanoseconds(), SampleType::samples()]
    );
    let totals = common::merged_stack_totals(&p, 1);
    assert_eq!(totals, [("root;leaf".to_owned(), 2)].into_iter().collect());
}

fn position(err: &FormatError) -> Option<Position> {
    match err {
        FormatError::Invalid { position, .. } => Some(*position),
        _ => None,
    }
}

#[test]
fn bad_input_gives_positioned_errors() {
    let long_name = format!(
        r#"[{{"name": "{}", "ph": "B", "ts": 1}}]"#,
        "x".repeat(10 << 20)
    );
    let deep = format!(r#"{{"traceEvents": [{{"args": {}}}]}}"#, "[".repeat(10_000));
    let cases: Vec<(&str, String, u64)> = vec![
        ("truncated", r#"{"traceEvents": [{"ph": "B", "ts": 1"#.into(), 36),
        ("wrong type", r#"[{"ph": 5}]"#.into(), 8),
        ("ts not a number", r#"[{"ph": "B", "ts": "soon"}]"#.into(), 19),
        ("ten MB name", long_name, 11),
        ("deep nesting", deep, 152),
        ("huge ts", r#"[{"ph": "B", "ts": 1e300}]"#.into(), 1),
        ("huge tid", r#"[{"ph": "B", "ts": 1, "tid": 99999999999}]"#.into(), 28),
        ("sf cycle", r#"{"samples": [{"ts": 1, "sf": 1}], "stackFrames": {"1": {"name": "a", "parent": 2}, "2": {"name": "b", "parent": 1}}}"#.into(), u64::MAX),
        ("garbage after", "[] x".into(), 3),
        ("empty", String::new(), 0),
        ("not json", "\u{0}\u{1}".into(), 0),
    ];
    for (what, text, offset) in cases {
        let err = chromium::read(text.as_bytes()).expect_err(what);
        let pos = position(&err).unwrap_or_else(|| panic!("{what}: {err} has no position"));
        if offset == u64::MAX {
            assert_eq!(pos, Position::Input, "{what}: {err}");
        } else {
            assert_eq!(pos, Position::Byte(offset), "{what}: {err}");
        }
    }
}

/// Bounded mutation test: thousands of corrupted variants of real inputs never panic, and every
/// error names a position.
#[test]
fn mutated_inputs_never_panic() {
    let mut seeds: Vec<Vec<u8>> = vec![DOTNET.as_bytes().to_vec(), write(&timed_profile(2, 5, 8))];
    // Real traces: one node writes now, and speedscope's samples when the fixtures are present.
    if let Some(trace) = common::real_tools::node_trace() {
        seeds.push(std::fs::read(trace).unwrap());
    }
    if let Some(dir) = common::fixtures::third_party(
        "mutated_inputs_never_panic (speedscope's samples)",
        "speedscope/sample/profiles/trace-event",
    ) {
        for name in [
            "bex-interaction.json",
            "simple-with-samples.json",
            "multiprocess.json",
        ] {
            seeds.push(std::fs::read(dir.join(name)).unwrap());
        }
    }
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    const TOKENS: &[&[u8]] = &[
        b"{", b"}", b"[", b"]", b",", b":", b"\"", b"\\u", b"-", b"1e999", b"null", b"\"B\"",
        b"\"E\"", b"\xff",
    ];
    let mut runs = 0;
    for seed in &seeds {
        for _ in 0..600 {
            let mut input = seed.clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() as usize) % (input.len() + 1);
                match next() % 4 {
                    0 => input.truncate(at),
                    1 if at < input.len() => input[at] = next() as u8,
                    2 => {
                        let token = TOKENS[(next() as usize) % TOKENS.len()];
                        input.splice(at..at, token.iter().copied());
                    }
                    _ => {
                        let end = (at + (next() as usize) % 16).min(input.len());
                        input.drain(at..end);
                    }
                }
            }
            if let Err(err) = chromium::read(&input[..]) {
                assert!(position(&err).is_some(), "{err}");
            }
            runs += 1;
        }
    }
    assert_eq!(runs, seeds.len() * 600);
}

#[test]
fn file_names_pick_the_json_formats() {
    use rootline_formats::Format;
    use std::path::Path;
    for (name, format) in [
        ("trace.json", Format::Chromium),
        ("trace.chromium.json", Format::Chromium),
        ("x.speedscope.json", Format::Speedscope),
        ("X.SPEEDSCOPE.JSON", Format::Speedscope),
    ] {
        assert_eq!(Format::from_path(Path::new(name)), Some(format), "{name}");
    }
    let profile = timed_profile(1, 3, 8);
    for format in [Format::Chromium, Format::Speedscope] {
        let mut out = Vec::new();
        rootline_formats::write(format, &profile, &mut out).unwrap();
        let back = rootline_formats::read(format, &out[..]).unwrap();
        assert_eq!(back.totals(), profile.totals(), "{format}");
    }
}
