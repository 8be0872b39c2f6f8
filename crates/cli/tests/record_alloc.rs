//! `rootline record --alloc` against ground truth: a C++ program (tests/c/alloc.cc) whose
//! `path_a` asks for three quarters of its malloc'd bytes and `path_b` a quarter, through malloc,
//! calloc, realloc and `new`, sizes from 16 B to 1 MiB, `path_b` on a second thread; then `path_m`
//! maps anonymous memory with mmap (64 KiB to 4 MiB) and mallocs 1 MiB blocks that glibc maps
//! itself, beside a file mapping, a reservation of address space (`PROT_NONE`) and (launched) a
//! failing mmap; it prints the bytes each path
//! asked for. The estimated bytes under each path, and under `path_m` for each function, are
//! within 10% of the truth, for a launched command (sampler library) and for `-p` (uprobes on libc
//! filtered by the BPF sampler): malloc's own mappings count once, as malloc, and the file,
//! reserved and failed mappings not at all. Every allocation stack is whole from `_start` to the program's call
//! and ends in `[alloc: FUNCTION]`, with no frame of the sampler itself; the allocation columns
//! reach folded, speedscope and pprof (`alloc_space`/`alloc_objects`, read by `go tool pprof`)
//! with the same totals.
#![cfg(target_os = "linux")]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rootline_profile::{FrameKind, Profile, pseudo};

#[path = "../../../tests/support/real_tools.rs"]
mod real_tools;

fn rootline() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rootline"))
}

/// Builds tests/c/alloc.cc.
fn build(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/alloc.cc");
    let binary = dir.join("allocs");
    let out = Command::new("g++")
        .args([
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-fno-inline",
            "-pthread",
            "-o",
        ])
        .arg(&binary)
        .arg(&source)
        .output()
        .expect("g++ runs (scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "g++ failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    binary
}

/// The bytes each path asked for, as the program printed them.
struct Truth {
    a: i64,
    b: i64,
    /// `path_m`'s anonymous mappings.
    m_mmap: i64,
    /// `path_m`'s 1 MiB mallocs.
    m_malloc: i64,
}

fn truth(stdout: &[u8]) -> Truth {
    let text = String::from_utf8_lossy(stdout);
    let value = |key: &str| -> i64 {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {text:?}"))
    };
    Truth {
        a: value("path_a "),
        b: value("path_b "),
        m_mmap: value("path_m_mmap "),
        m_malloc: value("path_m_malloc "),
    }
}

fn read(path: &Path) -> Profile {
    let file = std::fs::File::open(path).unwrap();
    let read = rootline_profile::read_rlp(std::io::BufReader::new(file)).unwrap();
    assert!(read.tail.is_none(), "{:?}", read.tail);
    read.profile
}

fn column(profile: &Profile, name: &str) -> usize {
    profile
        .sample_types()
        .iter()
        .position(|t| t.name == name)
        .unwrap_or_else(|| panic!("no {name} column: {:?}", profile.sample_types()))
}

/// Estimated bytes under `path_a`, `path_b`, `path_m` (by function) and in all, after checking
/// every allocation stack.
struct Attributed {
    a: i64,
    b: i64,
    m_mmap: i64,
    m_malloc: i64,
    total: i64,
}

fn check(profile: &Profile) -> Attributed {
    let (bytes, count, cpu) = (
        column(profile, "alloc-bytes"),
        column(profile, "alloc-count"),
        column(profile, "cpu"),
    );
    let samples = profile.samples();
    let mut got = Attributed {
        a: 0,
        b: 0,
        m_mmap: 0,
        m_malloc: 0,
        total: 0,
    };
    let mut leaves = std::collections::BTreeSet::new();
    let mut through_new = 0;
    let mut frames = Vec::new();
    for i in 0..samples.len() {
        let v = |c: usize| samples.values[c][i];
        if v(bytes) == 0 {
            assert_eq!(v(count), 0, "sample {i}");
            continue;
        }
        assert_eq!(v(cpu), 0, "sample {i}: an allocation takes no CPU time");
        assert!(v(count) >= 1 && v(bytes) >= 16 * v(count) / 2, "sample {i}");
        got.total += v(bytes);
        profile.stack_frames_root_first(samples.stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| profile.frame_name(f)).collect();
        assert!(
            frames
                .iter()
                .all(|&f| profile.frame(f).kind != FrameKind::Truncated),
            "whole stack: {names:?}"
        );
        assert!(
            !names.iter().any(|n| n.contains("rootline_alloc")
                || n.contains("librootline_alloc")
                || *n == "account"),
            "the sampler's frames are dropped: {names:?}"
        );
        let leaf = *names.last().unwrap();
        let function = pseudo::alloc_type_of(leaf)
            .unwrap_or_else(|| panic!("an allocation stack ends in its function: {names:?}"));
        assert!(
            pseudo::NATIVE_ALLOC_FUNCTIONS.contains(&function),
            "{names:?}"
        );
        assert_eq!(
            profile.frame(*frames.last().unwrap()).kind,
            FrameKind::Pseudo
        );
        // The main thread's stacks run from _start, the second thread's from clone3 through
        // start_thread; the dynamic loader runs the C++ runtime's initializers from its own
        // entry (_dl_start_user), before the program's _start.
        if names[0] == "_dl_start_user" {
            continue;
        }
        let entry = if names[0] == "_start" {
            let Some(main) = names.iter().position(|&n| n == "main") else {
                continue; // start-up allocations of the C++ runtime
            };
            main
        } else {
            assert!(names[0].ends_with("clone3"), "{names:?}");
            assert_eq!(names[1], "start_thread", "{names:?}");
            assert_eq!(names[2], "second(void*)", "{names:?}");
            2
        };
        let path = names[entry + 1];
        if entry != 2 && matches!(path, "printf" | "_IO_printf") {
            // `main` printing its results: stdio allocates stdout's buffer at the first write
            // (4 KiB, sampled now and then).
            assert_eq!(function, "malloc", "{names:?}");
            continue;
        }
        leaves.insert(function.to_string());
        if path.starts_with("path_m(") {
            // The program's call, then the function: an anonymous mapping or a 1 MiB malloc
            // (whose mapping glibc makes is not counted again); never the file mapping, the
            // reservation or the failed one.
            assert_eq!(names.len(), entry + 4, "{names:?}");
            match (names[entry + 2], function) {
                (call, "mmap") if call.starts_with("map_anonymous(") => got.m_mmap += v(bytes),
                (call, "malloc") if call.starts_with("big_malloc(") => got.m_malloc += v(bytes),
                _ => panic!("not an allocation of path_m: {names:?}"),
            }
            continue;
        }
        let expected = if entry == 2 { "path_b(" } else { "path_a(" };
        assert!(path.starts_with(expected), "{names:?}");
        assert_ne!(
            function, "mmap",
            "malloc's own mappings are not counted: {names:?}"
        );
        let allocate = names
            .iter()
            .position(|n| n.starts_with("allocate("))
            .unwrap_or_else(|| panic!("{names:?}"));
        assert_eq!(allocate, entry + 2, "{names:?}");
        // The program's call is the leaf's caller, or `new` is between them.
        let between = &names[allocate + 1..names.len() - 1];
        if !between.is_empty() {
            assert!(
                between.iter().all(|n| n.starts_with("operator new")),
                "{names:?}"
            );
            assert_eq!(function, "malloc", "{names:?}");
            through_new += 1;
        }
        if path.starts_with("path_a(") {
            got.a += v(bytes);
        } else if path.starts_with("path_b(") {
            got.b += v(bytes);
        } else {
            panic!("{names:?}");
        }
    }
    for f in ["malloc", "calloc", "realloc", "mmap"] {
        assert!(leaves.contains(f), "no {f} sample: {leaves:?}");
    }
    assert!(through_new > 0, "no allocation through operator new");
    got
}

fn assert_within_10_percent(got: &Attributed, truth: &Truth, what: &str) {
    let report: Vec<String> = [
        ("path_a", got.a, truth.a),
        ("path_b", got.b, truth.b),
        ("path_m mmap", got.m_mmap, truth.m_mmap),
        ("path_m malloc", got.m_malloc, truth.m_malloc),
    ]
    .iter()
    .map(|&(name, g, t)| {
        let off = (g - t) as f64 * 100.0 / t as f64;
        let mark = if off.abs() <= 10.0 { "" } else { " (off)" };
        format!("{name} {g} bytes estimated for {t} ({off:+.1}%){mark}")
    })
    .collect();
    assert!(
        !report.iter().any(|r| r.ends_with("(off)")),
        "{what}: {}",
        report.join(", ")
    );
    eprintln!("{what}: {}", report.join(", "));
}

#[test]
fn a_launched_command_s_bytes_are_attributed_to_their_true_paths() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build(dir.path());
    let out = dir.path().join("alloc.rlp");
    let run = rootline()
        .args(["record", "--alloc", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&binary)
        .output()
        .expect("rootline runs");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("rootline: allocations: "), "{stderr}");
    let truth = truth(&run.stdout);
    let profile = read(&out);
    assert_eq!(
        profile
            .metadata
            .extra
            .get("alloc.attach")
            .map(String::as_str),
        Some("preload")
    );
    let got = check(&profile);
    assert_within_10_percent(&got, &truth, "launched");
    // The library's calls were decided in the program: nothing trapped in vain.
    assert_eq!(
        profile.metadata.extra.get("alloc.unsampled_calls"),
        Some(&"0".to_string())
    );

    // report and folded count the estimated bytes.
    let report = rootline()
        .args(["report", "--value", "alloc-bytes"])
        .arg(&out)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(report.status.success(), "{report:?}");
    assert!(text.contains("counting alloc-bytes (bytes)"), "{text}");
    assert!(text.contains("path_a"), "{text}");
    let folded = dir.path().join("alloc.folded");
    let conv = rootline()
        .args(["convert", "--value", "alloc-bytes", "-o"])
        .arg(&folded)
        .arg(&out)
        .output()
        .unwrap();
    assert!(conv.status.success(), "{conv:?}");
    let text = std::fs::read_to_string(&folded).unwrap();
    let sum: i64 = text
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<i64>().unwrap())
        .sum();
    assert_eq!(sum, got.total);
    assert!(text.contains(";[alloc: calloc] "), "{text}");

    // speedscope: a profile per allocation column with the same bytes.
    let json = dir.path().join("alloc.speedscope.json");
    let conv = rootline()
        .arg("convert")
        .arg(&out)
        .arg("-o")
        .arg(&json)
        .output()
        .unwrap();
    assert!(conv.status.success(), "{conv:?}");
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let speedscope_bytes: i64 = file["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["unit"] == "bytes")
        .flat_map(|p| p["weights"].as_array().unwrap().iter())
        .map(|w| w.as_i64().unwrap())
        .sum();
    assert_eq!(speedscope_bytes, got.total);

    // pprof: Go's allocation sample types, read by go tool pprof with the same bytes.
    if !real_tools::available("go", &["version"], "apt-get install golang-go") {
        return;
    }
    let pprof = dir.path().join("alloc.pb.gz");
    let conv = rootline()
        .arg("convert")
        .arg(&out)
        .arg("-o")
        .arg(&pprof)
        .output()
        .unwrap();
    assert!(conv.status.success(), "{conv:?}");
    let raw = Command::new("go")
        .args(["tool", "pprof", "-raw", "-symbolize=none"])
        .arg(&pprof)
        .output()
        .unwrap();
    assert!(raw.status.success(), "{raw:?}");
    let text = String::from_utf8(raw.stdout).unwrap();
    let samples = text.split_once("Samples:\n").unwrap().1;
    let header: Vec<&str> = samples.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "samples/count",
            "cpu/nanoseconds",
            "alloc_space/bytes",
            "alloc_objects/count"
        ]
    );
    let go_bytes: i64 = samples
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .filter_map(|(values, _)| {
            let v: Vec<i64> = values
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            (v.len() == 4).then(|| v[2])
        })
        .sum();
    assert_eq!(go_bytes, got.total);
    // A native allocation's frame names the function called, not a type: no allocated_type.
    let tags = Command::new("go")
        .args(["tool", "pprof", "-sample_index=alloc_space", "-tags"])
        .arg(&pprof)
        .output()
        .unwrap();
    assert!(tags.status.success(), "{tags:?}");
    let text = String::from_utf8_lossy(&tags.stdout);
    assert!(!text.contains("allocated_type"), "{text}");
}

#[test]
fn anonymous_mappings_below_the_minimum_are_not_counted() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build(dir.path());
    let out = dir.path().join("min.rlp");
    // Every anonymous mapping of path_m is shorter than 4 MiB.
    let run = rootline()
        .args(["record", "--alloc", "--alloc-mmap-min", "4194304", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&binary)
        .output()
        .expect("rootline runs");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let profile = read(&out);
    let bytes = column(&profile, "alloc-bytes");
    let samples = profile.samples();
    let mut leaves = std::collections::BTreeSet::new();
    for i in 0..samples.len() {
        if samples.values[bytes][i] == 0 {
            continue;
        }
        let leaf = profile.frame_name(profile.stack(samples.stacks[i]).frame);
        leaves.insert(leaf.to_string());
    }
    assert!(leaves.contains("[alloc: malloc]"), "{leaves:?}");
    assert!(!leaves.contains("[alloc: mmap]"), "{leaves:?}");
}

/// Waits for `process` to end and returns its output (its pipes read meanwhile); past `limit`
/// kills it and fails with where it was (a hang here is a defect of the recorder or of what it
/// did to its target).
fn finish_within(process: Child, limit: Duration, what: &str) -> Output {
    let pid = process.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(process.wait_with_output()));
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("an ended process is reaped"),
        Err(_) => {
            let state = |file: &str| std::fs::read_to_string(format!("/proc/{pid}/{file}"));
            let status = state("status").unwrap_or_default();
            let stack = state("stack").unwrap_or_default();
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            let stderr = rx
                .recv_timeout(Duration::from_secs(10))
                .ok()
                .and_then(Result::ok)
                .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                .unwrap_or_default();
            panic!(
                "{what} (pid {pid}) did not end within {limit:?}; killed.\n{}\nkernel stack:\n{stack}\nstderr:\n{stderr}",
                status.lines().take(3).collect::<Vec<_>>().join("\n"),
            );
        }
    }
}

/// perf events the process `pid` holds open.
fn perf_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l.to_string_lossy().contains("perf_event"))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn a_running_process_recorded_with_p_is_attributed_the_same_way() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build(dir.path());
    let mut child = Command::new(&binary)
        .arg("wait")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = dir.path().join("p.rlp");
    let mut recorder = rootline()
        .args(["record", "--alloc", "-o"])
        .arg(&out)
        .arg("-p")
        .arg(child.id().to_string())
        .stderr(Stdio::piped())
        .spawn()
        .expect("rootline runs");
    // Start the program once the recorder's events are all open: their number stops growing.
    let ready_by = Instant::now() + Duration::from_secs(120);
    let (mut last, mut stable) = (0, 0);
    while stable < 10 {
        std::thread::sleep(Duration::from_millis(100));
        if Instant::now() > ready_by || recorder.try_wait().ok().flatten().is_some() {
            let _ = child.kill();
            let _ = child.wait();
            let run = finish_within(recorder, Duration::from_secs(5), "the recorder");
            panic!(
                "the recorder did not open its events ({} perf fds): {:?}\n{}",
                last,
                run.status,
                String::from_utf8_lossy(&run.stderr)
            );
        }
        let now = perf_fds(recorder.id());
        (last, stable) = if now == last && now > 0 {
            (now, stable + 1)
        } else {
            (now, 0)
        };
    }
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let done = finish_within(child, Duration::from_secs(120), "the program under -p");
    assert!(done.status.success());
    let run = finish_within(recorder, Duration::from_secs(120), "the recorder");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let profile = read(&out);
    // The BPF sampler decided in the kernel: no call reached user space in vain.
    assert_eq!(
        profile
            .metadata
            .extra
            .get("alloc.attach")
            .map(String::as_str),
        Some("uprobe-bpf"),
        "{stderr}"
    );
    assert_eq!(
        profile.metadata.extra.get("alloc.unsampled_calls"),
        Some(&"0".to_string())
    );
    let got = check(&profile);
    assert_within_10_percent(&got, &truth(&done.stdout), "-p");
}
