//! Builds one of the C programs in capture's `tests/c` for tests that record it (included by
//! path, by capture's tests and the agent's).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles capture's `tests/c/SOURCE` with `flags`, `-g` and pthreads into the test target directory as
/// `name`, and returns its path.
pub fn build_c(source: &str, name: &str, flags: &[&str]) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let status = Command::new("cc")
        .args(flags)
        .arg("-g")
        .arg(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../capture/tests/c")).join(source))
        .arg("-lpthread")
        .arg("-o")
        .arg(&out)
        .status()
        .expect("cc runs");
    assert!(status.success(), "cc failed for {flags:?}");
    out
}
