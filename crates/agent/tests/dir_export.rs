//! pprof and .rlp files in a directory, from several exporters at once: every sample is in the
//! files (read back by rootline's readers and by `go tool pprof`), and the byte cap rotates files.

mod common;

use std::path::Path;
use std::time::Duration;

use common::run_synthetic_until_delivered;
use rootline_agent::config::DirConfig;
use rootline_agent::{AgentConfig, SyntheticConfig, build_exporters};
use rootline_formats::Format;

fn files(dir: &Path, ending: &str) -> Vec<std::path::PathBuf> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(ending))
        .collect();
    out.sort();
    out
}

fn samples_in(path: &Path, format: Format) -> i64 {
    let file = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    let profile = rootline_formats::read(format, file).unwrap();
    let col = profile
        .sample_types()
        .iter()
        .position(|t| t.name == "samples")
        .unwrap();
    profile.samples().values[col].iter().sum()
}

/// Runs the agent on a synthetic source for `pids` until it has delivered `n` samples.
fn run(config: &AgentConfig, pids: Vec<u32>, n: u64) -> rootline_agent::Stats {
    let synth = SyntheticConfig {
        pids,
        stacks: 25,
        depth: 9,
        rate_per_sec: 2000,
        limit: Some(n),
    };
    let exporters = build_exporters(config, |_| None).unwrap();
    run_synthetic_until_delivered(config, synth, exporters, Duration::from_secs(20))
}

#[test]
fn pprof_and_rlp_files_hold_every_sample() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = AgentConfig {
        export_interval: Duration::from_millis(200),
        ..AgentConfig::default()
    };
    config.exporters.pprof = Some(DirConfig {
        directory: tmp.path().join("pprof"),
        max_bytes: 64 << 20,
    });
    config.exporters.rlp = Some(DirConfig {
        directory: tmp.path().join("rlp"),
        max_bytes: 64 << 20,
    });
    let me = std::process::id();
    let stats = run(&config, vec![me, 4_200_001], 2000);
    assert_eq!(stats.exporters.len(), 2);
    for e in &stats.exporters {
        assert_eq!((e.exported, e.failed), (2000, 0), "{e:?}");
    }

    let pprof = files(&tmp.path().join("pprof"), ".pb.gz");
    let rlp = files(&tmp.path().join("rlp"), ".rlp");
    assert!(
        pprof.len() >= 4,
        "one file per interval and process: {pprof:?}"
    );
    assert_eq!(pprof.len(), rlp.len());
    let total: i64 = pprof.iter().map(|p| samples_in(p, Format::Pprof)).sum();
    assert_eq!(total, 2000);
    let total: i64 = rlp.iter().map(|p| samples_in(p, Format::Rlp)).sum();
    assert_eq!(total, 2000);
    // Named after the process: this test binary's comm, and `unknown` for the made-up pid.
    assert!(
        pprof
            .iter()
            .any(|p| p.to_string_lossy().contains(&format!("-{me}-")))
    );
    assert!(
        pprof
            .iter()
            .any(|p| p.to_string_lossy().contains("unknown-4200001-"))
    );

    // Google's own reader.
    match std::process::Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(&pprof[0])
        .output()
    {
        Ok(out) => {
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("synthetic_fn_"), "{text}");
        }
        Err(e) if std::env::var_os("CI").is_some() => panic!("go is required in CI: {e}"),
        Err(e) => eprintln!("skipping the go tool pprof check: {e}"),
    }
}

#[test]
fn byte_cap_rotates_the_oldest_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pprof");
    let mut config = AgentConfig {
        export_interval: Duration::from_millis(50),
        ..AgentConfig::default()
    };
    config.exporters.pprof = Some(DirConfig {
        directory: dir.clone(),
        max_bytes: 6 << 10,
    });
    // Left by an earlier agent: a finished file (oldest, so rotated out first) and a half-written
    // one from a crash (removed at start).
    std::fs::create_dir_all(&dir).unwrap();
    let earlier = dir.join("old-1-0-000001.pb.gz");
    std::fs::write(&earlier, vec![0u8; 1024]).unwrap();
    let old_time = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&earlier)
        .unwrap()
        .set_modified(old_time)
        .unwrap();
    let crashed = dir.join("old-1-0-000002.pb.gz.partial");
    std::fs::write(&crashed, vec![0u8; 100 << 10]).unwrap();
    let stats = run(&config, vec![4_200_002], 3000);
    assert!(
        !earlier.exists(),
        "the earlier agent's file was rotated out first"
    );
    assert!(!crashed.exists(), "the half-written file was removed");
    assert_eq!(stats.exporters[0].exported, 3000);
    let left = files(&dir, ".pb.gz");
    let bytes: u64 = left.iter().map(|p| p.metadata().unwrap().len()).sum();
    assert!(bytes <= 6 << 10, "{bytes} bytes left, cap is 6 KiB");
    assert!(!left.is_empty());
    // Only some of the samples are left: the oldest files went first.
    let total: i64 = left.iter().map(|p| samples_in(p, Format::Pprof)).sum();
    assert!(total < 3000, "older files were deleted");
    assert!(files(&dir, ".partial").is_empty());
}
