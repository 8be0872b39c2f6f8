//! Whether the headless-Chromium check of speedscope's web app (`tests/js-speedscope`) can run:
//! puppeteer-core installed there, Debian's Chromium and node. Shared by the tests that load a
//! profile into the app.

use std::path::Path;
use std::process::Command;

/// True when the check can run from the repository at `workspace`; otherwise it fails in CI and
/// skips elsewhere, printing the reason (`what` names the check in that line).
pub fn present(workspace: &Path, what: &str) -> bool {
    let js = workspace.join("tests/js-speedscope/node_modules/puppeteer-core");
    let missing: Vec<&str> = [
        (!js.exists()).then_some("tests/js-speedscope/node_modules (npm ci there)"),
        (!Path::new("/usr/bin/chromium").exists()).then_some("/usr/bin/chromium (apt chromium)"),
        Command::new("node")
            .arg("--version")
            .output()
            .is_err()
            .then_some("node"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if missing.is_empty() {
        return true;
    }
    let reason = format!(
        "missing {}; scripts/test.sh installs them",
        missing.join(", ")
    );
    assert!(std::env::var_os("CI").is_none(), "{reason}");
    eprintln!("skipping {what}: {reason}");
    false
}
