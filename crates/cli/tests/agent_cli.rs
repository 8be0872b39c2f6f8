//! `rootline agent` on the command line: configuration errors are one line with the file, the
//! line and what to change (exit 1); `--print-config` shows the effective configuration.

use std::process::{Command, Output};

fn rootline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args(args)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .output()
        .expect("run rootline")
}

#[test]
fn bad_config_files_give_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "unknown.toml",
            "frequency_hz = 99\nsampling = 3\n",
            &["unknown.toml", "line 2", "sampling"][..],
        ),
        (
            "duration.toml",
            "export_interval = \"soon\"\n",
            &["line 1", "\"10s\""][..],
        ),
        (
            "budget.toml",
            "memory_limit = \"2MiB\"\n",
            &["raise memory_limit"][..],
        ),
    ];
    for (name, text, needles) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = rootline(&["agent", "--config", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        for needle in needles {
            assert!(stderr.contains(needle), "{stderr:?} lacks {needle:?}");
        }
    }
    let out = rootline(&["agent", "--config", "/nonexistent/agent.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/agent.toml"));
}

#[test]
fn print_config_shows_overrides() {
    let out = rootline(&[
        "agent",
        "--print-config",
        "-F",
        "49",
        "-p",
        "1,2",
        "--export-interval",
        "2.5",
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("frequency_hz = 49"), "{text}");
    assert!(
        text.contains("pids = [\n    1,\n    2,\n]") || text.contains("pids = [1, 2]"),
        "{text}"
    );
    assert!(text.contains("export_interval = \"2500ms\""), "{text}");
    assert!(text.contains("[exporters.otlp]"), "{text}");
}

#[test]
fn sigterm_flushes_a_final_export_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    let out_dir = dir.path().join("pprof");
    // One export per minute: whatever is in the files was written by the final export.
    std::fs::write(
        &config,
        format!(
            "export_interval = \"60s\"\n[targets]\nregex = [\"rootline-sigterm-target\"]\n\
             [exporters.pprof]\ndirectory = \"{}\"\n",
            out_dir.display()
        ),
    )
    .unwrap();
    let mut busy = Command::new("sh")
        .args(["-c", "while :; do :; done", "rootline-sigterm-target"])
        .spawn()
        .unwrap();
    let agent = Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args([
            "agent",
            "--config",
            config.to_str().unwrap(),
            "--log-format",
            "json",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    let ports = listening_sockets(agent.id());
    // SIGTERM, as Kubernetes sends it before stopping a pod.
    let status = Command::new("kill")
        .args(["-TERM", &agent.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = agent.wait_with_output().unwrap();
    let _ = busy.kill();
    let _ = busy.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(2) && std::env::var_os("CI").is_none() {
        eprintln!("skipping: perf events not permitted here: {stderr}");
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        ports,
        Vec::<String>::new(),
        "the agent opened a listening port"
    );
    // JSON log lines, the cache rundown and the final status line.
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect();
    let status = lines
        .iter()
        .rev()
        .find(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("status: "))
        })
        .unwrap_or_else(|| panic!("no status line: {stderr}"));
    for field in [
        "samples",
        "lost",
        "dropped",
        "ignored",
        "cache_hits",
        "cache_misses",
        "cache_evictions",
        "cache_entries",
        "cache_bytes",
        "export_latency_ms",
        "export_failed",
        "rss_bytes",
    ] {
        assert!(
            status[field].is_number(),
            "status line lacks {field}: {status}"
        );
    }
    assert!(status["samples"].as_u64().unwrap() > 0, "{status}");
    assert!(status["rss_bytes"].as_u64().unwrap() > 1 << 20, "{status}");
    let exporter = lines
        .iter()
        .rev()
        .find(|l| l["exporter"] == "pprof")
        .unwrap_or_else(|| panic!("no exporter status line: {stderr}"));
    assert_eq!(exporter["failed"], 0, "{exporter}");
    assert_eq!(exporter["exported"], status["samples"], "{exporter}");
    assert!(stderr.contains("stack cache rundown"), "{stderr}");
    assert!(stderr.contains("rootline agent stopped"), "{stderr}");
    let files: Vec<_> = std::fs::read_dir(&out_dir).unwrap().flatten().collect();
    assert!(
        !files.is_empty(),
        "no pprof file from the final export: {stderr}"
    );
    assert!(
        files
            .iter()
            .all(|f| f.file_name().to_string_lossy().starts_with("sh-")),
        "only the target's profiles"
    );
}

/// A second SIGTERM while the final export waits on a stalled receiver exits at once (130)
/// instead of waiting for `shutdown_timeout`.
#[test]
fn second_sigterm_exits_without_waiting_for_the_final_export() {
    // A receiver that accepts connections and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let held = std::thread::spawn(move || {
        let mut open = Vec::new();
        for stream in listener.incoming().take(8) {
            open.push(stream);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "export_interval = \"60s\"\nexport_timeout = \"60s\"\nshutdown_timeout = \"60s\"\n\
             [targets]\nregex = [\"rootline-2term-target\"]\n\
             [exporters.otlp]\nendpoint = \"http://{addr}\"\nretries = 0\n"
        ),
    )
    .unwrap();
    let mut busy = Command::new("sh")
        .args(["-c", "while :; do :; done", "rootline-2term-target"])
        .spawn()
        .unwrap();
    let agent = Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args(["agent", "--config", config.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    let term = || {
        let status = Command::new("kill")
            .args(["-TERM", &agent.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    };
    term();
    // Let the final export start and hang on the receiver, then insist.
    std::thread::sleep(std::time::Duration::from_secs(2));
    term();
    let out = agent.wait_with_output().unwrap();
    let _ = busy.kill();
    let _ = busy.wait();
    drop(held);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(2) && std::env::var_os("CI").is_none() {
        eprintln!("skipping: perf events not permitted here: {stderr}");
        return;
    }
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(!stderr.contains("rootline agent stopped"), "{stderr}");
}

/// TCP sockets of process `pid` in the LISTEN state and UDP sockets it has bound, as
/// `/proc/net/{tcp,tcp6,udp,udp6}` lines.
fn listening_sockets(pid: u32) -> Vec<String> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    let mut found = Vec::new();
    for table in ["tcp", "tcp6", "udp", "udp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let (Some(state), Some(inode)) = (cols.get(3), cols.get(9)) else {
                continue;
            };
            let listening = table.starts_with("udp") || *state == "0A";
            if listening && inodes.iter().any(|i| i == inode) {
                found.push(format!("{table}: {line}"));
            }
        }
    }
    found
}

#[test]
fn listening_sockets_sees_a_listener() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let found = listening_sockets(std::process::id());
    assert!(!found.is_empty(), "a bound listener was not found");
    drop(listener);
}

/// With stderr in a file (as under systemd or `2>agent.log`), the text log has no ANSI colour codes.
#[test]
fn the_log_has_no_colour_codes_when_stderr_is_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "export_interval = \"60s\"\n[targets]\nregex = [\"rootline-log-target\"]\n\
             [exporters.pprof]\ndirectory = \"{}\"\n",
            dir.path().join("pprof").display()
        ),
    )
    .unwrap();
    let log = dir.path().join("agent.log");
    let agent = Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args(["agent", "--config", config.to_str().unwrap()])
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let status = Command::new("kill")
        .args(["-TERM", &agent.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = agent.wait_with_output().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    if out.status.code() == Some(2) && std::env::var_os("CI").is_none() {
        eprintln!("skipping: perf events not permitted here: {text}");
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{text}");
    // Text lines at level INFO were written, and none holds an escape sequence.
    assert!(
        text.lines().any(|l| l.contains(" INFO ")),
        "no INFO line: {text:?}"
    );
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in the log: {text:?}"
    );
}
