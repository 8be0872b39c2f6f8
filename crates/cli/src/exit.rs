//! Exit codes of DESIGN.md §6: 0 ok, 1 usage or input error, 2 permission, 3 target gone.

/// An error that carries a specific exit code; anything else exits with 1.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Exit {
    /// The process exit code.
    pub code: u8,
    /// What went wrong and what to do about it.
    pub message: String,
}

/// Exit code for permission problems (perf_event_paranoid, capabilities).
#[allow(dead_code)]
pub const PERMISSION: u8 = 2;
/// Exit code for a target process that does not exist or exited before recording started.
#[allow(dead_code)]
pub const TARGET_GONE: u8 = 3;

/// The exit code for `err`: the code of the first [`Exit`] in its chain, else 1.
pub fn code_of(err: &anyhow::Error) -> u8 {
    err.chain()
        .find_map(|cause| cause.downcast_ref::<Exit>())
        .map_or(1, |exit| exit.code)
}
