//! Shared pieces of the JIT runtime tests: finding tools, running a target that prints `ready`,
//! recording it, and checking every stack against the target's known call graph.

#![allow(dead_code)]

pub mod dotnet;
pub mod node;

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use rootline_capture::recorder::{RecordOptions, Recording, Target, record};
use rootline_profile::{FrameKind, Profile};

/// One recording at a time: they sample at a high rate on a machine with few cores.
pub static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A tool on PATH.
pub fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    })
}

/// Returns `found` or, when missing, prints why the test is skipped (panics under `CI`, where
/// scripts/test.sh installs everything).
pub fn require<T>(test: &str, what: &str, found: Option<T>) -> Option<T> {
    if found.is_none() {
        let msg = format!("{test}: needs {what}");
        if std::env::var_os("CI").is_some() {
            panic!("{msg}");
        }
        eprintln!("skipping {msg}");
    }
    found
}

/// The directory of this file's sources (C#, JS, Java targets).
pub fn sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/jit")
}

/// A runtime test's set-up: it holds the recording lock (one recording at a time) and a scratch
/// directory for compiled targets and the files runtimes write into their working directory.
pub struct Setup {
    /// The scratch directory (removed when dropped).
    pub dir: tempfile::TempDir,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Setup {
    /// Takes the lock and makes the directory.
    pub fn new() -> Setup {
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        Setup {
            dir: tempfile::tempdir().expect("a scratch directory"),
            _serial: serial,
        }
    }

    /// The scratch directory's path.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// How a target is recorded.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    /// Sampling frequency.
    pub hz: u32,
    /// Recording length.
    pub seconds: f64,
    /// Stack bytes copied per sample, in KiB.
    pub stack_kib: u32,
}

/// Records `pid` at `rate` and checks every stack against `graph`, again (up to four
/// recordings in all) until at least `min_program_samples` samples were in the program — on a
/// busy machine the target gets less CPU and so fewer samples per second. Prints the counts
/// under `what`, asserts the minimum, and returns the last recording with the verdict over all.
pub fn record_and_check(
    what: &str,
    pid: u32,
    rate: Rate,
    graph: &Graph<'_>,
    min_program_samples: u64,
) -> (Recording, Verdict) {
    let mut total = Verdict::default();
    let mut recordings = 0;
    loop {
        let recording = record_pid(pid, rate.hz, rate.seconds, rate.stack_kib);
        total.add(check(&recording.profile, graph));
        recordings += 1;
        if total.program_samples >= min_program_samples || recordings == 4 {
            total.print(&format!("{what} ({recordings} recording(s))"));
            assert!(
                total.program_samples >= min_program_samples,
                "{what}: {} program samples, want at least {min_program_samples}",
                total.program_samples
            );
            return (recording, total);
        }
    }
}

/// A running target, killed when dropped.
pub struct Running {
    /// The process.
    pub child: Child,
}

impl Running {
    /// Starts `cmd` and waits until it prints `ready` on stdout.
    pub fn start(mut cmd: Command) -> Running {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.trim() == "ready"
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(());
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(120))
            .expect("the target prints ready");
        Running { child }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The runtimes leave their maps behind; the pids will be reused.
        let pid = self.pid();
        for name in [format!("perf-{pid}.map"), format!("perfinfo-{pid}.map")] {
            let _ = std::fs::remove_file(Path::new("/tmp").join(name));
        }
    }
}

/// Records `pid` for `seconds` at `hz`, copying `stack_kib` KiB of stack per sample.
pub fn record_pid(pid: u32, hz: u32, seconds: f64, stack_kib: u32) -> Recording {
    let mut opts = RecordOptions::new(Target::Pids(vec![pid]));
    opts.frequency_hz = hz;
    opts.stack_bytes = stack_kib * 1024;
    opts.duration = Some(Duration::from_secs_f64(seconds));
    let r = record(&opts, &AtomicBool::new(false), None).expect("recording works");
    println!(
        "recorded pid {pid} at {hz} Hz for {seconds} s: {} samples, {} lost, {} threads",
        r.stats.samples, r.stats.lost, r.stats.threads
    );
    r
}

/// The recursive function, the function at the bottom of the recursion, and by entry function
/// the number of recursive frames expected above it.
pub type Recursion = (&'static str, &'static str, Vec<(&'static str, usize)>);

/// A target's known call graph.
pub struct Graph<'a> {
    /// Maps a frame's name to the program function it is, or None for anything else.
    pub short: &'a dyn Fn(&str) -> Option<&'static str>,
    /// Functions a thread's program part starts at (`Main`, a worker's entry).
    pub entries: &'a [&'static str],
    /// Caller → callee pairs that exist in the program.
    pub edges: &'a [(&'static str, &'static str)],
    /// The recursive function and, by entry, how many times it is on the stack when the
    /// function at the bottom of the recursion is.
    pub recursion: Option<Recursion>,
    /// Whether a frame name is a thread's root (`_start`, `clone3`, …).
    pub is_root: &'a dyn Fn(&str) -> bool,
}

/// What a check found.
#[derive(Debug, Default)]
pub struct Verdict {
    /// All samples.
    pub samples: u64,
    /// Samples with program frames.
    pub program_samples: u64,
    /// Program samples with an unnamed JIT frame between program frames.
    pub unnamed: u64,
    /// Program samples with a foreign frame between program frames.
    pub invented: u64,
    /// Program samples with a caller edge the program does not have.
    pub impossible_edges: u64,
    /// Program samples, not marked truncated, whose program part does not start at an entry.
    pub not_reaching_entry: u64,
    /// Program samples, not marked truncated, whose stack does not start at a thread root: a
    /// silent cut.
    pub not_rooted: u64,
    /// Program samples ending in `[truncated: …]`.
    pub truncated: u64,
    /// Of those, the known V8 case (see [`Verdict::assert_whole_and_true`]).
    pub known_v8_cut: u64,
    /// Program samples below the recursion with the wrong recursion count.
    pub wrong_recursion: u64,
    /// Program samples below the recursion with the right recursion count.
    pub exact_recursion: u64,
    /// Program frames by kind.
    pub kinds: BTreeMap<String, u64>,
    /// A few bad stacks, for the log.
    pub examples: Vec<String>,
}

impl Verdict {
    /// Asserts the promise on every program sample: no impossible caller edge, no invented or
    /// unnamed frame, every stack reaching its entry and the thread root, and the exact recursion
    /// count wherever one is expected. A stack may stop short only with an explicit
    /// `[truncated: …]` frame, and only rarely: at most 1 in 10,000 program samples, besides a
    /// known, still unexplained case in node: a leaf in a `Builtins_Call_*` builtin under the
    /// first JS frame, whose caller's return address lies in no mapping (`not-after-call`). It
    /// comes a handful of times per recording whatever the sample count (4–12 in 55,000–235,000
    /// samples at 20 kHz), so it is bounded by count, at most 32.
    #[track_caller]
    pub fn assert_whole_and_true(&self) {
        assert_eq!(self.impossible_edges, 0, "impossible caller edges");
        assert_eq!(self.invented, 0, "invented frames");
        assert_eq!(self.unnamed, 0, "unnamed frames");
        assert_eq!(
            self.not_reaching_entry, 0,
            "unmarked stacks not reaching the entry"
        );
        assert_eq!(
            self.not_rooted, 0,
            "unmarked stacks not reaching the thread root"
        );
        assert!(
            (self.truncated - self.known_v8_cut) * 10_000 <= self.program_samples,
            "{} of {} stacks truncated (besides {} of the known V8 case)",
            self.truncated - self.known_v8_cut,
            self.program_samples,
            self.known_v8_cut
        );
        assert!(
            self.known_v8_cut <= 32,
            "{} stacks of the known V8 case",
            self.known_v8_cut
        );
        assert_eq!(self.wrong_recursion, 0, "wrong recursion counts");
    }

    /// Adds the counts of another check.
    pub fn add(&mut self, other: Verdict) {
        self.samples += other.samples;
        self.program_samples += other.program_samples;
        self.unnamed += other.unnamed;
        self.invented += other.invented;
        self.impossible_edges += other.impossible_edges;
        self.not_reaching_entry += other.not_reaching_entry;
        self.not_rooted += other.not_rooted;
        self.truncated += other.truncated;
        self.known_v8_cut += other.known_v8_cut;
        self.wrong_recursion += other.wrong_recursion;
        self.exact_recursion += other.exact_recursion;
        for (k, n) in other.kinds {
            *self.kinds.entry(k).or_default() += n;
        }
        self.examples.extend(other.examples);
    }

    /// Prints the counts.
    pub fn print(&self, what: &str) {
        println!(
            "{what}: samples={} program_samples={} impossible_edges={} invented={} unnamed={} \
             not_reaching_entry={} not_rooted={} truncated={} (known V8 case {}) \
             exact_recursion={} wrong_recursion={} kinds={:?}",
            self.samples,
            self.program_samples,
            self.impossible_edges,
            self.invented,
            self.unnamed,
            self.not_reaching_entry,
            self.not_rooted,
            self.truncated,
            self.known_v8_cut,
            self.exact_recursion,
            self.wrong_recursion,
            self.kinds
        );
        for e in &self.examples {
            println!("  {e}");
        }
    }
}

/// Checks every sample of `profile` against `graph`.
pub fn check(profile: &Profile, graph: &Graph<'_>) -> Verdict {
    let edges: HashSet<(&str, &str)> = graph.edges.iter().copied().collect();
    let mut v = Verdict::default();
    let mut frames = Vec::new();
    let samples = profile.samples();
    for i in 0..samples.len() {
        v.samples += 1;
        profile.stack_frames_root_first(samples.stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| profile.frame_name(f)).collect();
        let short: Vec<Option<&str>> = names.iter().map(|n| (graph.short)(n)).collect();
        let Some(first) = short.iter().position(Option::is_some) else {
            continue;
        };
        let last = short.iter().rposition(Option::is_some).unwrap_or(first);
        v.program_samples += 1;
        for j in first..=last {
            if short[j].is_some() {
                let kind = format!("{:?}", profile.frame(frames[j]).kind);
                *v.kinds.entry(kind).or_default() += 1;
            }
        }
        let mut bad: Option<&str> = None;
        if names.iter().any(|n| n.starts_with("[truncated"))
            || frames
                .iter()
                .any(|&f| profile.frame(f).kind == FrameKind::Truncated)
        {
            // The truncation frame says why the stack stops short of its entry and root.
            v.truncated += 1;
            if let [cut, _, leaf] = names.as_slice()
                && *cut == "[truncated: not-after-call]"
                && leaf.starts_with("Builtins_Call_")
            {
                v.known_v8_cut += 1;
            }
            bad.get_or_insert("truncated");
        } else {
            if !(graph.is_root)(names[0]) {
                v.not_rooted += 1;
                bad.get_or_insert("not rooted");
            }
            if !graph.entries.contains(&short[first].unwrap_or("")) {
                v.not_reaching_entry += 1;
                bad.get_or_insert("not reaching an entry");
            }
        }
        let foreign: Vec<usize> = (first..=last).filter(|&j| short[j].is_none()).collect();
        if foreign
            .iter()
            .any(|&j| names[j].starts_with('[') || names[j].contains("+0x"))
        {
            v.unnamed += 1;
            bad.get_or_insert("unnamed");
        } else if !foreign.is_empty() {
            v.invented += 1;
            bad.get_or_insert("invented");
        }
        let program: Vec<&str> = (first..=last).filter_map(|j| short[j]).collect();
        if program.windows(2).any(|w| !edges.contains(&(w[0], w[1]))) {
            v.impossible_edges += 1;
            // The worst finding: it names the example even when the stack is also cut.
            bad = Some("impossible edge");
        }
        if let Some((recursive, leaf, counts)) = &graph.recursion
            && program.contains(leaf)
            && let Some(&(_, want)) = counts.iter().find(|(e, _)| Some(*e) == short[first])
        {
            let got = program.iter().filter(|&n| n == recursive).count();
            if got == want {
                v.exact_recursion += 1;
            } else {
                v.wrong_recursion += 1;
                bad.get_or_insert("wrong recursion count");
            }
        }
        if let Some(why) = bad
            && v.examples.iter().filter(|e| e.starts_with(why)).count() < 2
        {
            let mut shown: Vec<String> = Vec::new();
            let mut k = 0;
            while k < names.len() {
                let mut n = 1;
                while k + n < names.len() && names[k + n] == names[k] {
                    n += 1;
                }
                shown.push(if n > 1 {
                    format!("{} x{n}", names[k])
                } else {
                    names[k].to_string()
                });
                k += n;
            }
            v.examples.push(format!("{why}: {}", shown.join(";")));
            if why == "impossible edge" || why == "truncated" {
                // Where each frame was (address, whether read live), to tell which
                // instruction's rule went wrong or where the stack was cut.
                let at: Vec<String> = (0..names.len())
                    .map(|j| {
                        let f = profile.frame(frames[j]);
                        let live = if f.from_live_memory { " live" } else { "" };
                        format!("{}@{:#x}{live}", short[j].unwrap_or("?"), f.address)
                    })
                    .collect();
                v.examples.push(format!("  at: {}", at.join(";")));
            }
        }
    }
    v
}

/// Thread roots as the C library and the dynamic loader make them.
pub fn is_native_root(name: &str) -> bool {
    matches!(name, "_start" | "_dl_start_user") || name.ends_with("clone3") || name == "clone"
}

/// The first child of `pid` (unshare --fork runs the command as its child).
pub fn child_of(pid: u32) -> u32 {
    let t0 = std::time::Instant::now();
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(c) = children.split_whitespace().next() {
            return c.parse().unwrap();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "unshare has no child"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `dir` (the target's files, in the repository or its target directory) stays visible
/// to a target that mounts a private `/tmp`; when the repository itself lies under `/tmp`, the
/// test is skipped with the reason printed.
pub fn visible_beside_private_tmp(test: &str, dir: &Path) -> bool {
    let visible = !dir.starts_with("/tmp");
    if !visible {
        eprintln!(
            "skipping {test}: {} lies under /tmp, which the target's private /tmp hides (clone the \
             repository elsewhere to run it)",
            dir.display()
        );
    }
    visible
}

/// Starts `program args…` as pid 1 of a new PID and mount namespace with its own `/tmp` (a
/// private tmpfs, as in a container), from `dir`, with `env` added. Returns the running `unshare` and the
/// target's pid as seen from here, after checking that the target is pid 1 in there.
pub fn start_in_namespace(
    unshare: &Path,
    dir: &Path,
    program: &Path,
    args: &[std::ffi::OsString],
    env: &[(&str, &str)],
) -> (Running, u32) {
    let mut cmd = Command::new(unshare);
    cmd.current_dir(dir)
        .envs(env.iter().copied())
        .args(["--fork", "--pid", "--mount-proc", "--mount", "sh", "-c"])
        .arg("mount -t tmpfs rootline-private-tmp /tmp && exec \"$@\"")
        .arg("sh")
        .arg(program)
        .args(args);
    let target = Running::start(cmd);
    let pid = child_of(target.pid());
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let nspid = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>();
    assert_eq!(nspid.len(), 2, "the target is in a child PID namespace");
    assert_eq!(nspid[1], "1");
    (target, pid)
}
