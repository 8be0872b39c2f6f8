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
