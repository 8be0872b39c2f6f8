//! OTLP over HTTPS against a real rustls server on 127.0.0.1 with certificates made in the test
//! (rcgen): a private CA and a client certificate given through the OpenTelemetry environment
//! variables deliver every sample; a CA that did not sign the server's certificate, or a missing
//! client certificate, fails with a log line that says what to fix, is not retried, and every
//! sample is counted as failed.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::receiver::Receiver;
use common::{children, run_synthetic_until_delivered, wait_for};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rootline_agent::config::OtlpConfig;
use rootline_agent::{AgentConfig, Stats, SyntheticConfig, build_exporters};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A CA, a server certificate for 127.0.0.1 it signed, and a client certificate it signed, as PEM
/// files in a directory.
struct Pki {
    _dir: tempfile::TempDir,
    ca_pem: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    server_chain: Vec<CertificateDer<'static>>,
    server_key: PrivateKeyDer<'static>,
    ca_der: CertificateDer<'static>,
}

fn make_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn make_pki(ca_name: &str) -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let ca = make_ca(ca_name);

    let mut server =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".into()]).unwrap();
    server
        .distinguished_name
        .push(DnType::CommonName, "otlp receiver");
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = KeyPair::generate().unwrap();
    let server_cert = server.signed_by(&server_key, &ca).unwrap();

    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    client
        .distinguished_name
        .push(DnType::CommonName, "rootline agent");
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate().unwrap();
    let client_cert = client.signed_by(&client_key, &ca).unwrap();

    let write = |name: &str, text: &str| -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    Pki {
        ca_pem: write("ca.pem", &ca.pem()),
        client_cert: write("client.pem", &client_cert.pem()),
        client_key: write("client-key.pem", &client_key.serialize_pem()),
        server_chain: vec![server_cert.der().clone()],
        server_key: PrivatePkcs8KeyDer::from(server_key.serialize_der()).into(),
        ca_der: ca.der().clone(),
        _dir: dir,
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Server configuration presenting `pki`'s server certificate; with `require_client`, only
/// clients with a certificate signed by `pki`'s CA are accepted.
fn server_config(pki: &Pki, require_client: bool) -> Arc<rustls::ServerConfig> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = if require_client {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(pki.ca_der.clone()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        )
        .build()
        .unwrap();
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    Arc::new(
        builder
            .with_single_cert(pki.server_chain.clone(), pki.server_key.clone_key())
            .unwrap(),
    )
}

/// Log lines of every test in this binary (the exporter logs from its own thread, so the
/// subscriber is global).
fn logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        struct Sink;
        impl Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                logs().lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let _ = tracing_subscriber::fmt()
            .with_writer(|| Sink)
            .with_ansi(false)
            .try_init();
        Mutex::new(Vec::new())
    })
}

fn log_lines_with(needle: &str) -> Vec<String> {
    String::from_utf8_lossy(&logs().lock().unwrap())
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

/// Runs the agent on `pids`, with exporters from `config` and the environment `env`, until the
/// synthetic source has delivered `samples`, then stops it.
fn run(config: &AgentConfig, env: &[(&str, String)], pids: Vec<u32>, samples: u64) -> Stats {
    let _ = logs();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let lookup = move |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let exporters = build_exporters(config, lookup).unwrap();
    let synth = SyntheticConfig {
        pids,
        stacks: 20,
        depth: 6,
        rate_per_sec: 2000,
        limit: Some(samples),
    };
    run_synthetic_until_delivered(config, synth, exporters, Duration::from_secs(20))
}

fn config(otlp: OtlpConfig) -> AgentConfig {
    let mut config = AgentConfig {
        export_interval: Duration::from_millis(200),
        export_timeout: Duration::from_secs(3),
        ..AgentConfig::default()
    };
    config.exporters.otlp = Some(OtlpConfig {
        retries: 2,
        backoff: Duration::from_millis(20),
        ..otlp
    });
    config
}

fn path(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

#[test]
fn private_ca_and_client_certificate_from_the_environment() {
    let pki = make_pki("rootline test CA");
    let receiver = Receiver::start_tls(server_config(&pki, true));
    let mut kids = children(3);
    let pids: Vec<u32> = kids.iter().map(|c| c.id()).collect();
    // Everything about the connection comes from the OpenTelemetry variables.
    let env = [
        (
            "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
            format!("{}/v1development/profiles", receiver.https_endpoint()),
        ),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", path(&pki.ca_pem)),
        (
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            path(&pki.client_cert),
        ),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", path(&pki.client_key)),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=tls-test,k8s.node.name=node-1".into(),
        ),
    ];
    let stats = run(&config(OtlpConfig::default()), &env, pids.clone(), 1500);
    for kid in &mut kids {
        let _ = kid.kill();
        let _ = kid.wait();
    }

    let got = receiver.received();
    let e = &stats.exporters[0];
    assert_eq!(got.bad_requests, 0);
    assert_eq!(stats.captured, 1500);
    assert_eq!(
        (stats.dropped, e.failed, e.exported),
        (0, 0, 1500),
        "{stats:?}"
    );
    assert_eq!(got.total(), e.exported, "{got:?}");
    for pid in &pids {
        assert_eq!(got.samples_by_pid[&i64::from(*pid)], 500, "{got:?}");
        let attrs = &got.resources[&i64::from(*pid)];
        assert_eq!(attrs["deployment.environment"], "tls-test");
        assert_eq!(attrs["k8s.node.name"], "node-1");
    }
    // Every request was decoded; none needed a retry; no handshake failed.
    assert_eq!(e.retries, 0);
    assert_eq!(e.attempts, got.requests, "{stats:?}");
    assert!(receiver.state.handshakes.load(Relaxed) >= 1);
    assert_eq!(
        receiver.state.handshake_failures.load(Relaxed),
        0,
        "{}",
        receiver.state.last_handshake_error.lock().unwrap()
    );
}

#[test]
fn wrong_ca_fails_with_a_clear_error_and_exact_counts() {
    let server_pki = make_pki("the receiver's CA");
    let other = make_pki("some other CA");
    let receiver = Receiver::start_tls(server_config(&server_pki, false));
    // The CA file in the config file this time; retries are configured but must not be spent.
    let otlp = OtlpConfig {
        endpoint: Some(receiver.https_endpoint()),
        certificate: Some(other.ca_pem.clone()),
        ..OtlpConfig::default()
    };
    let stats = run(&config(otlp), &[], vec![std::process::id()], 600);

    let e = &stats.exporters[0];
    assert_eq!(stats.captured, 600);
    assert_eq!(
        (stats.dropped, e.exported, e.failed),
        (0, 0, 600),
        "{stats:?}"
    );
    assert_eq!(
        e.retries, 0,
        "a certificate error is not retried: {stats:?}"
    );
    assert!(e.attempts >= 2, "several exports: {stats:?}");
    assert!(e.batches_failed >= 2 && e.batches_ok == 0, "{stats:?}");
    // Each attempt reached the receiver and failed there; nothing was decoded.
    assert!(wait_for(Duration::from_secs(5), || receiver
        .state
        .handshake_failures
        .load(Relaxed)
        == e.attempts));
    assert_eq!(receiver.received().requests, 0);
    let lines = log_lines_with(&other.ca_pem.display().to_string());
    assert!(!lines.is_empty(), "no log line names the CA file");
    assert!(
        lines.iter().all(|l| l.contains("WARN")
            && l.contains("export failed")
            && l.contains("TLS handshake failed: invalid peer certificate: UnknownIssuer")
            && l.contains("use the CA that signed it")),
        "{lines:#?}"
    );
    let loss = log_lines_with("LOSS OF PROFILING DATA");
    assert!(
        loss.iter()
            .any(|l| l.contains("could not be delivered by otlp")),
        "{loss:#?}"
    );
}

#[test]
fn missing_client_certificate_is_named() {
    let pki = make_pki("mtls CA");
    let receiver = Receiver::start_tls(server_config(&pki, true));
    let otlp = OtlpConfig {
        endpoint: Some(receiver.https_endpoint()),
        certificate: Some(pki.ca_pem.clone()),
        ..OtlpConfig::default()
    };
    let port = receiver.addr.port().to_string();
    let stats = run(&config(otlp), &[], vec![std::process::id()], 300);
    let e = &stats.exporters[0];
    assert_eq!((e.exported, e.failed, e.retries), (0, 300, 0), "{stats:?}");
    assert_eq!(receiver.received().requests, 0);
    let lines: Vec<String> = log_lines_with("export failed")
        .into_iter()
        .filter(|l| l.contains(&port))
        .collect();
    assert!(!lines.is_empty());
    assert!(
        lines.iter().all(|l| l.contains("TLS handshake failed")
            && l.contains("set client_certificate and client_key")),
        "{lines:#?}"
    );
}

#[test]
fn private_ca_without_a_ca_file_points_to_the_setting() {
    let pki = make_pki("unlisted CA");
    let receiver = Receiver::start_tls(server_config(&pki, false));
    // Only the endpoint: the receiver's certificate is checked against the WebPKI roots.
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.https_endpoint())];
    let port = receiver.addr.port().to_string();
    let stats = run(
        &config(OtlpConfig::default()),
        &env,
        vec![std::process::id()],
        300,
    );
    let e = &stats.exporters[0];
    assert_eq!((e.exported, e.failed, e.retries), (0, 300, 0), "{stats:?}");
    let lines: Vec<String> = log_lines_with("export failed")
        .into_iter()
        .filter(|l| l.contains(&port))
        .collect();
    assert!(!lines.is_empty());
    assert!(
        lines.iter().all(|l| l.contains("UnknownIssuer")
            && l.contains("WebPKI roots")
            && l.contains("OTEL_EXPORTER_OTLP_CERTIFICATE")),
        "{lines:#?}"
    );
}

#[test]
fn https_to_a_plain_http_receiver_says_so() {
    let receiver = Receiver::start();
    let otlp = OtlpConfig {
        endpoint: Some(receiver.https_endpoint()),
        ..OtlpConfig::default()
    };
    let port = receiver.addr.port().to_string();
    let stats = run(&config(otlp), &[], vec![std::process::id()], 300);
    let lines: Vec<String> = log_lines_with("export failed")
        .into_iter()
        .filter(|l| l.contains(&port))
        .collect();
    assert!(!lines.is_empty());
    assert!(
        lines
            .iter()
            .all(|l| l.contains("TLS handshake failed") && l.contains("speaks HTTPS")),
        "{lines:#?}"
    );
    let e = &stats.exporters[0];
    assert_eq!((e.exported, e.failed, e.retries), (0, 300, 0), "{stats:?}");
}
