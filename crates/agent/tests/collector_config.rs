//! The shipped OpenTelemetry Collector configurations (`deploy/collector.yaml` and the ConfigMap in
//! `deploy/kubernetes.yaml`), checked as strictly as we can without a Collector binary: no Collector
//! build can be installed from the package registries this project uses, so the documented schema
//! of each component is mirrored (in `common/collector_schema.rs`) with every unknown key refused — as the Collector's config
//! loader refuses keys it does not use. Beyond the keys: every pipeline is a `profiles` pipeline
//! whose components exist and support the profiles signal, endpoints are `host:port`, enumerations
//! hold documented values, the Collector container runs with `--feature-gates=service.profilesSupport`,
//! and the agent's endpoint reaches the receiver's port and profiles path.

#[path = "common/collector_schema.rs"]
mod collector_schema;

use std::path::{Path, PathBuf};

use collector_schema::check;
use serde::Deserialize;

fn deploy(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(name)
}

/// The text of a `key: |` block in a YAML file, unindented.
fn block(yaml: &str, key: &str, indent: usize) -> String {
    let head = format!("{}{key}: |\n", " ".repeat(indent - 2));
    let start = yaml.find(&head).unwrap_or_else(|| panic!("no {key} block")) + head.len();
    yaml[start..]
        .lines()
        .take_while(|l| l.starts_with(&" ".repeat(indent)) || l.trim().is_empty())
        .map(|l| format!("{}\n", l.get(indent..).unwrap_or("")))
        .collect()
}

#[test]
fn shipped_collector_config_passes_the_schema() {
    let yaml = std::fs::read_to_string(deploy("collector.yaml")).unwrap();
    let checked = check(&yaml).unwrap_or_else(|e| panic!("deploy/collector.yaml: {e}"));
    assert_eq!(checked.http_port, 4318);
    assert!(checked.exporters.iter().any(|e| e == "debug"));
    // It documents the feature gate it needs.
    assert!(yaml.contains("--feature-gates=service.profilesSupport"));
    // It carries service.telemetry, so operators can watch the Collector itself.
    let doc: serde_norway::Value = serde_norway::from_str(&yaml).unwrap();
    assert!(doc["service"]["telemetry"]["metrics"]["readers"].is_sequence());
}

#[test]
fn kubernetes_collector_runs_the_profiles_pipeline_the_agent_reaches() {
    let manifest = std::fs::read_to_string(deploy("kubernetes.yaml")).unwrap();
    let collector = block(&manifest, "collector.yaml", 4);
    let checked = check(&collector).unwrap_or_else(|e| panic!("kubernetes.yaml ConfigMap: {e}"));

    let docs: Vec<serde_norway::Value> = serde_norway::Deserializer::from_str(&manifest)
        .map(|d| serde_norway::Value::deserialize(d).unwrap())
        .collect();
    let daemonset = |name: &str| {
        docs.iter()
            .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no DaemonSet {name}"))
            .clone()
    };
    let col = daemonset("otel-collector");
    let container = &col["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(
        args.iter().any(|a| {
            a.strip_prefix("--feature-gates=").is_some_and(|g| {
                g.split(',')
                    .any(|g| g.trim_start_matches('+') == "service.profilesSupport")
            })
        }),
        "the Collector needs --feature-gates=service.profilesSupport: {args:?}"
    );
    let ports = container["ports"].as_sequence().unwrap();
    assert!(
        ports.iter().any(
            |p| p["containerPort"].as_u64() == Some(u64::from(checked.http_port))
                && p["hostPort"].as_u64() == Some(u64::from(checked.http_port))
        ),
        "the receiver's port is published on the node: {ports:?}"
    );

    // The agent posts to that port on its node, under the receiver's fixed profiles path.
    let agent = daemonset("rootline-agent");
    let env = agent["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_sequence()
        .unwrap()
        .clone();
    let endpoint = env
        .iter()
        .find(|e| e["name"] == "OTEL_EXPORTER_OTLP_ENDPOINT")
        .and_then(|e| e["value"].as_str())
        .unwrap()
        .to_string();
    assert_eq!(endpoint, format!("http://$(NODE_IP):{}", checked.http_port));
    assert_eq!(
        rootline_agent::export::otlp::PROFILES_PATH,
        "/v1development/profiles"
    );
}

#[test]
fn the_check_refuses_what_the_collector_refuses() {
    let good = std::fs::read_to_string(deploy("collector.yaml")).unwrap();
    check(&good).unwrap();
    let cases = [
        // A misspelt key, as the Collector's "has invalid keys" error.
        ("verbosity: basic", "verbosty: basic", "verbosty"),
        // A value outside the enumeration.
        ("verbosity: basic", "verbosity: loud", "loud"),
        // An endpoint with a scheme where host:port is wanted.
        (
            "endpoint: 0.0.0.0:4318",
            "endpoint: http://0.0.0.0:4318",
            "host:port",
        ),
        // A pipeline of a signal that does not exist.
        ("    profiles:\n", "    profile:\n", "unknown signal"),
        // A pipeline naming a component that is not defined.
        (
            "exporters: [debug, otlp/backend]",
            "exporters: [debug, otlp/missing]",
            "undefined",
        ),
        // service.telemetry with a bad metrics level.
        ("level: normal", "level: verbose", "verbose"),
    ];
    for (from, to, needle) in cases {
        assert!(good.contains(from), "{from:?} not in collector.yaml");
        let bad = good.replacen(from, to, 1);
        let err = check(&bad).expect_err(&format!("{to:?} was accepted"));
        assert!(err.contains(needle), "{to:?}: {err}");
    }
}
