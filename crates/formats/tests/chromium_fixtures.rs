//! The Chromium reader against real trace-event files from catapult, speedscope and Perfetto.

mod common;

use std::collections::BTreeMap;

use rootline_formats::chromium;

#[test]
fn every_trace_event_fixture_reads_without_panic() {
    let root = common::third_party();
    let mut files = Vec::new();
    for dir in [
        "catapult",
        "perfetto",
        "speedscope/sample/profiles/trace-event",
        "firefox-profiler",
    ] {
        files.extend(common::files_under(&root.join(dir), ".json"));
    }
    assert!(
        files.len() >= 40,
        "fixtures missing under {}",
        root.display()
    );
    for path in files {
        let bytes = std::fs::read(&path).unwrap();
        let result = chromium::read(&bytes[..]);
        match &result {
            Ok(p) => println!(
                "{}: {} samples, totals {:?}, {:?}",
                path.display(),
                p.samples().len(),
                p.totals(),
                p.metadata.extra
            ),
            Err(e) => println!("{}: error {e}", path.display()),
        }
    }
}

/// One snapshot of speedscope's trace-event importer: the fixture it imported and the stacks
/// (root first, `;`-joined) with their weights in nanoseconds, all profiles of the file merged.
struct Snapshot {
    file: String,
    stacks: BTreeMap<String, i64>,
}

fn parse_weight(text: &str) -> i64 {
    let (number, factor) = if let Some(n) = text.strip_suffix("µs") {
        (n, 1e3)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1e6)
    } else if let Some(n) = text.strip_suffix("ns") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1e9)
    } else {
        (text, 1.0)
    };
    (number.parse::<f64>().unwrap() * factor).round() as i64
}

/// speedscope names a slice `name {args}`; rootline keys frames by name only.
fn strip_args(frame: &str) -> &str {
    frame.split_once(" {").map_or(frame, |(name, _)| name)
}

fn speedscope_snapshots() -> Vec<Snapshot> {
    let path =
        common::third_party().join("speedscope/src/import/__snapshots__/trace-event.test.ts.snap");
    let text = std::fs::read_to_string(path).unwrap();
    let mut by_test: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for block in text.split("exports[`importTraceEvents ").skip(1) {
        let (title, body) = block.split_once("`] = `").unwrap();
        if let Some(test) = title.strip_suffix(": profileGroup.name 1") {
            files.insert(
                test.to_owned(),
                body.trim()
                    .trim_end_matches(['`', ';'])
                    .trim_matches('"')
                    .to_owned(),
            );
            continue;
        }
        let Some((test, _)) = title.rsplit_once(' ') else {
            continue;
        };
        let Some(list) = body.split_once("\"stacks\": [").map(|(_, rest)| rest) else {
            continue;
        };
        let stacks = by_test.entry(test.to_owned()).or_default();
        for line in list.lines() {
            let line = line.trim();
            if line.starts_with(']') {
                break;
            }
            let Some(entry) = line.strip_prefix('"').and_then(|l| l.strip_suffix("\",")) else {
                continue;
            };
            let (stack, weight) = entry.rsplit_once(' ').unwrap();
            if stack.is_empty() {
                continue;
            }
            let stack: Vec<&str> = stack.split(';').map(strip_args).collect();
            *stacks.entry(stack.join(";")).or_insert(0) += parse_weight(weight);
        }
    }
    by_test
        .into_iter()
        .filter_map(|(test, stacks)| {
            Some(Snapshot {
                file: files.get(&test)?.clone(),
                stacks,
            })
        })
        .collect()
}

/// Fixtures where rootline's nesting agrees with speedscope's importer in stacks and weights.
/// The others differ on purpose: speedscope weighs `samples` entries by the time to the next
/// sample (rootline counts them); for an `E` whose name matches no open slice speedscope drops the
/// thread's samples or keeps the slice open, where rootline closes the innermost slice as Chrome
/// does; and for overlapping `X` events speedscope re-nests by name where rootline keeps the order
/// of the file. Each difference is counted in the profile's `chromium.*` metadata.
const AGREEING: &[&str] = &[
    "bex-interaction.json",
    "end-event-with-empty-stack.json",
    "event-reordering-name-match.json",
    "matching-x.json",
    "mismatched-args.json",
    "multiprocess.json",
    "must-retain-original-order.json",
    "not-enough-end-events.json",
    "only-begin-events.json",
    "out-of-order.json",
    "simple-hermes.json",
    "simple-object.json",
    "simple-partial-trailing-comma.json",
    "simple-partial-whitespace.json",
    "simple-partial.json",
    "simple.json",
    "simultaneous-anonymous-calls.json",
    "unbalanced-args.json",
    "x-events-matching-end.json",
    "x-events-matching-start.json",
];

#[test]
fn slices_nest_as_speedscope_nests_them() {
    let dir = common::third_party().join("speedscope/sample/profiles/trace-event");
    let snapshots = speedscope_snapshots();
    assert!(snapshots.len() > 20, "speedscope snapshots not found");
    let mut agreeing = Vec::new();
    for snap in &snapshots {
        let bytes = std::fs::read(dir.join(&snap.file)).unwrap();
        let profile = chromium::read(&bytes[..]).unwrap();
        let ours = common::merged_stack_totals(&profile, 0);
        if ours == snap.stacks {
            agreeing.push(snap.file.as_str());
        } else {
            println!(
                "{}:\n  speedscope {:?}\n  rootline   {:?}",
                snap.file, snap.stacks, ours
            );
        }
    }
    agreeing.sort();
    agreeing.dedup();
    let mut expected = AGREEING.to_vec();
    expected.sort();
    assert_eq!(agreeing, expected);
}
