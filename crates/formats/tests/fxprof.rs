//! Firefox Profiler processed profiles: our `.fxprof.json` read back (per-thread stacks and
//! weights equal ours, the version fields the profiler requires, categories per frame kind), and
//! loaded by the Firefox Profiler's own code: its `profiler-cli` (npm
//! `@firefox-devtools/profiler-cli`, the profiler's loading and call-tree code bundled for node;
//! installed in `tests/js-fxprof` by `scripts/test.sh`), whose per-thread sample totals and
//! per-function totals must equal ours.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use rootline_formats::fxprof;
use rootline_profile::{FrameKind, Profile, SampleType, ThreadId};
use serde_json::Value;

/// A stack's frames, root first: (name, kind).
type Frames<'a> = &'a [(&'a str, FrameKind)];

/// Two processes, three threads, every frame kind, a weight past 32 bits and a CPU column.
fn profile() -> Profile {
    let mut p = Profile::new(vec![SampleType::samples(), SampleType::cpu_nanoseconds()]);
    p.metadata.producer = "rootline test".into();
    p.metadata.sample_rate_hz = Some(1000);
    p.set_process_name(100, "server");
    p.set_process_name(200, "helper");
    let main = p.intern_thread(100, 100);
    p.set_thread_name(main, "server main");
    let worker = p.intern_thread(100, 101);
    p.set_thread_name(worker, "server worker");
    let helper = p.intern_thread(200, 200);
    let stacks: [(Frames, ThreadId, i64); 6] = [
        (
            &[("_start", FrameKind::Native), ("main", FrameKind::Native)],
            main,
            3,
        ),
        (
            &[
                ("_start", FrameKind::Native),
                ("main", FrameKind::Native),
                ("serve", FrameKind::Native),
                ("do_syscall_64", FrameKind::Kernel),
            ],
            main,
            5,
        ),
        (
            &[
                ("start_thread", FrameKind::Native),
                ("App.Run()", FrameKind::Managed),
                ("LazyCompile:handler", FrameKind::Jit),
            ],
            worker,
            7,
        ),
        (
            &[
                ("[truncated: stack-copy-exhausted]", FrameKind::Truncated),
                ("deep_recursion", FrameKind::Native),
            ],
            worker,
            // More than an i32 holds: split over samples by the writer.
            5_000_000_000,
        ),
        (
            &[
                ("CPU_TIME", FrameKind::Pseudo),
                ("helper_loop", FrameKind::Native),
            ],
            helper,
            2,
        ),
        (
            &[("_start", FrameKind::Native), ("main", FrameKind::Native)],
            main,
            1,
        ),
    ];
    for (n, (frames, thread, weight)) in stacks.into_iter().enumerate() {
        let ids: Vec<_> = frames
            .iter()
            .map(|(name, kind)| p.intern_named_frame(name, *kind))
            .collect();
        let stack = p.intern_stack_root_first(ids).unwrap();
        p.push_sample(n as u64 * 1_000_000, thread, stack, &[weight, 1_000_000])
            .unwrap();
    }
    p
}

/// Per thread name: summed weight of each root-first stack of frame names, from our profile. A
/// process's main thread (tid = pid) is shown under the process's name.
fn our_stacks(p: &Profile) -> BTreeMap<String, BTreeMap<Vec<String>, i64>> {
    let mut out: BTreeMap<String, BTreeMap<Vec<String>, i64>> = BTreeMap::new();
    let samples = p.samples();
    let mut frames = Vec::new();
    for i in 0..samples.len() {
        let thread = samples.threads[i];
        let t = p.thread(thread);
        let name = if t.tid == t.pid {
            p.process_name(t.pid)
        } else {
            p.thread_name(thread)
        }
        .unwrap()
        .to_owned();
        p.stack_frames_root_first(samples.stacks[i], &mut frames);
        let names = frames.iter().map(|&f| p.frame_name(f).to_owned()).collect();
        *out.entry(name).or_default().entry(names).or_default() += samples.values[0][i];
    }
    out
}

fn strings(thread: &Value) -> Vec<&str> {
    thread["stringArray"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect()
}

/// The same, read back from the processed profile's tables.
fn their_stacks(json: &Value) -> BTreeMap<String, BTreeMap<Vec<String>, i64>> {
    let mut out: BTreeMap<String, BTreeMap<Vec<String>, i64>> = BTreeMap::new();
    for thread in json["threads"].as_array().unwrap() {
        let strings = strings(thread);
        let prefix = thread["stackTable"]["prefix"].as_array().unwrap();
        let frame = thread["stackTable"]["frame"].as_array().unwrap();
        let func = thread["frameTable"]["func"].as_array().unwrap();
        let func_name = thread["funcTable"]["name"].as_array().unwrap();
        let samples = &thread["samples"];
        let weights = samples["weight"].as_array().unwrap();
        let per_stack = out
            .entry(thread["name"].as_str().unwrap().to_owned())
            .or_default();
        for (s, stack) in samples["stack"].as_array().unwrap().iter().enumerate() {
            let mut names = Vec::new();
            let mut at = stack.as_u64();
            while let Some(index) = at {
                let index = index as usize;
                let f = frame[index].as_u64().unwrap() as usize;
                let name = func_name[func[f].as_u64().unwrap() as usize]
                    .as_u64()
                    .unwrap();
                names.push(strings[name as usize].to_owned());
                at = prefix[index].as_u64();
            }
            names.reverse();
            *per_stack.entry(names).or_default() += weights[s].as_i64().unwrap();
        }
    }
    out
}

#[test]
fn threads_stacks_and_weights_read_back_equal_ours() {
    let p = profile();
    let mut out = Vec::new();
    fxprof::write(&p, &mut out).unwrap();
    let json: Value = serde_json::from_slice(&out).unwrap();
    // The fields the profiler checks before anything else.
    assert!(json["meta"]["version"].as_u64().is_some(), "meta.version");
    let processed = json["meta"]["preprocessedProfileVersion"].as_u64().unwrap();
    assert!(processed >= 1, "meta.preprocessedProfileVersion");
    assert_eq!(json["meta"]["product"], "rootline test");
    assert_eq!(json["meta"]["interval"], 1.0, "1000 Hz is a 1 ms interval");

    assert_eq!(their_stacks(&json), our_stacks(&p));

    let threads = json["threads"].as_array().unwrap();
    let summary: Vec<(&str, &str, &str, &str, bool)> = threads
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap(),
                t["processName"].as_str().unwrap(),
                t["pid"].as_str().unwrap(),
                t["tid"].as_str().unwrap(),
                t["isMainThread"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("server", "server", "100", "100", true),
            ("server worker", "server", "100", "101", false),
            ("helper", "helper", "200", "200", true),
        ]
    );

    // Each frame's category is its kind's; JIT and managed frames are script frames.
    let categories: Vec<&str> = json["meta"]["categories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    let mut seen = BTreeMap::new();
    for thread in threads {
        let strings = strings(thread);
        let frames = &thread["frameTable"];
        let funcs = &thread["funcTable"];
        for (f, func) in frames["func"].as_array().unwrap().iter().enumerate() {
            let func = func.as_u64().unwrap() as usize;
            let name = strings[funcs["name"][func].as_u64().unwrap() as usize];
            let category = categories[frames["category"][f].as_u64().unwrap() as usize];
            seen.insert(name, (category, funcs["isJS"][func].as_bool().unwrap()));
        }
    }
    assert_eq!(seen["main"], ("Native", false));
    assert_eq!(seen["do_syscall_64"], ("Kernel", false));
    assert_eq!(seen["LazyCompile:handler"], ("JIT", true));
    assert_eq!(seen["App.Run()"], ("Managed", true));
    assert_eq!(
        seen["[truncated: stack-copy-exhausted]"],
        ("Truncated", false)
    );
    assert_eq!(seen["CPU_TIME"], ("Other", false));
}

#[test]
fn nanosecond_weights_become_an_interval_and_counts() {
    let mut p = Profile::new(vec![SampleType::wall_nanoseconds()]);
    let thread = p.intern_thread(1, 1);
    let f = p.intern_named_frame("work", FrameKind::Managed);
    let stack = p.intern_stack_root_first(vec![f]).unwrap();
    for (t, ns) in [2_000_000, 1_000_000, 3_000_000].into_iter().enumerate() {
        p.push_sample(t as u64, thread, stack, &[ns]).unwrap();
    }
    let mut out = Vec::new();
    fxprof::write(&p, &mut out).unwrap();
    let json: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(json["meta"]["interval"], 1.0, "gcd 1 ms");
    assert_eq!(
        json["threads"][0]["samples"]["weight"],
        serde_json::json!([2, 1, 3])
    );
}

#[test]
fn the_extensions_choose_plain_or_gzipped() {
    use rootline_formats::Format;
    let plain = Format::from_path(Path::new("run.fxprof.json")).unwrap();
    let gzipped = Format::from_path(Path::new("run.FXPROF.json.gz")).unwrap();
    assert_eq!((plain, gzipped), (Format::Fxprof, Format::FxprofGz));
    assert!(!plain.can_read() && plain.can_write());
    let mut out = Vec::new();
    rootline_formats::write(gzipped, &profile(), &mut out).unwrap();
    assert_eq!(out[..2], [0x1f, 0x8b], "gzip magic");
}

#[test]
fn the_gzipped_file_holds_the_same_json() {
    let p = profile();
    let (mut plain, mut gz) = (Vec::new(), Vec::new());
    fxprof::write(&p, &mut plain).unwrap();
    fxprof::write_gz(&p, &mut gz).unwrap();
    let mut unzipped = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut unzipped)
        .unwrap();
    assert_eq!(unzipped, plain);
}

fn workspace() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn profiler_cli() -> Option<PathBuf> {
    let cli = workspace()
        .join("tests/js-fxprof/node_modules/@firefox-devtools/profiler-cli/dist/profiler-cli.js");
    let node = Command::new("node").arg("--version").output().is_ok();
    if cli.exists() && node {
        return Some(cli);
    }
    let reason = "missing node or tests/js-fxprof/node_modules (npm ci there); scripts/test.sh installs them";
    assert!(std::env::var_os("CI").is_none(), "{reason}");
    eprintln!("skipping the Firefox Profiler check: {reason}");
    None
}

/// Runs the profiler's CLI with its sessions in `sessions`; the parsed `--json` output.
fn pq(cli: &Path, sessions: &Path, args: &[&str]) -> Value {
    let out = Command::new("node")
        .arg(cli)
        .args(args)
        .arg("--json")
        .env("PROFILER_CLI_SESSION_DIR", sessions)
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "profiler-cli {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Kills the daemon process when the test ends, whatever happens.
struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Stops the profiler-cli daemons of a test, whatever happens.
struct Sessions<'a>(&'a Path, &'a Path);

impl Drop for Sessions<'_> {
    fn drop(&mut self) {
        let _ = Command::new("node")
            .arg(self.0)
            .args(["stop", "--all"])
            .env("PROFILER_CLI_SESSION_DIR", self.1)
            .output();
        let _ = std::fs::remove_dir_all(self.1);
    }
}

#[test]
fn the_firefox_profilers_own_code_loads_it_with_our_sample_counts() {
    let Some(cli) = profiler_cli() else {
        return;
    };
    // A short path: the session directory holds a Unix socket (108-byte limit).
    let dir = PathBuf::from(format!("/tmp/rl-fx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _sessions = Sessions(&cli, &dir);
    let p = profile();
    let file = dir.join("p.fxprof.json.gz");
    let mut gz = Vec::new();
    fxprof::write_gz(&p, &mut gz).unwrap();
    std::fs::write(&file, gz).unwrap();

    // The CLI's `load` gives its daemon 500 ms to start, too little on a busy machine; the daemon
    // is run here in the foreground instead (the command `load` runs) and asked for its status
    // until it answers.
    let daemon = Command::new("node")
        .arg(&cli)
        .args(["--daemon", file.to_str().unwrap(), "--session", "rl"])
        .env("PROFILER_CLI_SESSION_DIR", &dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("node runs");
    let _daemon = Daemon(daemon);
    let ready = (0..240).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(250));
        Command::new("node")
            .arg(&cli)
            .args(["status", "--session", "rl"])
            .env("PROFILER_CLI_SESSION_DIR", &dir)
            .output()
            .is_ok_and(|o| o.status.success())
    });
    assert!(ready, "the profiler-cli daemon never answered");

    let ours = our_stacks(&p);
    let list = pq(&cli, &dir, &["thread", "list", "--session", "rl"]);
    let threads = list["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 3, "{list}");
    for thread in threads {
        let name = thread["name"].as_str().unwrap();
        let handle = thread["threadHandle"].as_str().unwrap();
        let ours = &ours[name];
        let samples = pq(
            &cli,
            &dir,
            &[
                "thread",
                "samples",
                "--thread",
                handle,
                "--include-idle",
                "--session",
                "rl",
            ],
        );
        let total: i64 = ours.values().sum();
        assert_eq!(
            samples["categoryBreakdown"]["totalSamples"].as_i64(),
            Some(total),
            "{name}: {samples}"
        );
        // Every function's total as the profiler's call tree counts it equals ours.
        let mut our_totals: BTreeMap<&str, i64> = BTreeMap::new();
        for (stack, weight) in ours {
            let mut names: Vec<&str> = stack.iter().map(String::as_str).collect();
            names.sort();
            names.dedup();
            for n in names {
                *our_totals.entry(n).or_default() += weight;
            }
        }
        let their_totals: BTreeMap<&str, i64> = samples["topFunctionsByTotal"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["name"].as_str().unwrap(),
                    f["totalSamples"].as_i64().unwrap(),
                )
            })
            .collect();
        assert_eq!(their_totals, our_totals, "{name}");
    }
}
