//! The Node target (`calls.js`) shared by the Node tests: how to start it and its call graph.

use std::ffi::OsString;
use std::path::PathBuf;

use super::{Graph, is_native_root, require, sources, which};

/// The `node` binary, or a skip (a failure under `CI`).
pub fn node(test: &str) -> Option<PathBuf> {
    require(test, "node (apt-get install nodejs)", which("node"))
}

/// Arguments running `calls.js` with the runtime flags `flags`, recursing `deep` levels for
/// `seconds`. Inlining is off so that every call stays a frame.
pub fn args(flags: &[&str], deep: usize, seconds: u32) -> Vec<OsString> {
    let mut a: Vec<OsString> = flags.iter().map(OsString::from).collect();
    a.push("--no-turbo-inlining".into());
    a.push(sources().join("calls.js").into());
    a.push(deep.to_string().into());
    a.push(seconds.to_string().into());
    a
}

fn short(name: &str) -> Option<&'static str> {
    Some(match name {
        "main" => "main",
        "down" => "down",
        "spin" => "spin",
        "step" => "step",
        _ => return None,
    })
}

/// `main -> down(deep) -> … -> down(0) -> spin -> step`, below node's native thread root.
pub fn graph(deep: usize) -> Graph<'static> {
    Graph {
        short: &short,
        entries: &["main"],
        edges: &[
            ("main", "down"),
            ("down", "down"),
            ("down", "spin"),
            ("spin", "step"),
        ],
        recursion: Some(("down", "spin", vec![("main", deep + 1)])),
        is_root: &is_native_root,
    }
}
