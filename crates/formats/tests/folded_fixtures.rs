//! Every collapsed-stack file among the third-party fixtures survives
//! folded → Profile → .rlp → Profile → folded.
//!
//! A fixture counts as a collapsed-stack file when it ends in `.txt`/`.folded`/`.collapsed` and every
//! non-blank line parses as `stack count`. The written text must equal the input after the canonical
//! form both sides share: lines sorted, equal stacks merged, and counts compared as numbers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rootline_formats::folded;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/third_party")
}

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

#[test]
fn collapsed_fixtures_round_trip() {
    let mut checked = Vec::new();
    for entry in walkdir::WalkDir::new(fixtures()).sort_by_file_name() {
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
        let bytes = std::fs::read(path).unwrap();
        let Ok(profile) = folded::read(&bytes[..]) else {
            continue; // not a collapsed-stack file (perf script output, notes, …)
        };
        if profile.samples().is_empty() {
            continue;
        }
        let mut rlp = Vec::new();
        rootline_formats::rlp::write(&profile, &mut rlp).unwrap();
        let profile = rootline_formats::rlp::read(&rlp[..]).unwrap();
        assert!(rootline_formats::warnings(&profile).next().is_none());
        let mut written = Vec::new();
        folded::write(&profile, &mut written).unwrap();
        let written = String::from_utf8(written).unwrap();
        let input = String::from_utf8(bytes).unwrap();
        assert_eq!(canonical(&written), canonical(&input), "{}", path.display());
        // The writer itself emits the canonical order: sorted and one line per stack.
        let lines: Vec<&str> = written.lines().collect();
        let mut sorted = lines.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(lines, sorted, "{}", path.display());
        checked.push(path.to_path_buf());
    }
    println!("round-tripped {} collapsed-stack fixtures", checked.len());
    assert!(
        checked.len() >= 40,
        "only {} collapsed fixtures found",
        checked.len()
    );
}
