//! `rootline record --off-cpu` against ground truth: a C program (tests/c/off_cpu.c) whose main
//! thread spends half its wall time computing in `compute` and half blocked in `wait_for_data`
//! (sleeping in `nap`, then reading a pipe in `read_data` that a feeder thread fills slowly).
//! Each function's share of the main thread's wall-clock time is within 5 points of the truth,
//! every off-CPU stack is whole (from `_start` to the blocking call) and says truly why the thread
//! left, and `go tool pprof` reads the off-CPU sample type.
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::process::Command;

use rootline_profile::{FrameKind, Profile, pseudo};

#[path = "../../../tests/support/real_tools.rs"]
mod real_tools;

/// Half of each round, in milliseconds: `compute` spins this long, `wait_for_data` blocks as long.
const HALF_MS: u64 = 60;

fn rootline() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rootline"))
}

/// Builds tests/c/off_cpu.c with `rounds` rounds.
fn build(dir: &Path, rounds: u32) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/off_cpu.c");
    let binary = dir.join("offcpu");
    let out = Command::new("cc")
        .args([
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-fno-inline",
            "-pthread",
        ])
        .arg(format!("-DROUNDS={rounds}"))
        .arg(format!("-DHALF_MS={HALF_MS}"))
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .output()
        .expect("cc runs (scripts/test.sh installs gcc)");
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    binary
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
        .position(|t| t.name == name && t.unit == "nanoseconds")
        .unwrap_or_else(|| panic!("no {name} column: {:?}", profile.sample_types()))
}

/// Wall-clock nanoseconds of the main thread of process `pid` in total and under each of `names`.
struct MainThread {
    total: i64,
    under: Vec<i64>,
}

/// Checks every sample's columns (wall = cpu + off_cpu) and the main thread's stacks, and sums
/// its wall time under `compute` and `wait_for_data`.
fn check(profile: &Profile) -> MainThread {
    let (cpu, off, wall) = (
        column(profile, "cpu"),
        column(profile, "off_cpu"),
        column(profile, "wall"),
    );
    let samples = profile.samples();
    let main = profile
        .threads()
        .iter()
        .position(|t| t.pid == t.tid && profile.process_name(t.pid) == Some("offcpu"))
        .expect("the program's main thread was recorded");
    let mut result = MainThread {
        total: 0,
        under: vec![0, 0],
    };
    let (mut blocked_in_wait, mut off_in_wait) = (0i64, 0i64);
    let mut frames = Vec::new();
    for i in 0..samples.len() {
        let v = |c: usize| samples.values[c][i];
        assert_eq!(v(wall), v(cpu) + v(off), "sample {i}: wall = cpu + off_cpu");
        assert!(
            v(cpu) == 0 || v(off) == 0,
            "sample {i} is on or off the CPU"
        );
        if samples.threads[i].index() != main {
            continue;
        }
        result.total += v(wall);
        profile.stack_frames_root_first(samples.stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| profile.frame_name(f)).collect();
        let leaf = *names.last().unwrap();
        assert!(
            frames
                .iter()
                .all(|&f| profile.frame(f).kind != FrameKind::Truncated),
            "whole stack: {names:?}"
        );
        let at = |name: &str| names.iter().position(|&n| n == name);
        if leaf == pseudo::OFF_CPU_SHORT {
            assert_eq!(names.len(), 1, "{names:?}");
            continue;
        }
        // Every stack of the main thread runs from _start through main.
        assert_eq!(names[0], "_start", "{names:?}");
        let Some(main_at) = at("main") else {
            // Before main: the dynamic loader and libc start-up.
            continue;
        };
        let is_off = v(off) > 0;
        assert_eq!(
            is_off,
            pseudo::is_off_cpu_name(leaf),
            "an off-CPU stack ends in its reason, a CPU stack in code: {names:?}"
        );
        if let Some(c) = at("compute") {
            assert_eq!(c, main_at + 1, "{names:?}");
            // compute never blocks (clock_gettime is the vDSO's): off the CPU, it was preempted.
            if is_off {
                assert_eq!(leaf, pseudo::OFF_CPU_PREEMPTED, "{names:?} {}", v(off));
            }
            result.under[0] += v(wall);
        }
        if let Some(w) = at("wait_for_data") {
            assert_eq!(w, main_at + 1, "{names:?}");
            if is_off {
                // Asleep in nap → sleep_ms → nanosleep, or waiting in read_data → read.
                let next = names[w + 1];
                assert!(next == "nap" || next == "read_data", "{names:?}");
                if next == "nap" {
                    assert_eq!(names.get(w + 2), Some(&"sleep_ms"), "{names:?}");
                    assert!(
                        names[w + 3..].iter().any(|n| n.contains("nanosleep")),
                        "{names:?}"
                    );
                } else {
                    assert!(
                        names[w + 2..]
                            .iter()
                            .any(|n| n.contains("read") || n.contains("write")),
                        "{names:?}"
                    );
                }
                off_in_wait += v(off);
                if leaf == pseudo::OFF_CPU_BLOCKED {
                    blocked_in_wait += v(off);
                }
            }
            result.under[1] += v(wall);
        }
    }
    // The thread left of its own accord: nearly all that time is marked blocked.
    assert!(
        blocked_in_wait * 10 >= off_in_wait * 9,
        "blocked {blocked_in_wait} of {off_in_wait} ns off the CPU in wait_for_data"
    );
    result
}

fn assert_halves(main: &MainThread, what: &str) {
    let share = |ns: i64| ns as f64 * 100.0 / main.total as f64;
    let (compute, wait) = (share(main.under[0]), share(main.under[1]));
    assert!(
        (compute - 50.0).abs() <= 5.0 && (wait - 50.0).abs() <= 5.0,
        "{what}: compute {compute:.1}%, wait_for_data {wait:.1}% of {} ns of wall-clock time",
        main.total
    );
}

#[test]
fn a_launched_command_s_wall_clock_time_splits_into_its_true_halves() {
    let dir = tempfile::tempdir().unwrap();
    let rounds = 12;
    let binary = build(dir.path(), rounds);
    let out = dir.path().join("off.rlp");
    let run = rootline()
        .args(["record", "--off-cpu", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&binary)
        .output()
        .expect("rootline runs");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("rootline: off-CPU: "), "{stderr}");
    let profile = read(&out);
    let main = check(&profile);
    assert_halves(&main, "launched");
    // The whole run is there: at least the time the program is sure to take.
    let least = i64::from(rounds) * 2 * HALF_MS as i64 * 1_000_000;
    assert!(main.total >= least, "{} < {least}", main.total);
    let extra = &profile.metadata.extra;
    assert!(extra.contains_key("off_cpu.below_min"), "{extra:?}");

    // report counts wall-clock time under its documented name.
    let report = rootline()
        .args(["report", "--value", "wall-ns"])
        .arg(&out)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(report.status.success(), "{report:?}");
    assert!(text.contains("counting wall (nanoseconds)"), "{text}");
    assert!(text.contains("  off-CPU: "), "{text}");
    assert!(text.contains("wait_for_data"), "{text}");

    // Folded output of one column carries exactly that column's total.
    let off = column(&profile, "off_cpu");
    let off_total: i64 = profile.samples().values[off].iter().sum();
    let folded = dir.path().join("off.folded");
    let conv = rootline()
        .args(["convert", "--value", "off-cpu-ns", "-o"])
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
    assert_eq!(sum, off_total);
    assert!(text.contains(";read_data;"), "{text}");

    // speedscope gets one profile per time column, each thread's named after it.
    let json = dir.path().join("off.speedscope.json");
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
    let mut speedscope_off = 0i64;
    for p in file["profiles"].as_array().unwrap() {
        if p["name"].as_str().unwrap().ends_with(" — off_cpu") {
            assert_eq!(p["unit"], "nanoseconds");
            for w in p["weights"].as_array().unwrap() {
                speedscope_off += w.as_i64().unwrap();
            }
        }
    }
    assert_eq!(speedscope_off, off_total);

    // go tool pprof reads both time sample types, with the same off-CPU total.
    if !real_tools::available("go", &["version"], "apt-get install golang-go") {
        return;
    }
    let pprof = dir.path().join("off.pb.gz");
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
            "off_cpu/nanoseconds",
            "wall/nanoseconds"
        ]
    );
    // Sample lines are `v1 v2 v3 v4: locations`; label lines below them are not numbers.
    let go_off: i64 = samples
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
    assert_eq!(go_off, off_total);
}

#[test]
fn a_running_process_recorded_with_p_splits_the_same_way() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build(dir.path(), 40);
    let mut child = Command::new(&binary).spawn().unwrap();
    // Let it reach its loop, then record a whole number of rounds' worth of time.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = dir.path().join("p.rlp");
    let run = rootline()
        .args(["record", "--off-cpu", "--duration", "1.2", "-o"])
        .arg(&out)
        .arg("-p")
        .arg(child.id().to_string())
        .output()
        .expect("rootline runs");
    let _ = child.kill();
    let _ = child.wait();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let main = check(&read(&out));
    assert_halves(&main, "-p");
}
