//! speedscope files: speedscope's own samples and snapshots, round trips, hostile input.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{fixtures, real_tools};

use rootline_formats::{FormatError, Position, chromium, speedscope};
use rootline_profile::{FrameKind, Profile, SampleType};

/// speedscope's repository among the fixtures, or `None` (skipping `test`).
fn dir(test: &str) -> Option<PathBuf> {
    fixtures::third_party(test, "speedscope")
}

/// Stacks and weights speedscope's importer test recorded for `test` (all profiles merged).
fn snapshot(dir: &Path, test: &str) -> BTreeMap<String, i64> {
    let text = std::fs::read_to_string(dir.join("src/lib/__snapshots__/file-format.test.ts.snap"))
        .unwrap();
    let mut out = BTreeMap::new();
    for block in text.split("exports[`importSpeedscopeProfiles ").skip(1) {
        let (title, body) = block.split_once("`] = `").unwrap();
        let Some((name, _)) = title.rsplit_once(' ') else {
            continue;
        };
        if name != test {
            continue;
        }
        let Some((_, list)) = body.split_once("\"stacks\": [") else {
            continue;
        };
        for line in list
            .lines()
            .map(str::trim)
            .take_while(|l| !l.starts_with(']'))
        {
            let Some(entry) = line.strip_prefix('"').and_then(|l| l.strip_suffix("\",")) else {
                continue;
            };
            let (stack, weight) = entry.rsplit_once(' ').unwrap();
            // Time units are printed as `2.00s`; unitless weights as `2`.
            let weight = weight.trim_end_matches('s').parse::<f64>().unwrap() as i64;
            *out.entry(stack.to_owned()).or_insert(0) += weight;
        }
    }
    assert!(!out.is_empty(), "no snapshot for {test}");
    out
}

#[test]
fn speedscope_samples_match_speedscope_snapshots() {
    let Some(dir) = dir("speedscope_samples_match_speedscope_snapshots") else {
        return;
    };
    let cases = [
        ("0.0.1/simple.speedscope.json", "0.0.1 evented profile", 1),
        (
            "0.0.1/simple-no-pretty-print.speedscope.json",
            "0.0.1 evented profile (no pretty print)",
            1,
        ),
        (
            "0.1.2/simple-sampled.speedscope.json",
            "0.1.2 sampled profile",
            1_000_000_000,
        ),
        (
            "0.6.0/two-sampled.speedscope.json",
            "0.6.0 multiple profiles",
            1_000_000_000,
        ),
    ];
    for (file, test, unit) in cases {
        let bytes = std::fs::read(dir.join("sample/profiles/speedscope").join(file)).unwrap();
        let profile = speedscope::read(&bytes[..]).unwrap();
        let ours: BTreeMap<String, i64> = common::merged_stack_totals(&profile, 0)
            .into_iter()
            .map(|(k, v)| (k, v / unit))
            .collect();
        assert_eq!(ours, snapshot(&dir, test), "{file}");
    }
}

#[test]
fn speedscope_invalid_samples() {
    let Some(dir) = dir("speedscope_invalid_samples") else {
        return;
    };
    let invalid = dir.join("sample/profiles/speedscope/invalid");
    let bytes = std::fs::read(invalid.join("out-of-order-events.json")).unwrap();
    let err = speedscope::read(&bytes[..]).unwrap_err().to_string();
    assert!(err.contains("\"B\" while \"A\" is the innermost"), "{err}");
    // speedscope refuses a profile left open; rootline closes it at endValue and says so.
    let bytes = std::fs::read(invalid.join("incomplete-trace.json")).unwrap();
    let p = speedscope::read(&bytes[..]).unwrap();
    assert_eq!(p.metadata.extra["speedscope.unclosed_frames"], "1");
    assert_eq!(p.totals(), [100]);
}

#[test]
fn every_speedscope_fixture_reads_without_panic() {
    let Some(dir) = dir("every_speedscope_fixture_reads_without_panic") else {
        return;
    };
    let files = common::files_under(&dir.join("sample/profiles"), ".json");
    assert!(files.len() > 30);
    for path in files {
        let bytes = std::fs::read(&path).unwrap();
        // Trace-event files are not speedscope files: an error, never a panic.
        let _ = speedscope::read(&bytes[..]);
        let _ = chromium::read(&bytes[..]);
    }
}

/// Stacks (frame names root first, `;`-joined) with their summed weights in nanoseconds, worked out
/// from a sampled speedscope file's JSON directly, all profiles merged.
fn sampled_stacks(file: &serde_json::Value) -> BTreeMap<String, i64> {
    let frames: Vec<&str> = file["shared"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    let mut out = BTreeMap::new();
    for profile in file["profiles"].as_array().unwrap() {
        assert_eq!(profile["type"], "sampled");
        assert_eq!(profile["unit"], "seconds");
        let weights = profile["weights"].as_array().unwrap();
        for (sample, weight) in profile["samples"].as_array().unwrap().iter().zip(weights) {
            let stack: Vec<&str> = sample
                .as_array()
                .unwrap()
                .iter()
                .map(|i| frames[i.as_u64().unwrap() as usize])
                .collect();
            // A sample with no frames (py-spy's idle samples) has no stack to hold it: the reader
            // leaves it out.
            if stack.is_empty() {
                continue;
            }
            let ns = (weight.as_f64().unwrap() * 1e9).round() as i64;
            *out.entry(stack.join(";")).or_insert(0) += ns;
        }
    }
    out
}

/// A file py-spy wrote while sampling a Python program: every stack and weight as in the JSON.
#[test]
fn a_py_spy_recording_reads_with_every_stack_and_weight() {
    let Some(path) = real_tools::py_spy_speedscope() else {
        return;
    };
    let bytes = std::fs::read(path).unwrap();
    let expected = sampled_stacks(&serde_json::from_slice(&bytes).unwrap());
    assert!(
        expected
            .keys()
            .any(|s| s.ends_with("<module>;main;middle;leaf")),
        "{expected:?}"
    );
    let profile = speedscope::read(&bytes[..]).unwrap();
    assert_eq!(common::merged_stack_totals(&profile, 0), expected);
}

fn sample_profile() -> Profile {
    let mut p = Profile::new(vec![SampleType::cpu_nanoseconds(), SampleType::samples()]);
    p.set_process_name(7, "svc");
    let names = ["main", "run", "parse", "lex", "emit"];
    for t in 0..3u32 {
        let thread = p.intern_thread(7, 70 + t);
        if t > 0 {
            p.set_thread_name(thread, &format!("worker-{t}"));
        }
        for s in 0..50u32 {
            let depth = 1 + ((s * 7 + t) % 5) as usize;
            let frames: Vec<_> = names[..depth]
                .iter()
                .map(|n| p.intern_named_frame(n, FrameKind::Native))
                .collect();
            let stack = p.intern_stack_root_first(frames).unwrap();
            let time = u64::from(s) * 1_000_000;
            p.push_sample(time, thread, stack, &[1_000_000 + i64::from(s), 1])
                .unwrap();
        }
    }
    p
}

#[test]
fn round_trip_keeps_stacks_and_totals() {
    let original = sample_profile();
    let mut out = Vec::new();
    speedscope::write(&original, &mut out).unwrap();
    let back = speedscope::read(&out[..]).unwrap();
    assert_eq!(back.totals(), vec![original.totals()[0]]);
    assert_eq!(back.sample_types(), [SampleType::wall_nanoseconds()]);
    let strip = |m: BTreeMap<String, i64>| -> BTreeMap<String, i64> {
        m.into_iter()
            .map(|(k, v)| (k.split_once(':').unwrap().1.to_owned(), v))
            .collect()
    };
    let per_thread = |p: &Profile| -> Vec<BTreeMap<String, i64>> {
        let all = common::stack_totals(p, 0);
        let mut tids: Vec<String> = all
            .keys()
            .map(|k| k.split_once(':').unwrap().0.to_owned())
            .collect();
        tids.dedup();
        tids.iter()
            .map(|t| {
                strip(
                    all.iter()
                        .filter(|(k, _)| k.starts_with(&format!("{t}:")))
                        .map(|(k, v)| (k.clone(), *v))
                        .collect(),
                )
            })
            .collect()
    };
    assert_eq!(per_thread(&back), per_thread(&original));
    let names: Vec<_> = back
        .threads()
        .iter()
        .map(|t| back.string(t.name.unwrap()).to_owned())
        .collect();
    assert_eq!(
        names,
        [
            "svc (pid 7, tid 70)",
            "worker-1 (pid 7, tid 71)",
            "worker-2 (pid 7, tid 72)"
        ]
    );
}

/// Profile names and weight sums per view of a written file.
fn view_totals(out: &[u8]) -> BTreeMap<String, (String, i64)> {
    let file: serde_json::Value = serde_json::from_slice(out).unwrap();
    let mut views = BTreeMap::new();
    for p in file["profiles"].as_array().unwrap() {
        let sum: i64 = p["weights"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_i64().unwrap())
            .sum();
        let entry = views
            .entry(p["name"].as_str().unwrap().to_owned())
            .or_insert((p["unit"].as_str().unwrap().to_owned(), 0));
        entry.1 += sum;
    }
    views
}

#[test]
fn allocation_columns_get_their_own_views() {
    let mut p = Profile::new(vec![
        SampleType::wall_nanoseconds(),
        SampleType::alloc_bytes(),
        SampleType::alloc_count(),
    ]);
    let thread = p.intern_thread(7, 70);
    let main = p.intern_named_frame("main", FrameKind::Native);
    let stack = p.intern_stack(None, main);
    let ty = rootline_profile::pseudo::intern_alloc_frame(&mut p, Some("T"));
    let alloc = p.intern_stack(Some(stack), ty);
    p.push_sample(0, thread, stack, &[1_000, 0, 0]).unwrap();
    p.push_sample(1, thread, alloc, &[0, 4096, 1]).unwrap();
    p.push_sample(2, thread, alloc, &[0, 100, 1]).unwrap();
    let mut out = Vec::new();
    speedscope::write(&p, &mut out).unwrap();
    let views = view_totals(&out);
    let want: BTreeMap<String, (String, i64)> = [
        ("pid 7, tid 70 — wall", ("nanoseconds", 1_000)),
        ("pid 7, tid 70 — alloc-bytes", ("bytes", 4196)),
        ("pid 7, tid 70 — alloc-count", ("none", 2)),
    ]
    .into_iter()
    .map(|(n, (u, v))| (n.to_owned(), (u.to_owned(), v)))
    .collect();
    assert_eq!(views, want);

    // Allocations only: no time view.
    p.keep_value_column(1).unwrap();
    let mut out = Vec::new();
    speedscope::write(&p, &mut out).unwrap();
    let views = view_totals(&out);
    assert_eq!(
        views.into_iter().collect::<Vec<_>>(),
        [(
            "pid 7, tid 70 — alloc-bytes".to_owned(),
            ("bytes".to_owned(), 4196)
        )]
    );
}

#[test]
fn bad_input_gives_positioned_errors() {
    let deep = format!("{{\"shared\": {}", "[".repeat(1000));
    let cases = [
        ("truncated", r#"{"shared": {"frames": [{"name": "a"}"#.to_owned()),
        ("wrong type", r#"{"shared": {"frames": 5}, "profiles": []}"#.to_owned()),
        ("deep", deep),
        ("huge number", r#"{"shared": {"frames": [{"name": "a"}]}, "profiles": [{"type": "sampled", "name": "x", "unit": "seconds", "startValue": 0, "endValue": 1e308, "samples": [[0]], "weights": [1e308]}]}"#.to_owned()),
        ("bad frame", r#"{"shared": {"frames": []}, "profiles": [{"type": "sampled", "name": "x", "unit": "none", "startValue": 0, "endValue": 1, "samples": [[3]], "weights": [1]}]}"#.to_owned()),
    ];
    for (what, text) in cases {
        let err = speedscope::read(text.as_bytes()).expect_err(what);
        match err {
            FormatError::Invalid {
                position: Position::LineColumn { .. } | Position::Input,
                ..
            } => {}
            other => panic!("{what}: {other:?}"),
        }
    }
}
