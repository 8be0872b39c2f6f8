//! Where profiles go. An [`Exporter`] receives one [`ExportBatch`] per export (per period, or early
//! when a buffer filled up) and reports, per process, whether its samples got out. The exporter
//! thread runs every configured exporter on every batch and keeps exact counts for each.

mod build;
pub mod dir;
pub mod otlp;
pub mod tls;

pub use build::build_exporters;

use crate::batch::{ExportBatch, ProcessProfile};

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The receiver could not be reached, or did not answer in time.
    #[error("{0}")]
    Transport(String),
    /// The receiver answered with an error status.
    #[error("receiver answered HTTP {status}: {body}")]
    Status {
        /// HTTP status code.
        status: u16,
        /// The start of the response body.
        body: String,
    },
    /// Encoding the profile failed.
    #[error("cannot encode profile: {0}")]
    Encode(String),
    /// Writing a file failed.
    #[error("{0}")]
    Io(String),
    /// The exporter's settings cannot be used (a missing or malformed certificate file, …).
    #[error("{0}")]
    Config(String),
}

/// Requests an exporter sent so far (cumulative): every attempt, and how many of them were
/// retries of a failed attempt.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RequestCounts {
    /// Requests attempted, first tries and retries.
    pub attempts: u64,
    /// Attempts that repeated a failed one.
    pub retries: u64,
}

/// The outcome of one batch for one exporter: samples that got out and samples that did not.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ExportOutcome {
    /// Samples delivered.
    pub exported: u64,
    /// Samples given up on (after retries); the first error says why.
    pub failed: u64,
    /// The first error, if any.
    pub error: Option<String>,
}

/// A destination for profiles.
pub trait Exporter: Send {
    /// A short name for logs (`otlp`, `pprof`, `rlp`).
    fn name(&self) -> &str;

    /// Exports one process's profile of `batch`. Retries, if any, happen inside.
    fn export_process(
        &mut self,
        batch: &ExportBatch,
        process: &ProcessProfile,
    ) -> Result<(), ExportError>;

    /// Called after every process of `batch` was offered (rotation, flushing).
    fn end_batch(&mut self, _batch: &ExportBatch) -> Result<(), ExportError> {
        Ok(())
    }

    /// Requests sent so far, for exporters that talk to a receiver (zero for the others).
    fn requests(&self) -> RequestCounts {
        RequestCounts::default()
    }

    /// Sets (or clears) the time by which the agent must have exited; exporters that wait on a
    /// receiver stop trying at it. Called before each export.
    fn set_deadline(&mut self, _deadline: Option<std::time::Instant>) {}

    /// Called once at shutdown after the final batch.
    fn finish(&mut self) -> Result<(), ExportError> {
        Ok(())
    }

    /// Exports a whole batch, process by process, and counts what got out.
    fn export(&mut self, batch: &ExportBatch) -> ExportOutcome {
        let mut outcome = ExportOutcome::default();
        for process in &batch.processes {
            match self.export_process(batch, process) {
                Ok(()) => outcome.exported += process.samples,
                Err(err) => {
                    outcome.failed += process.samples;
                    outcome.error.get_or_insert_with(|| err.to_string());
                }
            }
        }
        if let Err(err) = self.end_batch(batch) {
            outcome.error.get_or_insert_with(|| err.to_string());
        }
        outcome
    }
}
