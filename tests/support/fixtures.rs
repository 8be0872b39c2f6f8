//! The optional third-party fixtures: real files other tools wrote, kept outside the repository in
//! `$ROOTLINE_SHARED_DIR/fixtures/third_party` (default `<workspace>/../shared`).
//!
//! A test that reads one asks [`third_party`]; when the file is absent it prints why the test
//! skips and gets `None`, so a clone of the repository alone passes. Tests that must run on every
//! clone make their inputs with the real tools instead (`real_tools.rs`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The variable naming the directory that holds `fixtures/third_party`.
pub const SHARED_DIR_VAR: &str = "ROOTLINE_SHARED_DIR";

/// `$ROOTLINE_SHARED_DIR`, else `<workspace>/../shared`.
pub fn shared_dir() -> PathBuf {
    match std::env::var_os(SHARED_DIR_VAR) {
        Some(dir) => PathBuf::from(dir),
        // Every crate sits at `<workspace>/crates/<name>`.
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
    }
}

/// The third-party fixtures folder, whether or not it exists.
pub fn third_party_root() -> PathBuf {
    shared_dir().join("fixtures/third_party")
}

/// `relative` under the third-party fixtures, or `None` (after printing a skip reason naming `test`)
/// when it is absent.
pub fn third_party(test: &str, relative: &str) -> Option<PathBuf> {
    let path = third_party_root().join(relative);
    if path.exists() {
        Some(path)
    } else {
        eprintln!(
            "skipping {test}: {} is absent (the third-party fixtures are not part of the \
             repository; set {SHARED_DIR_VAR} to the directory holding fixtures/third_party)",
            path.display()
        );
        None
    }
}
