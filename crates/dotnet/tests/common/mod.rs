//! Shared test helpers: the perfview fixtures (optional), unzipped in memory, and a live .NET
//! target.

#![allow(dead_code)]

pub mod live;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use rootline_dotnet::NetTraceReader;

#[path = "../../../../tests/support/fixtures.rs"]
pub mod fixtures;

/// The perfview fixtures folder, or `None` (after printing why `test` skips) when absent.
pub fn perfview_dir(test: &str) -> Option<PathBuf> {
    fixtures::third_party(test, "perfview")
}

/// The bytes of `<name>.nettrace` from `<name>.nettrace.zip` in `dir`.
pub fn fixture(dir: &Path, name: &str) -> Vec<u8> {
    let path = dir.join(format!("{name}.nettrace.zip"));
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut zip = zip::ZipArchive::new(file).expect("zip archive");
    let mut entry = zip
        .by_name(&format!("{name}.nettrace"))
        .expect("nettrace entry in zip");
    let mut data = Vec::new();
    entry.read_to_end(&mut data).expect("unzip");
    data
}

/// Every fixture name.
pub const FIXTURES: [&str; 5] = [
    "eventpipe-dotnetcore3.0-win-x64-objver4",
    "eventpipe-dotnetcore5.0-win-x64-arraytypes",
    "eventpipe-dotnetcore6.0-win-x64-executioncheckpoints",
    "mixed_managed_external_samples",
    "only_managed_samples",
];

/// Events per `(provider, event id)`.
pub fn count_events(data: &[u8]) -> BTreeMap<(String, u32), u64> {
    let mut reader = NetTraceReader::new(data).expect("trace header");
    let mut counts = BTreeMap::new();
    while let Some(e) = reader.next_event().expect("event") {
        *counts
            .entry((e.metadata.provider.clone(), e.metadata.event_id))
            .or_insert(0) += 1;
    }
    counts
}
