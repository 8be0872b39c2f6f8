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

use super::tls;
use super::{ExportError, Exporter, RequestCounts};
use crate::batch::{ExportBatch, ProcessProfile};
use rootline_profile::Profile;

mod settings;

pub use settings::{OtlpSettings, check_protocol, parse_key_values};

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
        if let Some(reason) = &self.unavailable {
            // The receiver already failed in this export: do not spend another timeout (or
            // an encoding) on it.
            return Err(ExportError::Transport(format!(
                "not sent, the receiver failed earlier in this export: {reason}"
            )));
        }
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
