//! The `rootline` binary on bad input: one-line errors naming the file (and line), exit code 1.

#[path = "../../../tests/support/fixtures.rs"]
mod fixtures;
#[path = "../../../tests/support/real_tools.rs"]
mod real_tools;

use std::path::Path;
use std::process::{Command, Output};

use inferno::collapse::Collapse;

fn rootline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args(args)
        .output()
        .expect("run rootline")
}

fn assert_one_line_error(output: &Output, must_contain: &[&str]) {
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr}"
    );
    assert!(stderr.starts_with("rootline: error: "), "{stderr}");
    for needle in must_contain {
        assert!(stderr.contains(needle), "{stderr:?} lacks {needle:?}");
    }
}

#[test]
fn bad_inputs_give_one_line_errors_with_exit_code_1() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    std::fs::write(path("bad.folded"), "a;b 1\na;c 2\nthis line has no count\n").unwrap();
    std::fs::write(path("utf8.folded"), b"a;b 1\n\xc3\x28;x 2\n").unwrap();
    std::fs::write(path("empty.folded"), b"").unwrap();
    std::fs::write(path("negative.folded"), b"a -3\n").unwrap();

    let out = rootline(&["report", &path("bad.folded")]);
    assert_one_line_error(&out, &["bad.folded", "line 3"]);
    let out = rootline(&["convert", &path("utf8.folded"), "-o", &path("x.svg")]);
    assert_one_line_error(&out, &["utf8.folded", "line 2", "UTF-8"]);
    assert!(!Path::new(&path("x.svg")).exists(), "no output on failure");
    let out = rootline(&["report", &path("empty.folded")]);
    assert_one_line_error(&out, &["empty.folded", "empty"]);
    let out = rootline(&["report", &path("negative.folded")]);
    assert_one_line_error(&out, &["negative.folded", "line 1"]);
    let out = rootline(&["report", dir.path().to_str().unwrap()]);
    assert_one_line_error(&out, &["is a directory"]);
    let out = rootline(&["report", &path("missing.folded")]);
    assert_one_line_error(&out, &["missing.folded"]);
    let out = rootline(&[
        "convert",
        &path("bad.folded"),
        "-o",
        &path("out.unknownext"),
    ]);
    assert_one_line_error(&out, &["out.unknownext", "--format"]);
}

#[test]
fn usage_errors_exit_1_and_help_exits_0() {
    let out = rootline(&["no-such-command"]);
    assert_eq!(out.status.code(), Some(1));
    let out = rootline(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("convert"));
    let out = rootline(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("rootline "));
}

/// Converts a collapsed file to SVG and reports its top functions with the call tree; returns the
/// report.
fn convert_and_report(folded: &Path, function: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("out.svg");
    let out = rootline(&[
        "convert",
        folded.to_str().unwrap(),
        "--input-format",
        "folded",
        "-o",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<?xml") && text.contains(function));

    let out = rootline(&["report", folded.to_str().unwrap(), "--top", "3", "--tree"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("Call tree"), "{text}");
    text
}

#[test]
fn convert_and_report_a_real_collapsed_file() {
    let Some(fixture) = fixtures::third_party(
        "convert_and_report_a_real_collapsed_file",
        "flamegraph/test/results/perf-numa-stacks-01-collapsed-all.txt",
    ) else {
        return;
    };
    let text = convert_and_report(&fixture, "native_safe_halt");
    // 74 of the 199 samples end in native_safe_halt (72 + 2 in the file itself).
    assert!(
        text.contains("37.19%   37.19%  native_safe_halt_[k]"),
        "{text}"
    );
}

/// The collapsed file inferno makes of a perf recording made now: the report's self and total
/// shares of the workload's leaf are the ones the file's counts give.
#[test]
fn convert_and_report_a_collapsed_perf_recording() {
    let Some(script) = real_tools::perf_script() else {
        return;
    };
    let mut collapsed = Vec::new();
    inferno::collapse::perf::Folder::default()
        .collapse(script.as_bytes(), &mut collapsed)
        .unwrap();
    let folded_text = String::from_utf8(collapsed).unwrap();
    let (mut total, mut leaf_self, mut leaf_total) = (0u64, 0u64, 0u64);
    for line in folded_text.lines() {
        let (stack, count) = line.rsplit_once(' ').unwrap();
        let count: u64 = count.parse().unwrap();
        total += count;
        if stack.ends_with(";rl_leaf") {
            leaf_self += count;
        }
        if stack.split(';').any(|f| f == "rl_leaf") {
            leaf_total += count;
        }
    }
    assert!(leaf_self > 0, "{folded_text}");
    let dir = tempfile::tempdir().unwrap();
    let folded = dir.path().join("perf.folded");
    std::fs::write(&folded, &folded_text).unwrap();
    let text = convert_and_report(&folded, "rl_leaf");
    let percent = |n: u64| format!("{:.2}%", n as f64 * 100.0 / total as f64);
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(2) == Some("rl_leaf"))
        .unwrap_or_else(|| panic!("no rl_leaf line: {text}"));
    let columns: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        columns[..2],
        [percent(leaf_self), percent(leaf_total)],
        "{text}"
    );
}

#[test]
fn a_torn_rlp_file_still_reports_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/server.folded");
    let rlp = dir.path().join("server.rlp");
    let out = rootline(&[
        "convert",
        example.to_str().unwrap(),
        "-o",
        rlp.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    // Append half of a second copy: a torn chunk after a complete one.
    let mut bytes = std::fs::read(&rlp).unwrap();
    let whole = bytes.len();
    let chunk = bytes[12..].to_vec();
    bytes.extend_from_slice(&chunk[..chunk.len() / 2]);
    let torn = dir.path().join("torn.rlp");
    std::fs::write(&torn, &bytes).unwrap();
    let out = rootline(&["report", torn.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("torn or corrupt at byte {whole}")),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("total 1665"));
    // Sniffed by content too: no extension.
    let bare = dir.path().join("noext");
    std::fs::copy(&rlp, &bare).unwrap();
    let out = rootline(&["report", bare.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
}
