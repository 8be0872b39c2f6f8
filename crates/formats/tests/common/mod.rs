//! Helpers shared by the format tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rootline_profile::Profile;

#[path = "../../../../tests/support/fixtures.rs"]
pub mod fixtures;
#[path = "../../../../tests/support/real_tools.rs"]
pub mod real_tools;

/// All files under `dir` (recursively) whose name ends with `suffix`, sorted.
pub fn files_under(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.to_string_lossy().ends_with(suffix) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Per-thread stacks (root first, `;`-joined, prefixed by `pid/tid`) with summed values of column
/// `column`.
pub fn stack_totals(profile: &Profile, column: usize) -> BTreeMap<String, i64> {
    let samples = profile.samples();
    let mut out = BTreeMap::new();
    let mut frames = Vec::new();
    for i in 0..samples.len() {
        profile.stack_frames_root_first(samples.stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| profile.frame_name(f)).collect();
        let t = profile.thread(samples.threads[i]);
        let key = format!("{}/{}:{}", t.pid, t.tid, names.join(";"));
        *out.entry(key).or_insert(0) += samples.values[column][i];
    }
    out
}

/// Stacks (root first, `;`-joined) with summed values of column `column`, all threads together.
pub fn merged_stack_totals(profile: &Profile, column: usize) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for (k, v) in stack_totals(profile, column) {
        let stack = k.split_once(':').map_or(k.as_str(), |(_, s)| s).to_owned();
        *out.entry(stack).or_insert(0) += v;
    }
    out
}
