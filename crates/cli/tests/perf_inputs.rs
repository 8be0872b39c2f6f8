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
    // A name of its own per recording: two tests building one path at once would leave one
    // recording naming a binary rebuilt under it (which is then rightly not symbolized).
    let unique = dir
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let exe = callgraph::build_callgraph(
        &format!("perf_inputs_callgraph_{call_graph}_{unique}"),
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

    // Every other perf script layout of the fixtures reads: with or without time, pid/tid or
    // cpu, frames indented or not, a blank line before the frames, a garbled frame line.
    let flamegraph = fixtures.join("flamegraph/test");
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(&flamegraph)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("perf-")
        })
        .collect();
    for name in [
        "empty-line",
        "java-inline",
        "single-event",
        "sourcepawn-jitdump",
        "versioned-vmlinux",
        "weird-stack-line",
    ] {
        inputs.push(dir.join(format!("{name}.txt")));
    }
    assert!(inputs.len() > 10, "{inputs:?}");
    for input in inputs {
        let copy = tmp.path().join("fixture.perf");
        std::fs::copy(&input, &copy).unwrap();
        assert!(!folded_stacks(&copy).is_empty(), "{}", input.display());
    }
}

/// Stacks of `rootline convert PERF.DATA -o x.folded` for a recording with `call_graph`.
fn imported(dir: &Path, call_graph: &str) -> BTreeSet<String> {
    let data = perf_record(dir, call_graph);
    folded_stacks(&data)
}

#[test]
fn perf_data_with_frame_pointer_chains_is_read() {
    let dir = tempfile::tempdir().unwrap();
    if !perf_works(dir.path()) {
        return;
    }
    let stacks = imported(dir.path(), "fp");
    assert!(check_edges(&stacks, true) > 0, "{stacks:#?}");
}

#[test]
fn perf_data_with_dwarf_stacks_is_unwound_whole_or_marked() {
    let dir = tempfile::tempdir().unwrap();
    if !perf_works(dir.path()) {
        return;
    }
    let stacks = imported(dir.path(), "dwarf");
    // DWARF unwinding recovers every caller: no edge may skip a function, even at the leaf.
    let whole = check_edges(&stacks, false);
    assert!(whole > 0, "{stacks:#?}");
    for stack in &stacks {
        let frames: Vec<&str> = stack.split(';').collect();
        // Root first, after the comm: a stack either starts at a thread's entry or ends explicitly.
        // (A sample in the program's first moments starts at the dynamic loader's
        // `_dl_start_user`, which ld.so's `_start` jumps to and whose CFI ends the stack.)
        let root = frames[1];
        let entry = root == "_start"
            || root == "_dl_start_user"
            || root.ends_with("clone3")
            || root.ends_with("clone");
        assert!(
            entry || root.starts_with("[truncated: "),
            "neither whole nor marked: {stack}"
        );
        if stack.contains(";work;") {
            assert!(
                entry && (stack.contains(";main;work;") || stack.contains(";worker;work;")),
                "the call graph program's stacks are shallow enough for perf's copy: {stack}"
            );
        }
    }
    let report = rootline()
        .arg("report")
        .arg(dir.path().join("dwarf.data"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    assert!(text.contains("main → work → a → leaf"), "{text}");
}

/// Recursion: fib (shallow, branching) and deep (2000 frames, past perf's stack copy and its
/// call-chain depth limit).
const RECURSION: &str = r#"
#include <stdlib.h>
#define FN __attribute__((noipa))
volatile unsigned long sink;
FN unsigned long fib(int n) { return n < 2 ? (sink++, (unsigned long)n) : fib(n - 1) + fib(n - 2); }
FN unsigned long deep(int n) {
    if (n == 0) { for (int i = 0; i < 200000; i++) sink += i; return sink; }
    return deep(n - 1) + 1;
}
FN void run_fib(void) { sink += fib(24); }
FN void run_deep(void) { sink += deep(2000); }
int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 200;
    for (long r = 0; r < rounds; r++) { run_fib(); run_deep(); }
    return 0;
}
"#;

const RECURSION_EDGES: &[(&str, &str)] = &[
    ("main", "run_fib"),
    ("main", "run_deep"),
    ("run_fib", "fib"),
    ("fib", "fib"),
    ("run_deep", "deep"),
    ("deep", "deep"),
];

/// The recursion program recorded by perf with `call_graph`, imported from perf.data.
fn recursion_stacks(dir: &Path, call_graph: &str) -> BTreeSet<String> {
    let src = dir.join("recursion.c");
    let exe = dir.join("recursion");
    std::fs::write(&src, RECURSION).unwrap();
    let cc = Command::new("cc")
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("cc runs");
    assert!(cc.success());
    let data = dir.join(format!("recursion-{call_graph}.data"));
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
        .arg("400")
        .output()
        .expect("perf runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    folded_stacks(&data)
}

/// Checks the recursion program's stacks: every edge between its functions is one the program
/// has (`fp_leaf`: the leaf's caller may be missing, see [`check_edges`]), fib's stacks are whole
/// (from `_start`; `whole_fib`), and each stack either starts at `_start` or at an explicit
/// truncation. Returns the truncation frames seen.
fn check_recursion(stacks: &BTreeSet<String>, fp_leaf: bool, whole_fib: bool) -> BTreeSet<String> {
    let own = ["main", "run_fib", "run_deep", "fib", "deep"];
    let mut truncations = BTreeSet::new();
    for stack in stacks {
        let frames: Vec<&str> = stack.split(';').skip(1).collect();
        let last_own = frames.iter().rposition(|f| own.contains(f));
        for (i, pair) in frames.windows(2).enumerate() {
            let (caller, callee) = (pair[0], pair[1]);
            if own.contains(&caller) && own.contains(&callee) {
                let skip = fp_leaf && Some(i + 1) == last_own;
                let ok = RECURSION_EDGES.contains(&(caller, callee))
                    || skip
                        && RECURSION_EDGES
                            .iter()
                            .any(|&(c, m)| c == caller && RECURSION_EDGES.contains(&(m, callee)));
                assert!(ok, "wrong caller {caller} → {callee} in {stack}");
            }
        }
        if frames[0].starts_with("[truncated: ") {
            truncations.insert(frames[0].to_string());
            assert!(
                !stack.contains(";fib") || !whole_fib,
                "fib's stacks fit perf's copy: {stack}"
            );
        } else if whole_fib && stack.contains(";fib") {
            assert_eq!(frames[0], "_start", "{stack}");
        }
    }
    truncations
}

#[test]
fn perf_data_dwarf_recursion_is_whole_where_the_copy_reached_the_root() {
    let dir = tempfile::tempdir().unwrap();
    if !perf_works(dir.path()) {
        return;
    }
    let stacks = recursion_stacks(dir.path(), "dwarf");
    assert!(
        stacks
            .iter()
            .any(|s| s.contains(";_start;__libc_start_main")),
        "{stacks:#?}"
    );
    let truncations = check_recursion(&stacks, false, true);
    // 2000 frames of deep do not fit perf's default 8 KiB copy of the stack.
    assert_eq!(
        truncations,
        BTreeSet::from(["[truncated: stack-copy-exhausted]".to_string()]),
        "{stacks:#?}"
    );
}

#[test]
fn perf_data_fp_recursion_marks_the_kernels_depth_cap() {
    let dir = tempfile::tempdir().unwrap();
    if !perf_works(dir.path()) {
        return;
    }
    let stacks = recursion_stacks(dir.path(), "fp");
    // glibc is built without frame pointers: perf's chains end at __libc_start_call_main, which
    // is no thread entry, so those stacks are marked as cut where the frame pointers end.
    let truncations = check_recursion(&stacks, true, false);
    assert_eq!(
        truncations,
        BTreeSet::from([
            "[truncated: bad-frame-pointer]".to_string(),
            "[truncated: depth cap 127]".to_string()
        ]),
        "{stacks:#?}"
    );
    for stack in stacks
        .iter()
        .filter(|s| s.contains("[truncated: depth cap"))
    {
        assert!(
            stack.ends_with(";deep") || stack.contains(";deep;"),
            "{stack}"
        );
    }
}

#[test]
fn perf_data_of_a_rebuilt_binary_is_not_symbolized_from_it() {
    let dir = tempfile::tempdir().unwrap();
    if !perf_works(dir.path()) {
        return;
    }
    let exe = callgraph::build_callgraph("perf_inputs_rebuilt", &["-O1"]);
    let data = dir.path().join("rebuilt.data");
    let out = Command::new("perf")
        .args(["record", "-e", "cpu-clock", "-F", "999", "-q", "-g", "-o"])
        .arg(&data)
        .arg("--")
        .arg(&exe)
        .args(["0.3", "1"])
        .output()
        .expect("perf runs");
    assert!(out.status.success());
    // The same path, another build: its symbols would name the recorded addresses wrongly.
    callgraph::build_callgraph("perf_inputs_rebuilt", &["-O2", "-DREBUILT=1"]);
    let folded = dir.path().join("rebuilt.folded");
    let out = rootline()
        .arg("convert")
        .arg(&data)
        .arg("-o")
        .arg(&folded)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("build id differs") && stderr.contains("perf_inputs_rebuilt"),
        "{stderr}"
    );
    let text = std::fs::read_to_string(&folded).unwrap();
    assert!(!text.contains(";work;"), "{text}");
    assert!(text.contains("perf_inputs_rebuilt+0x"), "{text}");
}
