//! `rootline record -p` on a running JVM: with no manual step its compiled Java methods are named
//! (rootline asks the JVM for its perf map itself); `--no-perfmap` asks nothing, and the summary
//! says how many JIT frames stayed unnamed and why.
#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn rootline() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rootline"))
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    })
}

/// A running JVM, killed (and its files removed) when dropped.
struct Jvm(Child);

impl Drop for Jvm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let pid = self.0.id();
        for name in [format!("perf-{pid}.map"), format!(".java_pid{pid}")] {
            let _ = std::fs::remove_file(Path::new("/tmp").join(name));
        }
    }
}

/// Compiles `Rec` into `dir` and starts it, waiting for its `ready`; None (with the reason
/// printed) without a JDK, outside CI.
fn start_jvm(dir: &Path) -> Option<Jvm> {
    let (Some(java), Some(javac)) = (which("java"), which("javac")) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "needs a JDK (openjdk-17-jdk-headless)"
        );
        eprintln!("skipping: needs a JDK (apt-get install openjdk-17-jdk-headless)");
        return None;
    };
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../capture/tests/jit/Rec.java");
    let status = Command::new(javac)
        .arg("-d")
        .arg(dir)
        .arg(source)
        .status()
        .unwrap();
    assert!(status.success(), "javac failed");
    let mut child = Command::new(java)
        .arg("-cp")
        .arg(dir)
        .args(["Rec", "20", "2", "600", "120"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let jvm = Jvm(child);
    let mut lines = BufReader::new(stdout).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.trim() == "ready")),
        "the JVM prints ready"
    );
    // Keep reading its output so that it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Some(jvm)
}

fn record(pid: u32, out: &Path, extra: &[&str]) -> String {
    let result = rootline()
        .args(["record", "-p", &pid.to_string(), "--duration", "3", "-o"])
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr).into_owned();
    assert!(result.status.success(), "{stderr}");
    stderr
}

/// Samples of a folded profile whose stack holds `frame`, and all samples.
fn samples_with(folded: &Path, frame: &str) -> (u64, u64) {
    let text = std::fs::read_to_string(folded).unwrap();
    let mut with = 0;
    let mut all = 0;
    for line in text.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        all += n;
        if stack.split(';').any(|f| f == frame) {
            with += n;
        }
    }
    (with, all)
}

#[test]
fn a_jvm_by_pid_is_named_with_no_manual_step_and_not_asked_with_no_perfmap() {
    let dir = tempfile::tempdir().unwrap();
    let Some(jvm) = start_jvm(dir.path()) else {
        return;
    };
    let pid = jvm.0.id();
    let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    // A map already there is a dead process's under the same pid (pids wrap at 32,768 on a busy
    // test host): this JVM writes one only when asked, and it has not been asked yet.
    let _ = std::fs::remove_file(&map);

    let out = dir.path().join("unasked.folded");
    let stderr = record(pid, &out, &["--no-perfmap"]);
    assert!(!map.exists(), "--no-perfmap asked the JVM for its perf map");
    assert!(
        !Path::new(&format!("/tmp/.java_pid{pid}")).exists(),
        "--no-perfmap started the JVM's attach listener"
    );
    assert!(
        stderr.contains("distinct JIT frames stayed unnamed") && stderr.contains("no perf map"),
        "{stderr}"
    );
    assert_eq!(samples_with(&out, "Rec.spin(int)").0, 0);

    let out = dir.path().join("asked.folded");
    let stderr = record(pid, &out, &[]);
    assert!(map.exists(), "the JVM was asked for its perf map");
    assert!(!stderr.contains("note:"), "{stderr}");
    let (with, all) = samples_with(&out, "Rec.spin(int)");
    println!("Rec.spin(int) in {with} of {all} samples");
    // Two of the JVM's threads spend nearly all their time in spin.
    assert!(
        with * 10 >= all * 8,
        "Rec.spin(int) in {with} of {all} samples"
    );
}
