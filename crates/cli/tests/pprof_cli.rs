//! The `rootline` binary with pprof files: found by content when the name says nothing, converted,
//! and bad ones rejected with a one-line positioned error.

use std::path::Path;
use std::process::{Command, Output};

fn rootline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args(args)
        .output()
        .expect("run rootline")
}

fn fixture(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures/third_party")
        .join(path)
        .to_str()
        .unwrap()
        .to_owned()
}

#[test]
fn pprof_files_are_recognised_by_content_and_converted() {
    let dir = tempfile::tempdir().unwrap();
    // Gzipped profile.proto named `.cpu`, and a legacy binary CPU profile.
    for (input, total) in [
        ("pprof/internal/report/testdata/sample.cpu", "176"),
        ("pprof/profile/testdata/cppbench.cpu", "712"),
    ] {
        let out = rootline(&["report", &fixture(input)]);
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains(&format!("total {total}")), "{stdout}");

        let folded = dir.path().join("out.folded");
        let out = rootline(&["convert", &fixture(input), "-o", folded.to_str().unwrap()]);
        assert!(out.status.success(), "{out:?}");
        let sum: u64 = std::fs::read_to_string(&folded)
            .unwrap()
            .lines()
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
            .sum();
        assert_eq!(sum.to_string(), total, "{input}");
    }
}

#[test]
fn a_cut_pprof_file_is_a_one_line_error_with_a_byte_offset() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(fixture("speedscope/sample/profiles/pprof/simple.prof")).unwrap();
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
