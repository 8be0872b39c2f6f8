//! A cgroup target, as for a Kubernetes pod: of two live processes, only the one placed in the
//! target cgroup is profiled. The cgroup is a real one made for the test (cgroup v2, or the v1
//! memory hierarchy on hybrid hosts); its path is matched against `/proc/PID/cgroup`. A process in
//! a pod's container cgroup named as the systemd cgroup driver names it
//! (`…-pod<uid>.slice/cri-containerd-<64 hex>.scope`) is exported over OTLP with `container.id`
//! and `k8s.pod.uid`.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::receiver::Receiver;
use common::{CollectingExporter, run_synthetic_until_delivered};
use rootline_agent::config::OtlpConfig;
use rootline_agent::{AgentConfig, SyntheticConfig, TargetConfig, build_exporters};

/// A fresh cgroup directory and its path as `/proc/PID/cgroup` shows it.
fn make_cgroup(name: &str) -> std::io::Result<(PathBuf, String)> {
    let v2 = PathBuf::from("/sys/fs/cgroup/cgroup.controllers").exists();
    let root = if v2 {
        PathBuf::from("/sys/fs/cgroup")
    } else {
        PathBuf::from("/sys/fs/cgroup/memory")
    };
    let dir = root.join(name);
    std::fs::create_dir(&dir)?;
    Ok((dir, format!("/{name}")))
}

#[test]
fn only_processes_in_the_target_cgroup_are_profiled() {
    let name = format!("rootline-agent-test-{}", std::process::id());
    let (dir, path) = match make_cgroup(&name) {
        Ok(made) => made,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipping: cannot create a cgroup here: {e}");
            return;
        }
        Err(e) => panic!("cannot create a cgroup (the test runs as root in CI): {e}"),
    };
    let mut inside = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let mut outside = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    std::fs::write(dir.join("cgroup.procs"), inside.id().to_string()).unwrap();

    let config = AgentConfig {
        export_interval: Duration::from_millis(200),
        targets: TargetConfig {
            cgroups: vec![path.clone()],
            ..TargetConfig::default()
        },
        ..AgentConfig::default()
    };
    let synth = SyntheticConfig {
        pids: vec![inside.id(), outside.id()],
        stacks: 5,
        depth: 4,
        rate_per_sec: 1000,
        limit: Some(600),
    };
    let (exporter, collected, _) = CollectingExporter::new();
    let stats = run_synthetic_until_delivered(
        &config,
        synth,
        vec![Box::new(exporter)],
        Duration::from_secs(20),
    );
    for child in [&mut inside, &mut outside] {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = std::fs::remove_dir(&dir);

    assert_eq!(stats.captured, 300, "{stats:?}");
    assert_eq!(stats.ignored, 300, "{stats:?}");
    let collected = collected.lock().unwrap();
    let pids: std::collections::BTreeSet<u32> =
        collected.stacks.keys().map(|(pid, _)| *pid).collect();
    assert_eq!(pids.into_iter().collect::<Vec<_>>(), vec![inside.id()]);
    assert_eq!(collected.samples, 300);
}

#[test]
fn container_id_and_pod_uid_from_the_cgroup_reach_the_otlp_resource() {
    // A pod's container as the systemd cgroup driver names it, with ids unique to this run.
    let id = format!("{:064x}", (u64::from(std::process::id()) << 20) | 0xc0ffee);
    let uid = format!("0b6e3b0a-9c1f-4d2e-8f00-{:012x}", std::process::id());
    let pod = format!(
        "rootline-test-{}.slice/rootline-test-pod{}.slice",
        std::process::id(),
        uid.replace('-', "_")
    );
    let (top, _) = match make_cgroup(pod.split('/').next().unwrap()) {
        Ok(made) => made,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipping: cannot create a cgroup here: {e}");
            return;
        }
        Err(e) => panic!("cannot create a cgroup (the test runs as root in CI): {e}"),
    };
    let pod_dir = top.parent().unwrap().join(&pod);
    let dir = pod_dir.join(format!("cri-containerd-{id}.scope"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut inside = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let mut outside = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    std::fs::write(dir.join("cgroup.procs"), inside.id().to_string()).unwrap();

    let receiver = Receiver::start();
    let mut config = AgentConfig {
        export_interval: Duration::from_millis(200),
        ..AgentConfig::default()
    };
    config.exporters.otlp = Some(OtlpConfig {
        endpoint: Some(receiver.endpoint()),
        ..OtlpConfig::default()
    });
    let synth = SyntheticConfig {
        pids: vec![inside.id(), outside.id()],
        stacks: 5,
        depth: 4,
        rate_per_sec: 1000,
        limit: Some(400),
    };
    let exporters = build_exporters(&config, |_| None).unwrap();
    let stats = run_synthetic_until_delivered(&config, synth, exporters, Duration::from_secs(20));
    for child in [&mut inside, &mut outside] {
        let _ = child.kill();
        let _ = child.wait();
    }
    for d in [&dir, &pod_dir, &top] {
        let _ = std::fs::remove_dir(d);
    }

    assert_eq!(stats.exporters[0].exported, 400, "{stats:?}");
    let got = receiver.received();
    let attrs = &got.resources[&i64::from(inside.id())];
    assert_eq!(attrs.get("container.id"), Some(&id), "{attrs:?}");
    assert_eq!(attrs.get("k8s.pod.uid"), Some(&uid), "{attrs:?}");
    let attrs = &got.resources[&i64::from(outside.id())];
    // The test's own process may itself run in a container; it is not in ours.
    assert_ne!(attrs.get("container.id"), Some(&id), "{attrs:?}");
}
