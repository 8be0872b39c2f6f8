//! Where and how the OTLP exporter sends: the endpoint, headers, resource attributes, TLS files
//! and limits, resolved from `[exporters.otlp]` and the OpenTelemetry environment variables.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::PROFILES_PATH;
use crate::config::OtlpConfig;
use crate::export::ExportError;
use crate::export::tls::TlsFiles;

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
    /// Resolves the settings from `config`, the export timeout (used when neither the config nor
    /// the environment sets the OTLP one) and an environment lookup (pass
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
        let file = |configured: &Option<PathBuf>, suffix: &str| {
            configured.clone().or_else(|| {
                nonempty(&format!("OTEL_EXPORTER_OTLP_PROFILES_{suffix}"))
                    .or_else(|| nonempty(&format!("OTEL_EXPORTER_OTLP_{suffix}")))
                    .map(PathBuf::from)
            })
        };
        let tls = TlsFiles {
            certificate: file(&config.certificate, "CERTIFICATE"),
            client_certificate: file(&config.client_certificate, "CLIENT_CERTIFICATE"),
            client_key: file(&config.client_key, "CLIENT_KEY"),
        };
        // Config, then the signal-specific variable, then the generic one; values the
        // specification does not allow are ignored with a warning.
        let signal_var = |suffix: &str| {
            [
                format!("OTEL_EXPORTER_OTLP_PROFILES_{suffix}"),
                format!("OTEL_EXPORTER_OTLP_{suffix}"),
            ]
            .into_iter()
            .find_map(|var| nonempty(&var).map(|value| (var, value.trim().to_string())))
        };
        let gzip = config
            .gzip
            .unwrap_or_else(|| match signal_var("COMPRESSION") {
                Some((_, v)) if v == "none" => false,
                Some((_, v)) if v == "gzip" => true,
                Some((var, v)) => {
                    tracing::warn!("ignoring {var}={v}: use gzip or none");
                    true
                }
                None => true,
            });
        let timeout = config
            .timeout
            .unwrap_or_else(|| match signal_var("TIMEOUT") {
                Some((var, v)) => match v.parse::<u64>() {
                    Ok(ms) if ms > 0 => Duration::from_millis(ms),
                    _ => {
                        tracing::warn!(
                            "ignoring {var}={v}: give a positive number of milliseconds"
                        );
                        timeout
                    }
                },
                None => timeout,
            });
        let service_name = nonempty("OTEL_SERVICE_NAME")
            .or_else(|| config.service_name.clone())
            .or_else(|| resource.get("service.name").cloned());
        OtlpSettings {
            url,
            headers,
            resource,
            service_name,
            gzip,
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
    fn timeout_and_compression_precedence() {
        let t = Duration::from_secs(5);
        let resolve = |c: &OtlpConfig, vars: &[(&str, &str)]| {
            let s = OtlpSettings::resolve(c, t, env(vars));
            (s.timeout, s.gzip)
        };
        let c = OtlpConfig::default();
        assert_eq!(resolve(&c, &[]), (t, true));
        let generic = [
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
        ];
        assert_eq!(resolve(&c, &generic), (Duration::from_millis(2500), false));
        let both = [
            generic[0],
            generic[1],
            ("OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT", "700"),
            ("OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION", "gzip"),
        ];
        assert_eq!(resolve(&c, &both), (Duration::from_millis(700), true));
        let configured = OtlpConfig {
            timeout: Some(Duration::from_secs(9)),
            gzip: Some(false),
            ..OtlpConfig::default()
        };
        assert_eq!(resolve(&configured, &both), (Duration::from_secs(9), false));
        // Values the specification does not allow are ignored.
        let bad = [
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"),
        ];
        assert_eq!(resolve(&c, &bad), (t, true));
        assert_eq!(
            resolve(&c, &[("OTEL_EXPORTER_OTLP_TIMEOUT", "0")]),
            (t, true)
        );
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
