//! The Chromium reader against real trace-event files from catapult, speedscope and Perfetto.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{fixtures, real_tools};

use rootline_formats::chromium;

#[test]
fn every_trace_event_fixture_reads() {
    let Some(root) = fixtures::third_party("every_trace_event_fixture_reads", "") else {
        return;
    };
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
        // Every one of these is a trace a viewer opens, so every one must read.
        let profile =
            chromium::read(&bytes[..]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        println!(
            "{}: {} samples, totals {:?}",
            path.display(),
            profile.samples().len(),
            profile.totals()
        );
    }
}

/// One snapshot of speedscope's trace-event importer: the fixture it imported and the stacks
/// (root first, `;`-joined) with their weights in nanoseconds, all profiles of the file merged.
struct Snapshot {
    file: String,
    stacks: BTreeMap<String, (i64, i64)>,
}

/// A printed weight in nanoseconds, and its rounding error (half of the last printed digit).
fn parse_weight(text: &str) -> (i64, i64) {
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
    let decimals = number.split_once('.').map_or(0, |(_, d)| d.len() as i32);
    let value = (number.parse::<f64>().unwrap() * factor).round() as i64;
    (value, (0.5 * factor / 10f64.powi(decimals)).round() as i64)
}

/// speedscope names a slice `name {args}`; rootline keys frames by name only.
fn strip_args(frame: &str) -> &str {
    frame.split_once(" {").map_or(frame, |(name, _)| name)
}

fn speedscope_snapshots(path: &std::path::Path) -> Vec<Snapshot> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut by_test: BTreeMap<String, BTreeMap<String, (i64, i64)>> = BTreeMap::new();
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
            let (value, error) = parse_weight(weight);
            let entry = stacks.entry(stack.join(";")).or_insert((0, 0));
            entry.0 += value;
            entry.1 += error;
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
/// The others differ on purpose: for an `E` whose name matches no open slice speedscope drops the
/// thread's samples or keeps the slice open, where rootline closes the innermost slice as Chrome
/// does; and for overlapping `X` events speedscope re-nests by name where rootline keeps the order
/// of the file. Each difference is counted in the profile's `chromium.*` metadata.
const AGREEING: &[&str] = &[
    "bex-interaction.json",
    "end-event-with-empty-stack.json",
    "event-reordering-name-match.json",
    "matching-x.json",
    "mismatched-args.json",
    "multi-thread-with-samples.json",
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
    "simple-with-samples.json",
    "simple.json",
    "simultaneous-anonymous-calls.json",
    "unbalanced-args.json",
    "x-events-matching-end.json",
    "x-events-matching-start.json",
];

#[test]
fn slices_nest_as_speedscope_nests_them() {
    let test = "slices_nest_as_speedscope_nests_them";
    let (Some(dir), Some(snap)) = (
        fixtures::third_party(test, "speedscope/sample/profiles/trace-event"),
        fixtures::third_party(
            test,
            "speedscope/src/import/__snapshots__/trace-event.test.ts.snap",
        ),
    ) else {
        return;
    };
    let snapshots = speedscope_snapshots(&snap);
    assert!(snapshots.len() > 20, "speedscope snapshots not found");
    let mut agreeing = Vec::new();
    for snap in &snapshots {
        let bytes = std::fs::read(dir.join(&snap.file)).unwrap();
        let profile = chromium::read(&bytes[..]).unwrap();
        // speedscope leaves out stacks of no weight and prints weights rounded.
        let mut ours = common::merged_stack_totals(&profile, 0);
        ours.retain(|_, v| *v != 0);
        let agrees = ours.len() == snap.stacks.len()
            && ours.iter().all(|(stack, &v)| {
                snap.stacks
                    .get(stack)
                    .is_some_and(|&(theirs, error)| (v - theirs).abs() <= error)
            });
        if agrees {
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

/// Per thread (`pid/tid`), the time in nanoseconds covered by at least one slice, and the names of
/// the slices that last: worked out from the JSON directly, independently of the reader.
fn covered_time_and_names(trace: &serde_json::Value) -> (BTreeMap<String, i64>, BTreeSet<String>) {
    let mut intervals: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    let mut open: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
    let mut names = BTreeSet::new();
    for e in trace["traceEvents"].as_array().unwrap() {
        let thread = format!("{}/{}", e["pid"], e["tid"]);
        let ts = (e["ts"].as_f64().unwrap_or(0.0) * 1000.0).round() as i64;
        let name = e["name"].as_str().unwrap_or("").to_owned();
        let mut slice = |name: String, start: i64, end: i64| {
            if end > start {
                names.insert(name);
                intervals
                    .entry(thread.clone())
                    .or_default()
                    .push((start, end));
            }
        };
        match e["ph"].as_str().unwrap() {
            "X" => {
                let dur = (e["dur"].as_f64().unwrap() * 1000.0).round() as i64;
                slice(name, ts, ts + dur);
            }
            "B" => open.entry(thread.clone()).or_default().push((name, ts)),
            "E" => {
                let (name, start) = open.get_mut(&thread).unwrap().pop().unwrap();
                slice(name, start, ts);
            }
            _ => {}
        }
    }
    let covered = intervals
        .into_iter()
        .map(|(thread, mut spans)| {
            spans.sort();
            let (mut total, mut reach) = (0, i64::MIN);
            for (start, end) in spans {
                let start = start.max(reach);
                if end > start {
                    total += end - start;
                    reach = end;
                }
            }
            (thread, total)
        })
        .collect();
    (covered, names)
}

/// A trace node wrote while running a script: every thread's slices rebuild into samples covering
/// exactly the time some slice was open, with every slice that lasted on a stack.
#[test]
fn a_node_trace_reads_into_the_time_its_slices_cover() {
    let Some(path) = real_tools::node_trace() else {
        return;
    };
    let bytes = std::fs::read(path).unwrap();
    let (covered, names) = covered_time_and_names(&serde_json::from_slice(&bytes).unwrap());
    assert!(names.contains("V8.DeserializeIsolate"), "{names:?}");
    let profile = chromium::read(&bytes[..]).unwrap();
    let mut ours: BTreeMap<String, i64> = BTreeMap::new();
    let mut our_names = BTreeSet::new();
    for (key, weight) in common::stack_totals(&profile, 0) {
        let (thread, stack) = key.split_once(':').unwrap();
        if weight > 0 && !stack.is_empty() {
            *ours.entry(thread.to_owned()).or_insert(0) += weight;
            our_names.extend(stack.split(';').map(str::to_owned));
        }
    }
    assert_eq!(ours, covered);
    assert_eq!(our_names, names);
}
