//! Log output for the agent: human-readable lines or JSON objects, one per event, on stderr.
//! The level comes from `RUST_LOG` when set (e.g. `RUST_LOG=rootline_agent=debug`), else `info`.
//! Text lines are coloured only when stderr is a terminal, so log files and journals stay plain.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// `2026-01-01T00:00:00Z  INFO rootline_agent: status: …`
    #[default]
    Text,
    /// One JSON object per line, with the event's fields.
    Json,
}

/// Installs the global log subscriber. Returns false when one was already installed.
pub fn init(format: LogFormat) -> bool {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.try_init().is_ok(),
        LogFormat::Json => builder.json().flatten_event(true).try_init().is_ok(),
    }
}
