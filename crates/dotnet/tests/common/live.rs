//! A live .NET Core 3.1 target for tests: finds the runtime (PyPI `dotnetcore2`) and the C#
//! compiler (`mcs`, apt `mono-mcs`), builds `tests/data/Rec.cs`, and runs it.
//!
//! When either tool is missing the tests skip with a printed reason, except under `CI`, where they
//! fail: scripts/test.sh installs both.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

/// The `dotnet` host: `$ROOTLINE_DOTNET`, else the one the `dotnetcore2` wheel ships, else PATH.
pub fn dotnet() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ROOTLINE_DOTNET") {
        return Some(PathBuf::from(p));
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import dotnetcore2,os;print(os.path.dirname(dotnetcore2.__file__))",
        ])
        .output()
        .ok()?;
    let dir = String::from_utf8(out.stdout).ok()?;
    let host = Path::new(dir.trim()).join("bin/dotnet");
    if out.status.success() && host.exists() {
        return Some(host);
    }
    which("dotnet")
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    })
}

/// Returns the tools, or `None` after printing why the test is skipped; panics under `CI`.
pub fn tools(test: &str) -> Option<(PathBuf, PathBuf)> {
    let dotnet = dotnet();
    let mcs = which("mcs");
    match (dotnet, mcs) {
        (Some(d), Some(m)) => Some((d, m)),
        (d, m) => {
            let msg = format!(
                "{test}: needs the .NET runtime (pip install dotnetcore2: {}) and mcs (apt-get \
                 install mono-mcs: {})",
                if d.is_some() { "found" } else { "missing" },
                if m.is_some() { "found" } else { "missing" },
            );
            if std::env::var_os("CI").is_some() {
                panic!("{msg}");
            }
            eprintln!("skipping {msg}");
            None
        }
    }
}

/// The `Microsoft.NETCore.App` version next to the host.
fn framework_version(dotnet: &Path) -> String {
    let dir = dotnet
        .parent()
        .unwrap()
        .join("shared/Microsoft.NETCore.App");
    let mut versions: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    versions.sort();
    versions.pop().expect("a framework version")
}

/// Compiles `Rec.cs` into `dir` and writes its runtimeconfig; returns the `.exe` path.
pub fn build_target(dotnet: &Path, mcs: &Path, dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/Rec.cs");
    let src = if src.exists() {
        src
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../dotnet/tests/data/Rec.cs")
    };
    let exe = dir.join("Rec.exe");
    let status = Command::new(mcs)
        .arg("-optimize+")
        .arg(format!("-out:{}", exe.display()))
        .arg(&src)
        .stdout(Stdio::null())
        .status()
        .expect("run mcs");
    assert!(status.success(), "mcs failed");
    let config = format!(
        r#"{{"runtimeOptions":{{"tfm":"netcoreapp3.1","framework":{{"name":"Microsoft.NETCore.App","version":"{}"}},"configProperties":{{"System.Globalization.Invariant":true}}}}}}"#,
        framework_version(dotnet)
    );
    std::fs::write(dir.join("Rec.runtimeconfig.json"), config).unwrap();
    exe
}

/// A running target; killed when dropped.
pub struct Target {
    pub child: Child,
    lines: Receiver<String>,
}

impl Target {
    /// Starts `dotnet Rec.exe deep shallow` and waits for it to be ready and its socket to exist.
    pub fn start(dotnet: &Path, exe: &Path, deep: u32, shallow: u32) -> Target {
        let mut child = Command::new(dotnet)
            .arg(exe)
            .arg(deep.to_string())
            .arg(shallow.to_string())
            .env("DOTNET_CLI_TELEMETRY_OPTOUT", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the .NET target");
        let stdout: ChildStdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let target = Target { child, lines: rx };
        let line = target
            .lines
            .recv_timeout(Duration::from_secs(30))
            .expect("target prints ready");
        assert_eq!(line, "ready");
        let pid = target.pid();
        let t0 = Instant::now();
        while rootline_dotnet::discover::find_socket(pid).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "no diagnostics socket"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        target
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Drains the output and returns the newest heartbeat count (waiting up to `wait` for one).
    pub fn latest_beat(&self, wait: Duration) -> Option<u64> {
        let mut latest = None;
        let deadline = Instant::now() + wait;
        loop {
            while let Ok(line) = self.lines.try_recv() {
                if let Some(n) = line.strip_prefix("beat ") {
                    latest = n.parse().ok();
                }
            }
            if latest.is_some() || Instant::now() >= deadline {
                return latest;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Asserts the target is alive and still making progress (new heartbeats).
    pub fn assert_still_answers(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "the target exited"
        );
        let before = self.latest_beat(Duration::from_secs(10)).unwrap_or(0);
        let t0 = Instant::now();
        loop {
            let now = self.latest_beat(Duration::from_secs(1)).unwrap_or(0);
            if now > before {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the target stopped beating at {before}"
            );
        }
        // And its diagnostics server still takes commands.
        assert!(rootline_dotnet::discover::find_socket(self.pid()).is_ok());
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A trace collected now: 2 seconds of `Rec.exe 150 30` (sample profiler and rundown), collected
/// once per test binary; `None` after a printed reason when the tools are missing.
pub fn recorded_trace(test: &str) -> Option<&'static [u8]> {
    static TRACE: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();
    TRACE
        .get_or_init(|| {
            let (dotnet, mcs) = tools(test)?;
            let dir = tempfile::tempdir().unwrap();
            let exe = build_target(&dotnet, &mcs, dir.path());
            let target = Target::start(&dotnet, &exe, 150, 30);
            let options = rootline_dotnet::collect::CollectOptions {
                duration: Some(Duration::from_secs(2)),
                ..Default::default()
            };
            let mut trace = Vec::new();
            let stop = std::sync::atomic::AtomicBool::new(false);
            let summary =
                rootline_dotnet::collect::collect(target.pid(), &options, &mut trace, &stop)
                    .unwrap();
            assert!(summary.complete, "{summary:?}");
            Some(trace)
        })
        .as_deref()
}
