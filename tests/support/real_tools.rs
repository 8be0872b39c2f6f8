//! Inputs made at test time by the real tools that write them: `perf script` text from perf, pprof
//! files from Go's runtime/pprof, speedscope files from py-spy and Chrome trace events from node.
//! scripts/test.sh installs every tool used here.
//!
//! Each input is made once per test binary (under its `CARGO_TARGET_TMPDIR`) and shared by its
//! tests. When a tool is missing the caller gets `None` after a printed skip reason, except under
//! `CI`, where a missing tool fails the test.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// This folder: the workloads' sources.
fn support_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/support")
}

/// A fresh scratch folder for one generated input.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("real-tools")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Whether `program args` runs; prints a skip reason (or panics under `CI`) when not.
pub fn available(program: &str, args: &[&str], install_hint: &str) -> bool {
    let ok = Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        let message =
            format!("`{program}` is not available ({install_hint}; scripts/test.sh does it)");
        if std::env::var_os("CI").is_some() {
            panic!("{message}");
        }
        eprintln!("skipping: {message}");
    }
    ok
}

/// Runs `command`, failing the test with its stderr when it fails; returns stdout.
fn run(command: &mut Command) -> Vec<u8> {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `perf script` text of `perf record -g` (frame pointers, cpu-clock) of `burn.c`: about 150
/// samples, nearly all in `main;rl_outer;rl_middle;rl_leaf`.
pub fn perf_script() -> Option<&'static str> {
    static TEXT: OnceLock<Option<String>> = OnceLock::new();
    TEXT.get_or_init(|| {
        if !available("perf", &["--version"], "apt-get install linux-perf")
            || !available("gcc", &["--version"], "apt-get install gcc")
        {
            return None;
        }
        let dir = scratch("perf");
        let exe = dir.join("burn");
        run(Command::new("gcc")
            .args(["-O1", "-g", "-fno-omit-frame-pointer", "-o"])
            .arg(&exe)
            .arg(support_dir().join("burn.c")));
        let data = dir.join("perf.data");
        run(Command::new("perf")
            .args(["record", "-q", "-e", "cpu-clock", "-F", "499", "-g", "-o"])
            .arg(&data)
            .arg("--")
            .arg(&exe)
            .arg("300"));
        let text = run(Command::new("perf").arg("script").arg("-i").arg(&data));
        let text = String::from_utf8(text).expect("perf script writes UTF-8 here");
        assert!(text.contains("rl_leaf"), "{text}");
        Some(text)
    })
    .as_deref()
}

/// The pprof files Go's runtime/pprof wrote for `pprof_target.go`.
pub struct GoProfiles {
    /// A CPU profile (gzipped profile.proto) of half a second in `main.outer` → `main.leaf`.
    pub cpu: PathBuf,
    /// A heap profile (four value columns) taken with every allocation sampled.
    pub heap: PathBuf,
}

/// Runs `pprof_target.go` once; its profiles.
pub fn go_profiles() -> Option<&'static GoProfiles> {
    static PROFILES: OnceLock<Option<GoProfiles>> = OnceLock::new();
    PROFILES
        .get_or_init(|| {
            if !available("go", &["version"], "apt-get install golang-go") {
                return None;
            }
            let dir = scratch("go");
            let exe = dir.join("pprof_target");
            run(Command::new("go")
                .args(["build", "-o"])
                .arg(&exe)
                .arg(support_dir().join("pprof_target.go"))
                .env("GO111MODULE", "off")
                .env("GOFLAGS", ""));
            let profiles = GoProfiles {
                cpu: dir.join("cpu.pprof"),
                heap: dir.join("heap.pprof"),
            };
            run(Command::new(&exe).arg(&profiles.cpu).arg(&profiles.heap));
            Some(profiles)
        })
        .as_ref()
}

/// A speedscope file py-spy wrote while sampling `burn.py` (sampled profile, times in seconds).
pub fn py_spy_speedscope() -> Option<&'static Path> {
    static FILE: OnceLock<Option<PathBuf>> = OnceLock::new();
    FILE.get_or_init(|| {
        if !available("py-spy", &["--version"], "pip install py-spy")
            || !available("python3", &["--version"], "apt-get install python3")
        {
            return None;
        }
        let dir = scratch("py-spy");
        let out = dir.join("burn.speedscope.json");
        let record = || {
            let mut c = Command::new("py-spy");
            c.args([
                "record",
                "--format",
                "speedscope",
                "--rate",
                "200",
                "--output",
            ])
            .arg(&out)
            .args(["--", "python3"])
            .arg(support_dir().join("burn.py"))
            .arg("300");
            c
        };
        // py-spy 0.4.2 now and then loses its child ("No child process", os error 10) on a busy
        // machine: a second try makes the input; a third failure fails the test with its stderr.
        for _ in 0..2 {
            if record().status().is_ok_and(|s| s.success()) {
                return Some(out);
            }
        }
        run(&mut record());
        Some(out)
    })
    .as_deref()
}

/// A Chrome trace-event file node wrote (`--trace-event-categories v8,node`) while running
/// `burn.js`: complete (`X`) slices and async (`b`/`e`) events from several threads.
pub fn node_trace() -> Option<&'static Path> {
    static FILE: OnceLock<Option<PathBuf>> = OnceLock::new();
    FILE.get_or_init(|| {
        if !available("node", &["--version"], "apt-get install nodejs") {
            return None;
        }
        let dir = scratch("node-trace");
        let out = dir.join("trace.json");
        run(Command::new("node")
            .args(["--trace-event-categories", "v8,node,node.async_hooks"])
            .arg("--trace-event-file-pattern")
            .arg(&out)
            .arg(support_dir().join("burn.js")));
        Some(out)
    })
    .as_deref()
}

/// A legacy binary CPU profile (the gperftools format `pprof` still reads) that gperftools'
/// libprofiler wrote while `burn.c` ran (`CPUPROFILE`, loaded with `LD_PRELOAD`).
pub fn gperftools_cpu_profile() -> Option<&'static Path> {
    static FILE: OnceLock<Option<PathBuf>> = OnceLock::new();
    FILE.get_or_init(|| {
        let library = ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"]
            .iter()
            .map(|d| Path::new(d).join("libprofiler.so.0"))
            .find(|p| p.exists());
        let Some(library) = library else {
            let message = "gperftools' libprofiler.so.0 is not installed (apt-get install \
                           libgoogle-perftools4; scripts/test.sh does it)";
            if std::env::var_os("CI").is_some() {
                panic!("{message}");
            }
            eprintln!("skipping: {message}");
            return None;
        };
        if !available("gcc", &["--version"], "apt-get install gcc") {
            return None;
        }
        let dir = scratch("gperftools");
        let exe = dir.join("burn");
        run(Command::new("gcc")
            .args(["-O1", "-g", "-fno-omit-frame-pointer", "-o"])
            .arg(&exe)
            .arg(support_dir().join("burn.c")));
        let out = dir.join("burn.cpu");
        run(Command::new(&exe)
            .arg("300")
            .env("LD_PRELOAD", &library)
            .env("CPUPROFILE", &out)
            .env("CPUPROFILE_FREQUENCY", "500"));
        Some(out)
    })
    .as_deref()
}
