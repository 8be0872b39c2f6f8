//! TLS for the OTLP exporter (rustls through ureq): which CA to trust and which client certificate
//! to present, read from PEM files named by the config or by the OpenTelemetry environment
//! variables, and plain-language messages for handshakes that fail.
//!
//! With no CA file, the server is checked against the WebPKI (Mozilla) roots. With a CA file
//! (`certificate` in `[exporters.otlp]`, `OTEL_EXPORTER_OTLP_PROFILES_CERTIFICATE` or
//! `OTEL_EXPORTER_OTLP_CERTIFICATE`), only the certificates in that file are trusted, as the
//! OpenTelemetry specification describes. A client certificate and key (`client_certificate` and
//! `client_key`, or the `…_CLIENT_CERTIFICATE` / `…_CLIENT_KEY` variables) are presented when the
//! server asks for one (mutual TLS); both must be given, or neither.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig};

use super::ExportError;

/// The PEM files the exporter's TLS uses; `None` means the default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificates to trust instead of the WebPKI roots.
    pub certificate: Option<PathBuf>,
    /// Client certificate chain for mutual TLS.
    pub client_certificate: Option<PathBuf>,
    /// The client certificate's private key.
    pub client_key: Option<PathBuf>,
}

impl TlsFiles {
    /// Reads the files and builds ureq's TLS configuration. Every error names the file and the
    /// setting that pointed to it.
    pub fn load(&self) -> Result<TlsConfig, ExportError> {
        let mut builder = TlsConfig::builder();
        if let Some(path) = &self.certificate {
            let certs = read_certificates(path, "the OTLP CA certificate (certificate)")?;
            builder = builder.root_certs(RootCerts::Specific(Arc::new(certs)));
        }
        match (&self.client_certificate, &self.client_key) {
            (None, None) => {}
            (Some(cert), Some(key)) => {
                let chain = read_certificates(cert, "the OTLP client certificate")?;
                let key = read_key(key)?;
                builder = builder.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
            }
            _ => {
                return Err(ExportError::Config(
                    "an OTLP client certificate needs both client_certificate and client_key \
                     (OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY); \
                     only one is set"
                        .into(),
                ));
            }
        }
        Ok(builder.build())
    }
}

fn read_pem(path: &Path, what: &str) -> Result<Vec<u8>, ExportError> {
    std::fs::read(path).map_err(|e| {
        ExportError::Config(format!("cannot read {what} from {}: {e}", path.display()))
    })
}

fn read_certificates(path: &Path, what: &str) -> Result<Vec<Certificate<'static>>, ExportError> {
    let pem = read_pem(path, what)?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(PemItem::Certificate(cert)) => certs.push(cert),
            Ok(_) => {}
            Err(e) => {
                return Err(ExportError::Config(format!(
                    "{what} in {} is not valid PEM: {e}",
                    path.display()
                )));
            }
        }
    }
    if certs.is_empty() {
        return Err(ExportError::Config(format!(
            "{what}: {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        )));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKey<'static>, ExportError> {
    let pem = read_pem(path, "the OTLP client key")?;
    PrivateKey::from_pem(&pem).map_err(|e| {
        ExportError::Config(format!(
            "the OTLP client key in {} is not a PEM private key (PKCS#8, PKCS#1 or SEC1): {e}",
            path.display()
        ))
    })
}

/// When `error` is a failed TLS handshake, a message saying what failed and what to check;
/// `None` for other errors. Handshake failures are not worth retrying within one export: the
/// certificates will not change in the next second.
pub fn handshake_failure(error: &ureq::Error, files: &TlsFiles) -> Option<String> {
    let rustls_error = match error {
        ureq::Error::Rustls(e) => Some(e),
        ureq::Error::Io(io) => io.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()),
        _ => None,
    };
    if let Some(e) = rustls_error {
        let hint = match e {
            rustls::Error::InvalidCertificate(_) => match &files.certificate {
                Some(ca) => format!(
                    "the receiver's certificate is not accepted with the CA certificates in {} \
                     (certificate / OTEL_EXPORTER_OTLP_CERTIFICATE): use the CA that signed it",
                    ca.display()
                ),
                None => "the receiver's certificate is not accepted with the WebPKI roots; for a \
                         private CA set certificate (or OTEL_EXPORTER_OTLP_CERTIFICATE) to its PEM \
                         file"
                    .to_string(),
            },
            rustls::Error::AlertReceived(_) if files.client_certificate.is_none() => {
                "the receiver refused the connection; if it requires a client certificate, set \
                 client_certificate and client_key (or OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and \
                 OTEL_EXPORTER_OTLP_CLIENT_KEY)"
                    .to_string()
            }
            rustls::Error::AlertReceived(_) => {
                "the receiver refused the connection; check that it trusts the CA of the client \
                 certificate"
                    .to_string()
            }
            _ => "check that the endpoint speaks HTTPS".to_string(),
        };
        return Some(format!("TLS handshake failed: {e}; {hint}"));
    }
    match error {
        ureq::Error::Tls(e) => Some(format!("TLS setup failed: {e}")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_malformed_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles {
            certificate: Some(dir.path().join("nope.pem")),
            ..TlsFiles::default()
        };
        let err = files.load().unwrap_err().to_string();
        assert!(
            err.contains("nope.pem") && err.contains("CA certificate"),
            "{err}"
        );

        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let files = TlsFiles {
            certificate: Some(junk.clone()),
            ..TlsFiles::default()
        };
        let err = files.load().unwrap_err().to_string();
        assert!(
            err.contains("junk.pem") && err.contains("no PEM certificate"),
            "{err}"
        );

        let files = TlsFiles {
            client_key: Some(junk),
            ..TlsFiles::default()
        };
        let err = files.load().unwrap_err().to_string();
        assert!(err.contains("needs both"), "{err}");
    }
}
