//! The OpenTelemetry Collector's configuration schema for the components a profiles pipeline of
//! rootline's deploy files uses, mirrored from the Collector's documented component configs with
//! unknown keys refused, and [`check`], which validates a whole configuration file.

// The schema structs exist to be deserialized: parsing is the check, most fields are not read.
#![allow(dead_code)]

use std::collections::BTreeMap;

use serde::Deserialize;

// ---- the Collector's configuration schema (the parts a profiles pipeline can use) --------------

/// Top level of a Collector configuration file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Collector {
    receivers: BTreeMap<String, serde_norway::Value>,
    #[serde(default)]
    processors: BTreeMap<String, serde_norway::Value>,
    exporters: BTreeMap<String, serde_norway::Value>,
    #[serde(default)]
    extensions: BTreeMap<String, serde_norway::Value>,
    #[serde(default)]
    connectors: BTreeMap<String, serde_norway::Value>,
    service: Service,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Service {
    #[serde(default)]
    extensions: Vec<String>,
    pipelines: BTreeMap<String, Pipeline>,
    #[serde(default)]
    telemetry: Option<Telemetry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Pipeline {
    receivers: Vec<String>,
    #[serde(default)]
    processors: Vec<String>,
    exporters: Vec<String>,
}

/// `service.telemetry`: the Collector's own logs and metrics.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Telemetry {
    #[serde(default)]
    logs: Option<TelemetryLogs>,
    #[serde(default)]
    metrics: Option<TelemetryMetrics>,
    #[serde(default)]
    resource: BTreeMap<String, Option<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TelemetryLogs {
    #[serde(default)]
    level: Option<LogLevel>,
    #[serde(default)]
    encoding: Option<LogEncoding>,
    #[serde(default)]
    development: Option<bool>,
    #[serde(default)]
    disable_caller: Option<bool>,
    #[serde(default)]
    disable_stacktrace: Option<bool>,
    #[serde(default)]
    output_paths: Vec<String>,
    #[serde(default)]
    error_output_paths: Vec<String>,
    #[serde(default)]
    initial_fields: BTreeMap<String, serde_norway::Value>,
    #[serde(default)]
    sampling: Option<serde_norway::Value>,
    #[serde(default)]
    processors: Vec<serde_norway::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
    Dpanic,
    Panic,
    Fatal,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum LogEncoding {
    Console,
    Json,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TelemetryMetrics {
    #[serde(default)]
    level: Option<MetricsLevel>,
    #[serde(default)]
    readers: Vec<MetricReader>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum MetricsLevel {
    None,
    Basic,
    Normal,
    Detailed,
}

/// A metric reader of the Collector's internal telemetry (OpenTelemetry configuration schema).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MetricReader {
    #[serde(default)]
    pull: Option<PullReader>,
    #[serde(default)]
    periodic: Option<serde_norway::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PullReader {
    exporter: PullExporter,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PullExporter {
    prometheus: Prometheus,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Prometheus {
    host: String,
    port: u16,
    #[serde(default)]
    without_units: Option<bool>,
    #[serde(default)]
    without_type_suffix: Option<bool>,
    #[serde(default)]
    without_scope_info: Option<bool>,
}

/// `receivers.otlp`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OtlpReceiver {
    protocols: Protocols,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Protocols {
    #[serde(default)]
    grpc: Option<serde_norway::Value>,
    #[serde(default)]
    http: Option<HttpServer>,
}

/// `confighttp.ServerConfig` plus the OTLP receiver's URL paths (the profiles path is fixed at
/// `/v1development/profiles`; there is no key for it).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpServer {
    endpoint: String,
    #[serde(default)]
    tls: Option<ServerTls>,
    #[serde(default)]
    cors: Option<serde_norway::Value>,
    #[serde(default)]
    auth: Option<serde_norway::Value>,
    #[serde(default)]
    max_request_body_size: Option<u64>,
    #[serde(default)]
    include_metadata: Option<bool>,
    #[serde(default)]
    response_headers: BTreeMap<String, String>,
    #[serde(default)]
    compression_algorithms: Vec<String>,
    #[serde(default)]
    read_timeout: Option<String>,
    #[serde(default)]
    read_header_timeout: Option<String>,
    #[serde(default)]
    write_timeout: Option<String>,
    #[serde(default)]
    idle_timeout: Option<String>,
    #[serde(default)]
    keep_alives_enabled: Option<bool>,
    #[serde(default)]
    middlewares: Vec<serde_norway::Value>,
    #[serde(default)]
    traces_url_path: Option<String>,
    #[serde(default)]
    metrics_url_path: Option<String>,
    #[serde(default)]
    logs_url_path: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerTls {
    #[serde(default)]
    cert_file: Option<String>,
    #[serde(default)]
    key_file: Option<String>,
    #[serde(default)]
    ca_file: Option<String>,
    #[serde(default)]
    client_ca_file: Option<String>,
    #[serde(default)]
    min_version: Option<String>,
    #[serde(default)]
    max_version: Option<String>,
    #[serde(default)]
    reload_interval: Option<String>,
}

/// `exporters.debug`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DebugExporter {
    #[serde(default)]
    verbosity: Option<Verbosity>,
    #[serde(default)]
    sampling_initial: Option<u32>,
    #[serde(default)]
    sampling_thereafter: Option<u32>,
    #[serde(default)]
    use_internal_logger: Option<bool>,
    #[serde(default)]
    sending_queue: Option<serde_norway::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Verbosity {
    Basic,
    Normal,
    Detailed,
}

/// `exporters.otlp` (gRPC): `configgrpc.ClientConfig` plus queue and retry settings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OtlpGrpcExporter {
    endpoint: String,
    #[serde(default)]
    tls: Option<ClientTls>,
    #[serde(default)]
    compression: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    timeout: Option<String>,
    #[serde(default)]
    sending_queue: Option<serde_norway::Value>,
    #[serde(default)]
    retry_on_failure: Option<serde_norway::Value>,
    #[serde(default)]
    keepalive: Option<serde_norway::Value>,
    #[serde(default)]
    balancer_name: Option<String>,
    #[serde(default)]
    auth: Option<serde_norway::Value>,
    #[serde(default)]
    authority: Option<String>,
    #[serde(default)]
    wait_for_ready: Option<bool>,
    #[serde(default)]
    read_buffer_size: Option<u64>,
    #[serde(default)]
    write_buffer_size: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientTls {
    #[serde(default)]
    insecure: Option<bool>,
    #[serde(default)]
    insecure_skip_verify: Option<bool>,
    #[serde(default)]
    ca_file: Option<String>,
    #[serde(default)]
    cert_file: Option<String>,
    #[serde(default)]
    key_file: Option<String>,
    #[serde(default)]
    server_name_override: Option<String>,
    #[serde(default)]
    min_version: Option<String>,
    #[serde(default)]
    max_version: Option<String>,
}

// ---- checks ----------------------------------------------------------------------------------

/// Component types this check knows, with whether they support the profiles signal (from each
/// component's metadata: the OTLP receiver, the debug exporter and the OTLP exporters list
/// `profiles` at development stability).
fn supports_profiles(kind: &str) -> Option<bool> {
    match kind {
        "otlp" | "debug" | "otlphttp" => Some(true),
        _ => None,
    }
}

/// `type[/name]` → `type`.
fn component_type(id: &str) -> &str {
    id.split('/').next().unwrap_or(id)
}

fn host_port(endpoint: &str) -> Result<(String, u16), String> {
    let (host, port) = endpoint
        .rsplit_once(':')
        .ok_or_else(|| format!("endpoint {endpoint:?} is not host:port"))?;
    if host.is_empty() || host.contains('/') {
        return Err(format!(
            "endpoint {endpoint:?} is not host:port (no scheme, no path)"
        ));
    }
    let port = port
        .parse::<u16>()
        .map_err(|_| format!("endpoint {endpoint:?} has no valid port"))?;
    Ok((host.to_string(), port))
}

/// What a valid configuration exposes to the agent.
#[derive(Debug)]
pub struct Checked {
    pub http_port: u16,
    pub exporters: Vec<String>,
}

/// Validates a Collector configuration; the error says what is wrong.
pub fn check(yaml: &str) -> Result<Checked, String> {
    let config: Collector = serde_norway::from_str(yaml).map_err(|e| e.to_string())?;
    let mut http_port = None;
    for (id, body) in &config.receivers {
        match component_type(id) {
            "otlp" => {
                let r: OtlpReceiver =
                    serde_norway::from_value(body.clone()).map_err(|e| format!("{id}: {e}"))?;
                if r.protocols.grpc.is_none() && r.protocols.http.is_none() {
                    return Err(format!("{id}: must specify at least one protocol"));
                }
                if let Some(http) = &r.protocols.http {
                    http_port = Some(
                        host_port(&http.endpoint)
                            .map_err(|e| format!("{id}: {e}"))?
                            .1,
                    );
                }
            }
            other => return Err(format!("receiver type {other:?} is not checked here")),
        }
    }
    for (id, body) in &config.exporters {
        match component_type(id) {
            "debug" => {
                let _: DebugExporter = serde_norway::from_value(body.clone().or_empty())
                    .map_err(|e| format!("{id}: {e}"))?;
            }
            "otlp" => {
                let e: OtlpGrpcExporter =
                    serde_norway::from_value(body.clone()).map_err(|e| format!("{id}: {e}"))?;
                host_port(&e.endpoint).map_err(|e| format!("{id}: {e}"))?;
            }
            other => return Err(format!("exporter type {other:?} is not checked here")),
        }
    }
    if !config.processors.is_empty() || !config.connectors.is_empty() {
        return Err("processors and connectors are not checked here".into());
    }
    for ext in &config.service.extensions {
        if !config.extensions.contains_key(ext) {
            return Err(format!(
                "service.extensions names undefined extension {ext:?}"
            ));
        }
    }
    if let Some(t) = &config.service.telemetry
        && let Some(m) = &t.metrics
    {
        for reader in &m.readers {
            if reader.pull.is_some() == reader.periodic.is_some() {
                return Err("each metrics reader is either pull or periodic".into());
            }
            if let Some(pull) = &reader.pull {
                let p = &pull.exporter.prometheus;
                if p.host.is_empty() || p.port == 0 {
                    return Err("prometheus reader needs host and port".into());
                }
            }
        }
    }
    if config.service.pipelines.is_empty() {
        return Err("service.pipelines is empty".into());
    }
    let mut used_exporters = Vec::new();
    for (name, pipeline) in &config.service.pipelines {
        let signal = component_type(name);
        if !["traces", "metrics", "logs", "profiles"].contains(&signal) {
            return Err(format!("pipeline {name:?}: unknown signal {signal:?}"));
        }
        if signal != "profiles" {
            return Err(format!("pipeline {name:?} is not a profiles pipeline"));
        }
        if pipeline.receivers.is_empty() || pipeline.exporters.is_empty() {
            return Err(format!("pipeline {name:?} needs receivers and exporters"));
        }
        for (kind, ids, defined) in [
            ("receiver", &pipeline.receivers, &config.receivers),
            ("exporter", &pipeline.exporters, &config.exporters),
            ("processor", &pipeline.processors, &config.processors),
        ] {
            for id in ids {
                if !defined.contains_key(id) {
                    return Err(format!("pipeline {name:?} uses undefined {kind} {id:?}"));
                }
                if supports_profiles(component_type(id)) != Some(true) {
                    return Err(format!("{kind} {id:?} does not support profiles"));
                }
            }
        }
        used_exporters.extend(pipeline.exporters.iter().cloned());
    }
    for id in config.receivers.keys().chain(config.exporters.keys()) {
        let used = config
            .service
            .pipelines
            .values()
            .any(|p| p.receivers.contains(id) || p.exporters.contains(id));
        if !used {
            return Err(format!(
                "component {id:?} is defined but used by no pipeline"
            ));
        }
    }
    Ok(Checked {
        http_port: http_port.ok_or("no OTLP/HTTP receiver: rootline sends OTLP/HTTP")?,
        exporters: used_exporters,
    })
}

trait OrEmpty {
    fn or_empty(self) -> Self;
}

impl OrEmpty for serde_norway::Value {
    /// `debug:` with no body is a null value; the Collector takes it as all defaults.
    fn or_empty(self) -> Self {
        if self.is_null() {
            serde_norway::Value::Mapping(Default::default())
        } else {
            self
        }
    }
}
