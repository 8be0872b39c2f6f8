//! Builds the ground-truth call graph program (`tests/c/callgraph_main.c` + `callgraph_b.c`: main
//! and a worker thread run work → a → leaf and work → b → leaf_tail) for tests that record it.
//! Shared by capture's tests and the agent's (included by path: the C sources live here).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles the call graph program with `flags` (and `-g`) into the test target directory as
/// `name`, and returns its path.
pub fn build_callgraph(name: &str, flags: &[&str]) -> PathBuf {
    let c = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../capture/tests/c"));
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let status = Command::new("cc")
        .args(flags)
        .args(["-g", "-o"])
        .arg(&out)
        .arg(c.join("callgraph_main.c"))
        .arg(c.join("callgraph_b.c"))
        .arg("-lpthread")
        .status()
        .expect("cc runs");
    assert!(
        status.success(),
        "cc failed for the call graph program {flags:?}"
    );
    out
}
