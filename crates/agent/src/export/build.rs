//! Builds the configured exporters.

use rootline_formats::Format;

use super::dir::DirExporter;
use super::otlp::{OtlpExporter, OtlpSettings};
use super::{ExportError, Exporter};
use crate::config::AgentConfig;

/// The exporters `config` asks for, in the order otlp, pprof, rlp. `env` looks up environment
/// variables (pass `|k| std::env::var(k).ok()`). An empty list means no exporter is configured.
pub fn build_exporters(
    config: &AgentConfig,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Vec<Box<dyn Exporter>>, ExportError> {
    let mut exporters: Vec<Box<dyn Exporter>> = Vec::new();
    if let Some(otlp) = &config.exporters.otlp {
        super::otlp::check_protocol(&env)?;
        let settings = OtlpSettings::resolve(otlp, config.export_timeout, env);
        let encoder = super::otlp::default_encoder()
            .ok_or_else(|| ExportError::Encode("this build has no OTLP profiles writer".into()))?;
        exporters.push(Box::new(OtlpExporter::new(settings, encoder)?));
    }
    for (name, dir, extension) in [
        ("pprof", &config.exporters.pprof, ".pb.gz"),
        ("rlp", &config.exporters.rlp, ".rlp"),
    ] {
        let Some(dir) = dir else { continue };
        let format = Format::from_name(name)
            .ok_or_else(|| ExportError::Encode(format!("this build has no {name} writer")))?;
        exporters.push(Box::new(DirExporter::new(
            name,
            format,
            extension,
            &dir.directory,
            dir.max_bytes as u64,
        )?));
    }
    Ok(exporters)
}
