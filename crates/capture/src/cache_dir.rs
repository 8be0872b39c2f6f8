//! Where recordings keep what they learn about binaries between runs (compiled kernel-walk
//! rows, the layouts of large libraries): `$ROOTLINE_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/rootline`, else `~/.cache/rootline`, one directory per kind below it. A
//! cache that cannot be read or written is simply not used.

use std::path::PathBuf;

/// The directory for the cache `kind` (e.g. `kernel-rows`), when one can be named.
pub fn cache_dir(kind: &str) -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("ROOTLINE_CACHE_DIR") {
        return Some(PathBuf::from(d).join(kind));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("rootline").join(kind))
}
