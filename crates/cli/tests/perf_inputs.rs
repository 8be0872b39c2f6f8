//! Inputs recorded by perf: `perf script` text made at test time with the real perf from a
//! recording of the C call graph program, and inferno's and FlameGraph's `perf script` fixtures
//! when `../shared` holds them (skipped with a reason otherwise).
#![cfg(target_os = "linux")]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../../capture/tests/common/callgraph.rs"]
mod callgraph;

fn rootline() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rootline"))
}

/// Whether perf can record here (installed, and allowed to open a software event).
fn perf_works(dir: &Path) -> bool {
    let ok = Command::new("perf")
        .args(["record", "-e", "cpu-clock", "-q", "-o"])
        .arg(dir.join("probe.data"))
        .args(["--", "true"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!(
            "skipped: perf is missing or may not record here (scripts/test.sh installs linux-perf)"
        );
    }
    ok
}

/// The call graph program recorded by perf with `call_graph` (fp or dwarf) into `dir`.
fn perf_record(dir: &Path, call_graph: &str) -> PathBuf {
    let exe = callgraph::build_callgraph(
        &format!("perf_inputs_callgraph_{call_graph}"),
        &["-O1", "-fno-omit-frame-pointer"],
    );
    let data = dir.join(format!("{call_graph}.data"));
    let out = Command::new("perf")
        .args([
            "record",
            "-e",
            "cpu-clock",
            "-F",
            "999",
            "-q",
            "--call-graph",
            call_graph,
        ])
        .arg("-o")
        .arg(&data)
        .arg("--")
        .arg(&exe)
        .args(["0.5", "1"])
        .output()
        .expect("perf runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    data
}

/// The collapsed stacks `rootline convert INPUT -o x.folded` writes, without counts.
fn folded_stacks(input: &Path) -> BTreeSet<String> {
    let out = input.with_extension("folded");
    let status = rootline()
        .arg("convert")
        .arg(input)
        .arg("-o")
        .arg(&out)
        .output()
        .expect("rootline runs");
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().0.to_string())
        .collect()
}

/// The caller → callee edges the call graph program allows among its own functions.
const EDGES: &[(&str, &str)] = &[
    ("main", "work"),
    ("worker", "work"),
    ("work", "a"),
    ("work", "b"),
    ("work", "leaf_tail"),
    ("a", "leaf"),
    ("b", "leaf_tail"),
];
const OWN: &[&str] = &[
    "main",
    "worker",
    "watcher",
    "work",
    "a",
    "b",
    "leaf",
    "leaf_tail",
];

/// Whether `caller` → `callee` is an edge of the program, or (with `skip`) two edges through one
/// function between them.
fn allowed(caller: &str, callee: &str, skip: bool) -> bool {
    EDGES.contains(&(caller, callee))
        || skip
            && EDGES
                .iter()
                .any(|&(c, m)| c == caller && EDGES.contains(&(m, callee)))
}

/// Checks every caller edge between the program's own functions in `stacks` (`comm;root;…;leaf`),
/// and returns how many stacks reach `work` from `main` or `worker`. With `fp_leaf`, the leaf's
/// caller may be one function too far up: perf's frame-pointer walk starts from the frame pointer
/// of the function the leaf was called from when the leaf is sampled before it set up its own
/// frame, so that function is missing from perf's chain (the data, not the reading, lacks it).
fn check_edges(stacks: &BTreeSet<String>, fp_leaf: bool) -> usize {
    let mut whole = 0;
    for stack in stacks {
        let frames: Vec<&str> = stack.split(';').collect();
        // The last of the program's own functions (kernel frames may follow it).
        let last_own = frames.iter().rposition(|f| OWN.contains(f));
        for (i, pair) in frames.windows(2).enumerate() {
            let (caller, callee) = (pair[0], pair[1]);
            let leaf = Some(i + 1) == last_own;
            if OWN.contains(&caller) && OWN.contains(&callee) {
                assert!(
                    allowed(caller, callee, fp_leaf && leaf),
                    "wrong caller {caller} → {callee} in {stack}"
                );
            }
        }
        if stack.contains(";main;work;") || stack.contains(";worker;work;") {
            whole += 1;
        }
    }
    whole
}

#[test]
fn perf_script_text_of_a_real_recording_is_read() {
    let dir = tempfile::tempdir().unwrap();
    if !perf_works(dir.path()) {
        return;
    }
    let data = perf_record(dir.path(), "fp");
    let script = dir.path().join("fp.perf");
    let out = Command::new("perf")
        .arg("script")
        .arg("-i")
        .arg(&data)
        .output()
        .expect("perf script runs");
    assert!(out.status.success());
    // A name without a known extension: the format is found by content.
    let unnamed = dir.path().join("fp-script.txt");
    std::fs::write(&script, &out.stdout).unwrap();
    std::fs::write(&unnamed, &out.stdout).unwrap();

    let stacks = folded_stacks(&script);
    assert!(
        check_edges(&stacks, true) > 0,
        "no stack reaches work from main or worker: {stacks:#?}"
    );
    assert!(
        stacks.iter().any(|s| s.contains(";main;work;"))
            && stacks.iter().any(|s| s.contains(";worker;work;")),
        "{stacks:#?}"
    );
    assert_eq!(folded_stacks(&unnamed), stacks);

    let report = rootline().arg("report").arg(&unnamed).output().unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    assert!(text.contains("Profile from perf script"), "{text}");
    assert!(text.contains("\n      main → work → "), "{text}");
}

/// The fixtures directory of `../shared`, or None (with the reason printed).
fn shared_fixtures() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/third_party");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "skipped: {} is not there (third-party fixtures live outside the repository)",
            dir.display()
        );
        None
    }
}

#[test]
fn inferno_perf_script_fixtures_collapse_as_inferno_does() {
    let Some(fixtures) = shared_fixtures() else {
        return;
    };
    let dir = fixtures.join("inferno/tests/data/collapse-perf");
    let tmp = tempfile::tempdir().unwrap();
    let mut compared = 0;
    for name in ["cpp-stacks-std-function", "go-stacks", "single-line-stacks"] {
        let expected = dir.join(format!("results/{name}-collapsed.txt"));
        let input = tmp.path().join(format!("{name}.perf"));
        std::fs::copy(dir.join(format!("{name}.txt")), &input).unwrap();
        let want: BTreeSet<String> = std::fs::read_to_string(&expected)
            .unwrap()
            .lines()
            .map(|l| l.rsplit_once(' ').unwrap().0.to_string())
            .collect();
        // inferno drops an argument list left in a name (`operator()` → `operator`); rootline
        // keeps the name perf printed.
        let ours: BTreeSet<String> = folded_stacks(&input)
            .into_iter()
            .map(|s| s.replace("::operator();", "::operator;"))
            .collect();
        assert_eq!(ours, want, "{name}");
        compared += 1;
    }
    assert_eq!(compared, 3);
}
