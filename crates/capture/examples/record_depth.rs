//! Records a running `tests/c/deep.c` program by PID and prints one line for the depth benchmark
//! (scripts/bench-depth.sh): the fraction of complete stacks among samples taken in its leaf, the
//! recorder's CPU per sample, its peak RSS, truncations by reason and live-memory reads.
//!
//! Usage: record_depth PID SECONDS DEPTH [FREQUENCY_HZ] [LIVE_BUDGET_BYTES]

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use rootline_capture::recorder::{RecordOptions, Target, record};

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: record_depth PID SECONDS DEPTH [FREQUENCY_HZ] [LIVE_BUDGET_BYTES]");
        std::process::exit(1);
    }
    let parse = |i: usize, what: &str| -> u64 {
        args[i].parse().unwrap_or_else(|_| {
            eprintln!("{what} must be a number, got {:?}", args[i]);
            std::process::exit(1)
        })
    };
    let pid = parse(0, "PID") as u32;
    let seconds = parse(1, "SECONDS");
    let depth = parse(2, "DEPTH") as usize;
    let mut opts = RecordOptions::new(Target::Pids(vec![pid]));
    opts.duration = Some(Duration::from_secs(seconds));
    if args.len() > 3 {
        opts.frequency_hz = parse(3, "FREQUENCY_HZ") as u32;
    }
    if args.len() > 4 {
        opts.live_stack_budget = parse(4, "LIVE_BUDGET_BYTES") as usize;
    }
    // USER_CALLCHAIN=0 turns the kernel callchain cross-check off (to measure its cost).
    if std::env::var("USER_CALLCHAIN").is_ok_and(|v| v == "0") {
        opts.user_callchain = false;
    }
    let cpu0 = cpu_seconds();
    let stop = AtomicBool::new(false);
    let recording = match record(&opts, &stop, None) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("recording failed: {e}");
            std::process::exit(e.exit_code());
        }
    };
    let cpu = cpu_seconds() - cpu0;
    let p = &recording.profile;
    let (mut in_leaf, mut complete) = (0u64, 0u64);
    let mut frames = Vec::new();
    for i in 0..p.samples().len() {
        p.stack_frames_root_first(p.samples().stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| p.frame_name(f)).collect();
        if !names.contains(&"spin") {
            continue;
        }
        in_leaf += 1;
        let rooted = names
            .first()
            .is_some_and(|n| *n == "_start" || n.ends_with("clone3"));
        let recursion = names.iter().filter(|&&n| n == "recurse").count();
        if rooted && recursion == depth {
            complete += 1;
        }
    }
    let samples = recording.stats.samples.max(1);
    println!(
        "depth={depth} samples={} in_leaf={in_leaf} complete={:.4} cpu_us_per_sample={:.1} peak_rss_mib={:.1} lost={} truncated={:?} live_bytes_per_sample={} callchain={:?} outer_cache={:?}",
        recording.stats.samples,
        complete as f64 / in_leaf.max(1) as f64,
        cpu * 1e6 / samples as f64,
        peak_rss_kib() as f64 / 1024.0,
        recording.stats.lost,
        recording.stats.truncated,
        recording.stats.live.bytes / samples,
        recording.stats.callchain,
        recording.stats.outer_cache,
    );
}
