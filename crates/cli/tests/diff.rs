//! `rootline diff` and `report --diff` on two real recordings of a program before and after a
//! change that doubles the work of one function (`compute_totals`, see common/workload.rs): that
//! function must come first, its share up, and the flame graph must draw it as grown.
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common {
    pub mod workload;
}

fn rootline(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args(args)
        .output()
        .expect("rootline runs");
    assert!(
        out.status.success(),
        "rootline {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Builds and records the program with `compute_totals` doing `work` times the others' work.
fn record(dir: &Path, name: &str, work: u32) -> PathBuf {
    let program = common::workload::build(&dir.join(name), work, 150);
    let out = dir.join(format!("{name}.rlp"));
    rootline(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--",
        program.to_str().unwrap(),
    ]);
    out
}

/// The rows of a text diff: (self change, total change, function), in printed order.
fn rows(text: &str) -> Vec<(f64, f64, String)> {
    let start = text.find("Changes from").expect("a text diff");
    text[start..]
        .lines()
        .skip(4)
        .map_while(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            (cols.len() == 7).then(|| {
                (
                    cols[2].parse().unwrap(),
                    cols[5].parse().unwrap(),
                    cols[6].to_owned(),
                )
            })
        })
        .collect()
}

#[test]
fn the_function_whose_work_doubled_comes_first() {
    let dir = tempfile::tempdir().unwrap();
    let before = record(dir.path(), "before", 1);
    let after = record(dir.path(), "after", 2);
    let (before, after) = (before.to_str().unwrap(), after.to_str().unwrap());

    // Text diff: compute_totals went from a third of the time to a half.
    let text = String::from_utf8(rootline(&["diff", before, after]).stdout).unwrap();
    let rows = rows(&text);
    assert!(rows.len() >= 3, "{text}");
    let (_, total_change, name) = &rows[0];
    assert_eq!(name, "compute_totals", "{text}");
    assert!(*total_change > 8.0, "{text}");
    for other in ["parse_input", "write_output"] {
        let row = rows.iter().find(|r| r.2 == other).expect(other);
        assert!(row.1 < 0.0, "{other}'s share fell: {text}");
    }

    // The same diff at the end of the report of AFTER.
    let report = String::from_utf8(rootline(&["report", after, "--diff", before]).stdout).unwrap();
    assert!(report.contains("Top functions by self"), "{report}");
    assert_eq!(self::rows(&report)[0].2, "compute_totals", "{report}");

    // Differential collapsed stacks: BEFORE scaled to AFTER's total, compute_totals' stack grew.
    let folded = dir.path().join("diff.folded");
    rootline(&["diff", before, after, "-o", folded.to_str().unwrap()]);
    let folded = std::fs::read_to_string(folded).unwrap();
    let lines: Vec<(&str, u64, u64)> = folded
        .lines()
        .map(|l| {
            let mut parts = l.rsplitn(3, ' ');
            let after = parts.next().unwrap().parse().unwrap();
            let before = parts.next().unwrap().parse().unwrap();
            (parts.next().unwrap(), before, after)
        })
        .collect();
    let before_sum: u64 = lines.iter().map(|l| l.1).sum();
    let after_sum: u64 = lines.iter().map(|l| l.2).sum();
    // Scaling rounds each line down, so at most one count per line is lost.
    assert!(
        before_sum <= after_sum && before_sum + lines.len() as u64 >= after_sum,
        "{folded}"
    );
    let (_, b, a) = lines
        .iter()
        .find(|l| l.0.ends_with(";main;compute_totals;spin"))
        .expect("compute_totals' stack");
    assert!(a > b, "{folded}");

    // The flame graph: inferno's differential colouring marks the grown stack with a + delta.
    let svg = dir.path().join("diff.svg");
    rootline(&["diff", before, after, "-o", svg.to_str().unwrap()]);
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.starts_with("<?xml"), "an SVG");
    let grown = svg
        .split("<title>")
        .skip(1)
        .filter_map(|t| t.split_once("</title>").map(|(title, _)| title))
        .filter(|t| t.starts_with("spin ("))
        .filter_map(|t| {
            t.rsplit_once("; +")?
                .1
                .strip_suffix("%)")?
                .parse::<f64>()
                .ok()
        })
        .fold(0.0, f64::max);
    assert!(grown > 8.0, "no frame grew by more than 8 points");
}

#[test]
fn diff_refuses_outputs_it_cannot_write() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.folded");
    std::fs::write(&file, "main;f 1\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args(["diff", file.to_str().unwrap(), file.to_str().unwrap()])
        .args(["-o", dir.path().join("d.pb.gz").to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("leave out -o for the text diff"),
        "{stderr}"
    );
}
