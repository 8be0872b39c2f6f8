//! The configuration files shipped in `deploy/` parse and pass the checks.

use super::*;

fn deploy(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(name)
}

#[test]
fn shipped_node_config_is_valid() {
    let c = AgentConfig::load(&deploy("agent.toml")).unwrap();
    assert_eq!(c, {
        let mut d = AgentConfig::default();
        d.exporters.otlp = Some(OtlpConfig::default());
        d
    });
}

#[test]
fn config_embedded_in_the_kubernetes_manifest_is_valid() {
    let yaml = std::fs::read_to_string(deploy("kubernetes.yaml")).unwrap();
    let start = yaml.find("agent.toml: |\n").unwrap() + "agent.toml: |\n".len();
    let body: String = yaml[start..]
        .lines()
        .take_while(|l| l.starts_with("    "))
        .map(|l| format!("{}\n", &l[4..]))
        .collect();
    let c = AgentConfig::from_toml(&body, Path::new("kubernetes.yaml")).unwrap();
    assert!(c.exporters.otlp.is_some());
}
