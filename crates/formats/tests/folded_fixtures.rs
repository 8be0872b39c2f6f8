//! Every collapsed-stack file among the third-party fixtures, and the collapsed output inferno makes
//! of a perf recording made at test time, survives folded → Profile → .rlp → Profile → folded.
//!
//! A fixture counts as a collapsed-stack file when it ends in `.txt`/`.folded`/`.collapsed` and every
//! non-blank line parses as `stack count`. The written text must equal the input after the canonical
//! form both sides share: lines sorted, equal stacks merged, and counts compared as numbers.

#[path = "../../../tests/support/fixtures.rs"]
mod fixtures;
#[path = "../../../tests/support/real_tools.rs"]
mod real_tools;

use std::collections::BTreeMap;
use std::path::Path;

use inferno::collapse::Collapse;
use rootline_formats::folded;

/// Lines sorted with equal stacks merged; counts kept as exact decimal strings summed in fixed point.
fn canonical(text: &str) -> BTreeMap<String, u128> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim_end_matches(['\r', ' ', '\t']);
        if line.trim().is_empty() {
            continue;
        }
        let (stack, count) = line.rsplit_once([' ', '\t']).unwrap();
        let (whole, fraction) = count.split_once('.').unwrap_or((count, ""));
        let scaled: u128 = format!("{whole}{fraction:0<9}").parse().unwrap();
        let stack = stack.trim_end().replace('\n', " ");
        *out.entry(stack).or_default() += scaled;
    }
    out
}

/// Checks one collapsed-stack text; returns whether it was one (a non-empty folded file).
fn round_trips(path: &Path, bytes: &[u8]) -> bool {
    let Ok(profile) = folded::read(bytes) else {
        return false; // not a collapsed-stack file (perf script output, notes, …)
    };
    if profile.samples().is_empty() {
        return false;
    }
    let mut rlp = Vec::new();
    rootline_formats::rlp::write(&profile, &mut rlp).unwrap();
    let profile = rootline_formats::rlp::read(&rlp[..]).unwrap();
    assert!(rootline_formats::warnings(&profile).next().is_none());
    let mut written = Vec::new();
    folded::write(&profile, &mut written).unwrap();
    let written = String::from_utf8(written).unwrap();
    let input = std::str::from_utf8(bytes).unwrap();
    assert_eq!(canonical(&written), canonical(input), "{}", path.display());
    // The writer itself emits the canonical order: sorted and one line per stack.
    let lines: Vec<&str> = written.lines().collect();
    let mut sorted = lines.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(lines, sorted, "{}", path.display());
    true
}

#[test]
fn collapsed_fixtures_round_trip() {
    let Some(root) = fixtures::third_party("collapsed_fixtures_round_trip", "") else {
        return;
    };
    let mut checked = Vec::new();
    for entry in walkdir::WalkDir::new(root).sort_by_file_name() {
        let entry = entry.unwrap();
        let path = entry.path();
        let name = path.to_string_lossy();
        if !entry.file_type().is_file()
            || !(name.ends_with(".txt")
                || name.ends_with(".folded")
                || name.ends_with(".collapsed"))
        {
            continue;
        }
        if round_trips(path, &std::fs::read(path).unwrap()) {
            checked.push(path.to_path_buf());
        }
    }
    println!("round-tripped {} collapsed-stack fixtures", checked.len());
    assert!(
        checked.len() >= 40,
        "only {} collapsed fixtures found",
        checked.len()
    );
}

/// inferno's `collapse-perf` of a perf recording made now: the collapsed file every FlameGraph
/// pipeline starts from.
#[test]
fn inferno_collapse_of_a_perf_recording_round_trips() {
    let Some(script) = real_tools::perf_script() else {
        return;
    };
    let mut collapsed = Vec::new();
    inferno::collapse::perf::Folder::default()
        .collapse(script.as_bytes(), &mut collapsed)
        .unwrap();
    // inferno weighs each sample by its period (the number before the event name).
    let periods: u128 = script
        .lines()
        .filter_map(|l| l.strip_suffix(" cpu-clock: "))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u128>().unwrap())
        .sum();
    let text = String::from_utf8(collapsed.clone()).unwrap();
    let total: u128 = canonical(&text).values().sum();
    assert!(periods > 0, "{script}");
    assert_eq!(total, periods * 1_000_000_000, "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains(";main;rl_outer;rl_middle;rl_leaf ")),
        "{text}"
    );
    assert!(round_trips(Path::new("inferno collapse-perf"), &collapsed));
}
