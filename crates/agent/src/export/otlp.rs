//! OTLP/HTTP protobuf export to an OpenTelemetry Collector's `/v1development/profiles`.
//!
//! Endpoint, headers and resource follow the OpenTelemetry environment variables:
//! `OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT` (used as is), else `OTEL_EXPORTER_OTLP_ENDPOINT` (with
//! `/v1development/profiles` appended), else `http://localhost:4318/v1development/profiles`; an
//! `endpoint` in the config file takes precedence over both. `OTEL_EXPORTER_OTLP_HEADERS` and
//! `…_PROFILES_HEADERS` add `key=value,…` headers (a header in both: the signal-specific value; in
//! the config too: the config's); `OTEL_RESOURCE_ATTRIBUTES` adds resource
//! attributes and `OTEL_SERVICE_NAME` sets `service.name`. Each process's profile goes out as one
//! request whose resource carries `host.name`, `process.pid`, `process.executable.name`,
//! `process.command_line`, `process.executable.path` and, in a container, `container.id` (and in
//! a Kubernetes pod, `k8s.pod.uid`; both from the cgroup path).
//! Bodies are gzipped; an attempt that times out, fails to connect or gets 408/429/5xx is retried
//! with exponential backoff, waiting at least what a 429/503 `Retry-After` asks (up to
//! [`MAX_RETRY_AFTER`]; a longer wait fails the export at once); a failed TLS handshake is not
//! retried (see [`super::tls`]). Once the receiver has failed for one process (retries spent, or no
//! TLS), the other processes of the same export are not sent: their samples fail at once instead of
//! each costing the full timeout and retries, so a dead receiver costs one process's retries per
//! export. During shutdown no attempt runs past the deadline the agent sets (`shutdown_timeout`).
//! HTTPS uses rustls, with the WebPKI roots or the CA file of `certificate` /
//! `OTEL_EXPORTER_OTLP_CERTIFICATE`, and a client certificate for mutual TLS when configured.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use flate2::Compression;
use flate2::write::GzEncoder;

use super::tls::{self, TlsFiles};
use super::{ExportError, Exporter, RequestCounts};
use crate::batch::{ExportBatch, ProcessProfile};
use crate::config::OtlpConfig;
use rootline_profile::Profile;

/// Longest `Retry-After` an export waits for before its next attempt; a longer one fails the
/// export (the next export tries again).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// Path of the profiles signal under an OTLP/HTTP base URL.
pub const PROFILES_PATH: &str = "/v1development/profiles";

/// Turns one process's profile and its resource attributes into the bytes of a protobuf
/// `ExportProfilesServiceRequest`.
pub trait OtlpEncoder: Send {
    /// Encodes `profile` with `resource` as the request's resource attributes.
    fn encode(
        &self,
        profile: &Profile,
        resource: &[(String, String)],
    ) -> Result<Vec<u8>, ExportError>;
}

/// The encoder backed by rootline-formats' OTLP profiles writer (proto v1.10).
pub fn default_encoder() -> Option<Box<dyn OtlpEncoder>> {
    Some(Box::new(FormatsEncoder))
}

/// [`OtlpEncoder`] over [`rootline_formats::otlp::to_request`], with the agent's resource.
#[derive(Debug, Clone, Copy, Default)]
pub struct FormatsEncoder;

/// Resource attributes whose values are integers in the OpenTelemetry semantic conventions.
const INT_ATTRIBUTES: &[&str] = &["process.pid", "process.parent_pid"];

impl OtlpEncoder for FormatsEncoder {
    fn encode(
        &self,
        profile: &Profile,
        resource: &[(String, String)],
    ) -> Result<Vec<u8>, ExportError> {
        use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
        use prost::Message;

        let mut request = rootline_formats::otlp::to_request(profile);
        let attributes: Vec<KeyValue> = resource
            .iter()
            .map(|(key, value)| {
                let value = match value.parse::<i64>() {
                    Ok(n) if INT_ATTRIBUTES.contains(&key.as_str()) => Value::IntValue(n),
                    _ => Value::StringValue(value.clone()),
                };
                KeyValue {
                    key: key.clone(),
                    value: Some(AnyValue { value: Some(value) }),
                    ..KeyValue::default()
                }
            })
            .collect();
        for rp in &mut request.resource_profiles {
            rp.resource.get_or_insert_with(Default::default).attributes = attributes.clone();
        }
        Ok(request.encode_to_vec())
    }
}

/// Where and how to send, resolved from the config and the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpSettings {
    /// Full URL of the profiles endpoint.
    pub url: String,
    /// HTTP headers added to every request.
    pub headers: Vec<(String, String)>,
    /// Resource attributes added to every request (before the per-process ones).
    pub resource: BTreeMap<String, String>,
    /// `service.name`, when set.
    pub service_name: Option<String>,
    /// Gzip bodies.
    pub gzip: bool,
    /// Time limit of one attempt.
    pub timeout: Duration,
    /// Retries after a failed attempt.
    pub retries: u32,
    /// First backoff; doubles on each retry.
    pub backoff: Duration,
    /// CA and client certificate files for HTTPS.
    pub tls: TlsFiles,
}

impl OtlpSettings {
    /// Resolves the settings from `config`, the export timeout and an environment lookup (pass
    /// `|k| std::env::var(k).ok()` for the real environment).
    pub fn resolve(
        config: &OtlpConfig,
        timeout: Duration,
        env: impl Fn(&str) -> Option<String>,
    ) -> OtlpSettings {
        let nonempty = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let url = config
            .endpoint
            .clone()
            .map(|e| with_signal_path(&e))
            .or_else(|| nonempty("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT"))
            .or_else(|| nonempty("OTEL_EXPORTER_OTLP_ENDPOINT").map(|e| with_signal_path(&e)))
            .unwrap_or_else(|| format!("http://localhost:4318{PROFILES_PATH}"));
        // As for the endpoint: the config wins, then the signal-specific variable, then the
        // generic one; a header set twice is sent once (names compared case-insensitively).
        let mut headers: Vec<(String, String)> = Vec::new();
        let mut set = |k: String, v: String| match headers
            .iter_mut()
            .find(|(name, _)| name.eq_ignore_ascii_case(&k))
        {
            Some(slot) => slot.1 = v,
            None => headers.push((k, v)),
        };
        for var in [
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_PROFILES_HEADERS",
        ] {
            if let Some(text) = nonempty(var) {
                for (k, v) in parse_key_values(&text) {
                    set(k, v);
                }
            }
        }
        for (k, v) in &config.headers {
            set(k.clone(), v.clone());
        }
        let mut resource = config.resource_attributes.clone();
        if let Some(text) = nonempty("OTEL_RESOURCE_ATTRIBUTES") {
            resource.extend(parse_key_values(&text));
        }
        // Config first, then the signal-specific variable, then the generic one (as for the
        // endpoint).
        let file = |configured: &Option<std::path::PathBuf>, suffix: &str| {
            configured.clone().or_else(|| {
                nonempty(&format!("OTEL_EXPORTER_OTLP_PROFILES_{suffix}"))
                    .or_else(|| nonempty(&format!("OTEL_EXPORTER_OTLP_{suffix}")))
                    .map(std::path::PathBuf::from)
            })
        };
        let tls = TlsFiles {
            certificate: file(&config.certificate, "CERTIFICATE"),
            client_certificate: file(&config.client_certificate, "CLIENT_CERTIFICATE"),
            client_key: file(&config.client_key, "CLIENT_KEY"),
        };
        let service_name = nonempty("OTEL_SERVICE_NAME")
            .or_else(|| config.service_name.clone())
            .or_else(|| resource.get("service.name").cloned());
        OtlpSettings {
            url,
            headers,
            resource,
            service_name,
            gzip: config.gzip,
            timeout,
            retries: config.retries,
            backoff: config.backoff,
            tls,
        }
    }
}

/// Refuses an OTLP protocol other than `http/protobuf` named by `OTEL_EXPORTER_OTLP_PROTOCOL` or
/// `OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL` (the signal-specific one wins): sending HTTP to a gRPC
/// port would only fail later with a less clear error.
pub fn check_protocol(env: impl Fn(&str) -> Option<String>) -> Result<(), ExportError> {
    let nonempty = |k: &str| {
        env(k)
            .filter(|v| !v.trim().is_empty())
            .map(|v| (k.to_string(), v))
    };
    let Some((var, value)) = nonempty("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL")
        .or_else(|| nonempty("OTEL_EXPORTER_OTLP_PROTOCOL"))
    else {
        return Ok(());
    };
    if value.trim() == "http/protobuf" {
        return Ok(());
    }
    Err(ExportError::Config(format!(
        "{var}={value}: rootline exports OTLP over HTTP with protobuf bodies only; set it to \
         http/protobuf (or unset it) and point the endpoint at the receiver's HTTP port (4318)"
    )))
}

/// `base` with `/v1development/profiles` appended, unless it already ends in it.
fn with_signal_path(base: &str) -> String {
    let base = base.trim().trim_end_matches('/');
    if base.ends_with(PROFILES_PATH) {
        base.to_string()
    } else {
        format!("{base}{PROFILES_PATH}")
    }
}

/// Parses the W3C-baggage-like `k1=v1,k2=v2` lists of the OTel environment variables
/// (percent-encoded values decoded; malformed entries skipped).
pub fn parse_key_values(text: &str) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|item| {
            let (k, v) = item.split_once('=')?;
            let k = percent_decode(k.trim());
            (!k.is_empty()).then(|| (k, percent_decode(v.trim())))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            let b = (hi * 16 + lo) as u8;
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The OTLP/HTTP exporter.
pub struct OtlpExporter {
    settings: OtlpSettings,
    encoder: Box<dyn OtlpEncoder>,
    http: ureq::Agent,
    host: Option<String>,
    requests: RequestCounts,
    /// Why the receiver is given up on for the rest of the current export, if it is.
    unavailable: Option<String>,
    /// Shutdown deadline: no attempt runs past it.
    deadline: Option<Instant>,
}

impl OtlpExporter {
    /// An exporter sending with `settings`, encoding with `encoder`. Fails when a certificate
    /// file of `settings.tls` cannot be read or parsed.
    pub fn new(
        settings: OtlpSettings,
        encoder: Box<dyn OtlpEncoder>,
    ) -> Result<OtlpExporter, ExportError> {
        let tls = settings.tls.load()?;
        let http = ureq::Agent::config_builder()
            .tls_config(tls)
            .timeout_global(Some(settings.timeout))
            .http_status_as_error(false)
            .user_agent(concat!("rootline-agent/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        Ok(OtlpExporter {
            settings,
            encoder,
            http,
            host: crate::host_name(),
            requests: RequestCounts::default(),
            unavailable: None,
            deadline: None,
        })
    }

    /// The resolved settings.
    pub fn settings(&self) -> &OtlpSettings {
        &self.settings
    }

    /// Resource attributes of one process's request.
    pub fn resource_for(&self, process: &ProcessProfile) -> Vec<(String, String)> {
        let mut attrs: BTreeMap<String, String> = self.settings.resource.clone();
        let info = &process.process;
        if let Some(host) = &self.host {
            attrs
                .entry("host.name".into())
                .or_insert_with(|| host.clone());
        }
        attrs.insert("process.pid".into(), info.pid.to_string());
        if let Some(comm) = &info.comm {
            attrs.insert("process.executable.name".into(), comm.clone());
        }
        if let Some(cmd) = &info.command_line {
            attrs.insert("process.command_line".into(), cmd.clone());
        }
        if let Some(exe) = &info.executable {
            attrs.insert("process.executable.path".into(), exe.clone());
        }
        if let Some(id) = &info.container_id {
            attrs.insert("container.id".into(), id.clone());
        }
        if let Some(uid) = &info.pod_uid {
            attrs.insert("k8s.pod.uid".into(), uid.clone());
        }
        let service = self
            .settings
            .service_name
            .clone()
            .or_else(|| info.comm.clone())
            .unwrap_or_else(|| "unknown_service".into());
        attrs.insert("service.name".into(), service);
        attrs.into_iter().collect()
    }

    fn send_once(&self, body: &[u8], timeout: Duration) -> Result<(), (ExportError, Failure)> {
        let mut request = self
            .http
            .post(&self.settings.url)
            .header("Content-Type", "application/x-protobuf");
        if self.settings.gzip {
            request = request.header("Content-Encoding", "gzip");
        }
        for (k, v) in &self.settings.headers {
            request = request.header(k.as_str(), v.as_str());
        }
        if timeout < self.settings.timeout {
            request = request.config().timeout_global(Some(timeout)).build();
        }
        match request.send(body) {
            Ok(mut response) => {
                let status = response.status().as_u16();
                if (200..300).contains(&status) {
                    return Ok(());
                }
                let body = response
                    .body_mut()
                    .with_config()
                    .limit(512)
                    .read_to_string()
                    .unwrap_or_default();
                // Throttling (429, 503) may say when to come back, in seconds.
                let retry_after = matches!(status, 429 | 503)
                    .then(|| response.headers().get("retry-after"))
                    .flatten()
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                let failure = match retry_after {
                    Some(wait) => Failure::RetryAfter(wait),
                    None if matches!(status, 408 | 429 | 500..=599) => Failure::Retry,
                    None => Failure::ThisRequest,
                };
                Err((ExportError::Status { status, body }, failure))
            }
            Err(e) => match tls::handshake_failure(&e, &self.settings.tls) {
                Some(message) => Err((
                    ExportError::Transport(format!("{}: {message}", self.settings.url)),
                    Failure::Unreachable,
                )),
                None => Err((
                    ExportError::Transport(format!("{}: {e}", self.settings.url)),
                    Failure::Retry,
                )),
            },
        }
    }

    /// Time left before the shutdown deadline (`None`: no deadline).
    fn time_left(&self) -> Option<Duration> {
        self.deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }
}

/// How an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// Worth another attempt (timeout, refused connection, 408/429/5xx).
    Retry,
    /// Throttled: the receiver asked for this wait before the next attempt (`Retry-After`).
    RetryAfter(Duration),
    /// The receiver rejected this request (4xx): the next process's may pass.
    ThisRequest,
    /// No request can get through (TLS handshake refused): do not retry.
    Unreachable,
}

impl Exporter for OtlpExporter {
    fn name(&self) -> &str {
        "otlp"
    }

    fn requests(&self) -> RequestCounts {
        self.requests
    }

    fn export_process(
        &mut self,
        _batch: &ExportBatch,
        process: &ProcessProfile,
    ) -> Result<(), ExportError> {
        let resource = self.resource_for(process);
        let raw = self.encoder.encode(&process.profile, &resource)?;
        let body = if self.settings.gzip {
            let mut gz = GzEncoder::new(Vec::with_capacity(raw.len() / 3), Compression::fast());
            gz.write_all(&raw)
                .and_then(|_| gz.finish())
                .map_err(|e| ExportError::Encode(e.to_string()))?
        } else {
            raw
        };
        if let Some(reason) = &self.unavailable {
            // The receiver already failed in this export: do not spend another timeout on it.
            return Err(ExportError::Transport(format!(
                "not sent, the receiver failed earlier in this export: {reason}"
            )));
        }
        let mut backoff = self.settings.backoff;
        let mut attempt = 0;
        loop {
            let timeout = match self.time_left() {
                None => self.settings.timeout,
                Some(left) if left.is_zero() => {
                    let reason = "the shutdown deadline (shutdown_timeout) has passed".to_string();
                    self.unavailable = Some(reason.clone());
                    return Err(ExportError::Transport(format!("not sent: {reason}")));
                }
                Some(left) => left.min(self.settings.timeout),
            };
            self.requests.attempts += 1;
            self.requests.retries += u64::from(attempt > 0);
            match self.send_once(&body, timeout) {
                Ok(()) => return Ok(()),
                Err((err, Failure::ThisRequest)) => return Err(err),
                Err((err, failure)) => {
                    let wait = match failure {
                        Failure::RetryAfter(asked) => asked.max(backoff),
                        _ => backoff,
                    };
                    let out_of_time = self.time_left().is_some_and(|left| left <= wait);
                    if failure == Failure::Unreachable
                        || attempt >= self.settings.retries
                        || out_of_time
                    {
                        self.unavailable = Some(err.to_string());
                        return Err(err);
                    }
                    if wait > MAX_RETRY_AFTER {
                        // Honouring it would stall every other sample behind this export.
                        let err = ExportError::Transport(format!(
                            "{err}; the receiver asked to retry after {} s, longer than the {} s \
                             an export waits, so this export gives up",
                            wait.as_secs(),
                            MAX_RETRY_AFTER.as_secs()
                        ));
                        self.unavailable = Some(err.to_string());
                        return Err(err);
                    }
                    tracing::debug!("OTLP attempt {} failed, retrying: {err}", attempt + 1);
                    std::thread::sleep(wait);
                    backoff = backoff.saturating_mul(2);
                    attempt += 1;
                }
            }
        }
    }

    fn end_batch(&mut self, _batch: &ExportBatch) -> Result<(), ExportError> {
        self.unavailable = None;
        Ok(())
    }

    fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn endpoint_precedence() {
        let c = OtlpConfig::default();
        let t = Duration::from_secs(1);
        let s = OtlpSettings::resolve(&c, t, env(&[]));
        assert_eq!(s.url, "http://localhost:4318/v1development/profiles");
        let s = OtlpSettings::resolve(
            &c,
            t,
            env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318/")]),
        );
        assert_eq!(s.url, "https://c:4318/v1development/profiles");
        let s = OtlpSettings::resolve(
            &c,
            t,
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318/"),
                ("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", "http://p:1/custom"),
            ]),
        );
        assert_eq!(s.url, "http://p:1/custom");
        let c = OtlpConfig {
            endpoint: Some("http://127.0.0.1:9".into()),
            ..OtlpConfig::default()
        };
        let s = OtlpSettings::resolve(&c, t, env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x")]));
        assert_eq!(s.url, "http://127.0.0.1:9/v1development/profiles");
    }

    #[test]
    fn headers_resource_and_service_from_env() {
        let s = OtlpSettings::resolve(
            &OtlpConfig::default(),
            Duration::from_secs(1),
            env(&[
                ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%20b, x=1,bad,é=%é%"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "deployment.environment=prod,k8s.node.name=n1",
                ),
                ("OTEL_SERVICE_NAME", "checkout"),
            ]),
        );
        assert_eq!(
            s.headers,
            vec![
                ("api-key".into(), "a b".into()),
                ("x".into(), "1".into()),
                ("é".into(), "%é%".into())
            ]
        );
        assert_eq!(s.resource["k8s.node.name"], "n1");
        assert_eq!(s.service_name.as_deref(), Some("checkout"));
    }

    #[test]
    fn certificate_files_config_then_signal_then_generic() {
        let t = Duration::from_secs(1);
        let vars = env(&[
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/generic/ca.pem"),
            (
                "OTEL_EXPORTER_OTLP_PROFILES_CERTIFICATE",
                "/profiles/ca.pem",
            ),
            (
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                "/generic/client.pem",
            ),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/generic/key.pem"),
        ]);
        let s = OtlpSettings::resolve(&OtlpConfig::default(), t, &vars);
        assert_eq!(
            s.tls,
            TlsFiles {
                certificate: Some("/profiles/ca.pem".into()),
                client_certificate: Some("/generic/client.pem".into()),
                client_key: Some("/generic/key.pem".into()),
            }
        );
        let c = OtlpConfig {
            certificate: Some("/etc/ca.pem".into()),
            ..OtlpConfig::default()
        };
        let s = OtlpSettings::resolve(&c, t, &vars);
        assert_eq!(s.tls.certificate, Some("/etc/ca.pem".into()));
        let s = OtlpSettings::resolve(&OtlpConfig::default(), t, env(&[]));
        assert_eq!(s.tls, TlsFiles::default());
    }

    #[test]
    fn headers_signal_specific_and_config_win() {
        let c = OtlpConfig {
            headers: [("X-Tenant".to_string(), "config".to_string())].into(),
            ..OtlpConfig::default()
        };
        let s = OtlpSettings::resolve(
            &c,
            Duration::from_secs(1),
            env(&[
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "api-key=generic,x-tenant=env,a=1",
                ),
                ("OTEL_EXPORTER_OTLP_PROFILES_HEADERS", "Api-Key=profiles"),
            ]),
        );
        assert_eq!(
            s.headers,
            vec![
                ("api-key".into(), "profiles".into()),
                ("x-tenant".into(), "config".into()),
                ("a".into(), "1".into()),
            ]
        );
    }

    #[test]
    fn only_http_protobuf_is_accepted() {
        assert!(check_protocol(env(&[])).is_ok());
        assert!(check_protocol(env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")])).is_ok());
        let err = check_protocol(env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc") && err.contains("4318"),
            "{err}"
        );
        // The signal-specific variable wins, both ways.
        assert!(
            check_protocol(env(&[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL", "http/protobuf"),
            ]))
            .is_ok()
        );
        let err = check_protocol(env(&[(
            "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL",
            "http/json",
        )]))
        .unwrap_err()
        .to_string();
        assert!(err.contains("PROFILES_PROTOCOL=http/json"), "{err}");
    }
}
