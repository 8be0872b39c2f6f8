//! The agent with off-CPU on (`[off_cpu] enabled`), the real sampler on every CPU: a target whose
//! thread waits on a mutex a busy thread holds half the time (crates/cli/tests/c/off_cpu_lock.c).
//! Its OTLP export carries an `off_cpu` profile in nanoseconds beside `samples` and `cpu`, whose
//! waits end in the reason the kernel gave (asleep in the futex); the pprof files carry the same
//! sample type, and their off-CPU stacks of the wait run whole from the thread's root into the
//! lock. Every captured sample is exported or counted as dropped.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::receiver::Receiver;
use common::stats_or_skip_without_perf_events;
use rootline_agent::config::{DirConfig, OtlpConfig};
use rootline_agent::{Agent, AgentConfig, TargetConfig, build_exporters};
use rootline_formats::Format;
use rootline_profile::FrameKind;

/// The target's name, which the agent's target rule matches.
const MARKER: &str = "rootline-off-cpu-target";

fn build_target(dir: &Path) -> std::path::PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cli/tests/c/off_cpu_lock.c");
    let binary = dir.join(MARKER);
    let out = Command::new("cc")
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-pthread"])
        .args(["-DROUNDS=1000", "-DHALF_MS=20"])
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .output()
        .expect("cc runs (scripts/test.sh installs gcc)");
    assert!(out.status.success(), "{out:?}");
    binary
}

#[test]
fn off_cpu_waits_are_exported_as_their_own_sample_type() {
    let tmp = tempfile::tempdir().unwrap();
    let binary = build_target(tmp.path());
    let receiver = Receiver::start();
    let mut config = AgentConfig {
        export_interval: Duration::from_millis(500),
        export_timeout: Duration::from_secs(5),
        targets: TargetConfig {
            regex: vec![MARKER.into()],
            ..TargetConfig::default()
        },
        ..AgentConfig::default()
    };
    config.off_cpu.enabled = true;
    config.exporters.otlp = Some(OtlpConfig {
        endpoint: Some(receiver.endpoint()),
        ..OtlpConfig::default()
    });
    config.exporters.pprof = Some(DirConfig {
        directory: tmp.path().join("pprof"),
        max_bytes: 64 << 20,
    });
    let mut target = Command::new(&binary)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = i64::from(target.id());
    let source = match rootline_agent::default_source(&config) {
        Ok(s) => s,
        Err(e) => panic!("cannot start the sampler: {e}"),
    };
    let exporters = build_exporters(&config, |_| None).unwrap();
    let agent = Agent::start(&config, source, exporters).unwrap();
    std::thread::sleep(Duration::from_secs(4));
    let result = agent.stop();
    let _ = target.kill();
    let _ = target.wait();
    let Some(stats) = stats_or_skip_without_perf_events(result) else {
        return;
    };
    let got = receiver.received();
    eprintln!("off-CPU agent: {stats:?}\ntotals: {:?}", got.totals);
    for e in &stats.exporters {
        assert_eq!(
            stats.captured,
            stats.dropped + e.exported + e.failed,
            "{e:?}"
        );
        assert_eq!(e.failed, 0);
    }
    assert_eq!(got.bad_requests, 0);
    // One OTLP profile per sample type: samples and cpu as before, and off_cpu in nanoseconds.
    let total = |t: &str| got.totals.get(&(pid, t.to_string())).copied().unwrap_or(0);
    assert!(total("cpu/nanoseconds") > 0, "{:?}", got.totals);
    assert!(total("off_cpu/nanoseconds") > 0, "{:?}", got.totals);
    let sleeping = got
        .off_cpu_leaves
        .get("[off-cpu: sleeping]")
        .copied()
        .unwrap_or(0);
    assert!(sleeping > 0, "{:?}", got.off_cpu_leaves);

    // The pprof files: the same sample type, and the waiter's waits whole into the lock.
    let mut lock_waits = 0i64;
    let mut frames = Vec::new();
    for entry in std::fs::read_dir(tmp.path().join("pprof"))
        .unwrap()
        .flatten()
    {
        let file = std::io::BufReader::new(std::fs::File::open(entry.path()).unwrap());
        let profile = rootline_formats::read(Format::Pprof, file).unwrap();
        let Some(off) = profile
            .sample_types()
            .iter()
            .position(|t| t.name == "off_cpu" && t.unit == "nanoseconds")
        else {
            panic!("no off_cpu column: {:?}", profile.sample_types());
        };
        let samples = profile.samples();
        for i in 0..samples.len() {
            if samples.values[off][i] == 0 {
                continue;
            }
            profile.stack_frames_root_first(samples.stacks[i], &mut frames);
            let names: Vec<&str> = frames.iter().map(|&f| profile.frame_name(f)).collect();
            let Some(w) = names.iter().position(|&n| n == "wait_for_lock") else {
                continue;
            };
            assert!(
                frames
                    .iter()
                    .all(|&f| profile.frame(f).kind != FrameKind::Truncated),
                "{names:?}"
            );
            assert!(
                names[0].ends_with("clone3") && names[1..w] == ["start_thread", "waiter"],
                "{names:?}"
            );
            if names.iter().any(|n| n.contains("__lll_lock_wait")) {
                lock_waits += samples.values[off][i];
            }
        }
    }
    assert!(lock_waits > 0, "no off-CPU time in the lock's wait");
}
