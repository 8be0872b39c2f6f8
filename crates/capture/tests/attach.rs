//! Attach to a running multi-threaded program: threads created before and after the attach all
//! appear in the profile, and the program is never stopped (no thread is ever seen in a stopped
//! state while the profiler attaches; the program's own loop timing is printed).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use rootline_capture::recorder::{RecordOptions, Target, record};

fn build_target() -> std::path::PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("attach_target");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/attach_target.c");
    let status = Command::new("cc")
        .args(["-O1", "-g", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-lpthread")
        .status()
        .expect("cc runs");
    assert!(status.success());
    out
}

/// States (`/proc/PID/task/*/stat` field 3) of every thread of `pid`.
fn thread_states(pid: u32) -> Vec<char> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let stat = std::fs::read_to_string(e.ok()?.path().join("stat")).ok()?;
        stat.rsplit_once(')')?.1.trim_start().chars().next()
    })
    .collect()
}

#[test]
fn attach_sees_every_thread_and_never_stops_the_target() {
    let binary = build_target();
    let mut child = Command::new(&binary)
        .arg("4")
        .stdout(Stdio::piped())
        .spawn()
        .expect("target starts");
    let pid = child.id();
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("target says ready");
    assert_eq!(line.trim(), "ready");

    // Watch the target's thread states while the recorder attaches.
    let watcher = std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_millis(1500);
        let mut observations = 0u64;
        let mut stopped = Vec::new();
        while Instant::now() < until {
            for state in thread_states(pid) {
                observations += 1;
                if matches!(state, 'T' | 't') {
                    stopped.push(state);
                }
            }
        }
        (observations, stopped)
    });
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1000));
        // Late threads: created after the recorder attached.
        let status = Command::new("kill")
            .args(["-USR1", &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    });

    let mut opts = RecordOptions::new(Target::Pids(vec![pid]));
    opts.frequency_hz = 999;
    opts.duration = Some(Duration::from_secs(3));
    let stop = AtomicBool::new(false);
    let recording = record(&opts, &stop, None).expect("attach works");
    late.join().expect("signal sent");
    let (observations, stopped) = watcher.join().expect("watcher ends");

    let mut report = Vec::new();
    for l in stdout.lines() {
        report.push(l.expect("target output"));
    }
    assert!(child.wait().expect("target exits").success());
    println!(
        "thread-state observations during attach: {observations}, stopped: {}",
        stopped.len()
    );
    let profile = &recording.profile;
    let mut samples_per_tid = std::collections::HashMap::new();
    for t in &profile.samples().threads {
        *samples_per_tid
            .entry(profile.thread(*t).tid)
            .or_insert(0u64) += 1;
    }
    let mut workers = 0;
    for l in &report {
        // "tid <tid> iterations <n> max_gap_us <us>"
        let f: Vec<&str> = l.split_whitespace().collect();
        let tid: u32 = f[1].parse().expect("tid");
        let n = samples_per_tid.get(&tid).copied().unwrap_or(0);
        println!("{l} samples {n}");
        assert!(n > 0, "thread {tid} has no samples");
        workers += 1;
    }
    assert_eq!(workers, 4, "four workers reported");
    assert!(observations > 0);
    assert!(
        stopped.is_empty(),
        "target threads seen stopped: {stopped:?}"
    );
    println!(
        "samples={} threads={} lost={} truncated={}",
        recording.stats.samples,
        recording.stats.threads,
        recording.stats.lost,
        recording.stats.truncated_total()
    );
    assert_eq!(recording.stats.truncated_total(), 0);
}
