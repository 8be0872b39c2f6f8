//! The `rootline` binary with pprof files: found by content when the name says nothing, converted,
//! and bad ones rejected with a one-line positioned error.

#[path = "../../../tests/support/fixtures.rs"]
mod fixtures;
#[path = "../../../tests/support/real_tools.rs"]
mod real_tools;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn rootline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args(args)
        .output()
        .expect("run rootline")
}

/// `rootline report` and `rootline convert -o x.folded` of `input` both count `total`.
fn assert_reported_and_converted(input: &Path, total: u64) {
    let dir = tempfile::tempdir().unwrap();
    let input_s = input.to_str().unwrap();
    let out = rootline(&["report", input_s]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&format!("total {total}")), "{stdout}");

    let folded = dir.path().join("out.folded");
    let out = rootline(&["convert", input_s, "-o", folded.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let sum: u64 = std::fs::read_to_string(&folded)
        .unwrap()
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    assert_eq!(sum, total, "{}", input.display());
}

#[test]
fn pprof_files_are_recognised_by_content_and_converted() {
    let test = "pprof_files_are_recognised_by_content_and_converted";
    // Gzipped profile.proto named `.cpu`, and a legacy binary CPU profile.
    for (input, total) in [
        ("pprof/internal/report/testdata/sample.cpu", 176),
        ("pprof/profile/testdata/cppbench.cpu", 712),
    ] {
        if let Some(path) = fixtures::third_party(test, input) {
            assert_reported_and_converted(&path, total);
        }
    }
}

/// The sample count `go tool pprof -raw` reads from `path` (first value column, summed).
fn go_sample_count(path: &Path) -> u64 {
    let out = Command::new("go")
        .args(["tool", "pprof", "-raw", "-symbolize=none"])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let samples = text.split_once("Samples:\n").unwrap().1;
    samples
        .lines()
        .skip(1) // the column names
        .map_while(|l| l.split_once(':'))
        .map(|(values, _)| {
            values
                .split_whitespace()
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum()
}

/// What Go's runtime/pprof and gperftools write now, under names that say nothing of pprof.
#[test]
fn generated_pprof_files_are_recognised_by_content_and_converted() {
    let dir = tempfile::tempdir().unwrap();
    let mut inputs: Vec<PathBuf> = Vec::new();
    if let Some(go) = real_tools::go_profiles() {
        let renamed = dir.path().join("go.cpu");
        std::fs::copy(&go.cpu, &renamed).unwrap();
        inputs.push(renamed);
    }
    inputs.extend(real_tools::gperftools_cpu_profile().map(Path::to_path_buf));
    if inputs.is_empty() || !real_tools::available("go", &["version"], "apt-get install golang-go")
    {
        return;
    }
    for input in inputs {
        let total = go_sample_count(&input);
        assert!(total > 0, "{}", input.display());
        assert_reported_and_converted(&input, total);
    }
}

/// Cuts `bytes` in half and checks `rootline report` rejects it in one line naming the gzip
/// stream and a byte offset.
fn assert_cut_is_a_one_line_error(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.pb.gz");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let out = rootline(&["report", cut.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cut.pb.gz"), "{stderr}");
    assert!(stderr.contains("byte offset"), "{stderr}");
    assert!(stderr.contains("gzip"), "{stderr}");
}

#[test]
fn a_cut_pprof_file_is_a_one_line_error_with_a_byte_offset() {
    if let Some(go) = real_tools::go_profiles() {
        assert_cut_is_a_one_line_error(&std::fs::read(&go.heap).unwrap());
    }
    if let Some(path) = fixtures::third_party(
        "a_cut_pprof_file_is_a_one_line_error_with_a_byte_offset",
        "speedscope/sample/profiles/pprof/simple.prof",
    ) {
        assert_cut_is_a_one_line_error(&std::fs::read(path).unwrap());
    }
}
