//! Finding the depth cap and the samples it cut.
//!
//! Depth here is the number of code frames of a stack: pseudo frames (see [`crate::pseudo`]) do not
//! count, because producers cap code frames. A sample is *truncated* when its depth equals the cap
//! exactly and its root-most code frame is not a frame that the same thread's complete samples (depth
//! other than the cap) have as their root. Everything is computed once per trie node or per sample, so
//! detection is linear in the size of the profile.

use std::collections::HashSet;

use rootline_profile::{FrameId, Metadata, Profile, StackId, ThreadId};

use crate::pseudo::pseudo_flags;

/// EventPipe (dotnet-trace, `.nettrace`) keeps the 100 leaf-most managed frames.
pub const EVENTPIPE_CAP: u32 = 100;
/// Linux perf's default `kernel.perf_event_max_stack`.
pub const PERF_CAP: u32 = 127;

/// Where the depth cap used for detection came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapSource {
    /// Forced by the caller ([`crate::RepairOptions::cap`], `--cap N`).
    Forced,
    /// [`Metadata::depth_cap`], set by the reader from the file (e.g. `.nettrace` metadata).
    Metadata,
    /// Known from the producer named in the metadata (dotnet-trace/EventPipe 100, perf 127).
    Producer,
    /// Detected from the depth histogram (a pile of samples at the maximum depth whose roots are not
    /// thread roots).
    Histogram,
}

impl CapSource {
    /// A short lower-case name for reports and metadata.
    pub fn as_str(self) -> &'static str {
        match self {
            CapSource::Forced => "forced",
            CapSource::Metadata => "metadata",
            CapSource::Producer => "producer",
            CapSource::Histogram => "histogram",
        }
    }
}

/// A depth cap and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    /// Number of code frames the producer keeps.
    pub depth: u32,
    /// How rootline knows it.
    pub source: CapSource,
}

/// Per trie node: code depth and root-most code frame. Indexed by [`StackId::index`].
pub(crate) struct StackTables {
    /// Pseudo flag per frame.
    pub pseudo: Vec<bool>,
    /// Repair-gap flag per frame ([`rootline_profile::pseudo::REPAIR_GAP`]; also pseudo).
    pub gap: Vec<bool>,
    /// Number of code frames from the root to this node.
    pub depth: Vec<u32>,
    /// Root-most code frame of the stack ending at this node (`u32::MAX`: none).
    pub root: Vec<u32>,
}

impl StackTables {
    /// Builds the tables in one pass over the trie (a parent always precedes its children).
    pub fn new(profile: &Profile) -> StackTables {
        let (pseudo, gap) = pseudo_flags(profile);
        let mut tables = StackTables {
            pseudo,
            gap,
            depth: Vec::new(),
            root: Vec::new(),
        };
        tables.extend(profile);
        tables
    }

    /// Adds rows for trie nodes interned since the last call.
    pub fn extend(&mut self, profile: &Profile) {
        let stacks = profile.stacks();
        for frame in self.pseudo.len()..profile.frames().len() {
            let id = FrameId(frame as u32);
            self.pseudo
                .push(rootline_profile::pseudo::is_pseudo_frame(profile, id));
            self.gap
                .push(rootline_profile::pseudo::is_repair_gap(profile, id));
        }
        for node in &stacks[self.depth.len()..] {
            let code = !self.pseudo[node.frame.index()];
            let (depth, root) = match node.parent {
                Some(p) => (self.depth[p.index()], self.root[p.index()]),
                None => (0, u32::MAX),
            };
            let root = if root == u32::MAX && code {
                node.frame.0
            } else {
                root
            };
            self.depth.push(depth + u32::from(code));
            self.root.push(root);
        }
    }

    /// Code depth of a stack.
    pub fn depth(&self, stack: StackId) -> u32 {
        self.depth[stack.index()]
    }

    /// Root-most code frame of a stack, if it has any code frame.
    pub fn root(&self, stack: StackId) -> Option<FrameId> {
        let root = self.root[stack.index()];
        (root != u32::MAX).then_some(FrameId(root))
    }
}

/// The cap implied by the producer named in the metadata, if it is one with a known cap.
pub fn producer_cap(metadata: &Metadata) -> Option<u32> {
    let producer = metadata.producer.to_ascii_lowercase();
    if ["dotnet-trace", "eventpipe", "nettrace"]
        .iter()
        .any(|p| producer.contains(p))
    {
        Some(EVENTPIPE_CAP)
    } else if producer == "perf" || producer.starts_with("perf ") {
        Some(PERF_CAP)
    } else {
        None
    }
}

/// The cap to use: forced, else from the metadata, else from the producer, else from the histogram.
pub(crate) fn resolve_cap(
    profile: &Profile,
    tables: &StackTables,
    forced: Option<u32>,
) -> Option<Cap> {
    let known = [
        (forced, CapSource::Forced),
        (profile.metadata.depth_cap, CapSource::Metadata),
        (producer_cap(&profile.metadata), CapSource::Producer),
    ];
    if let Some((Some(depth), source)) = known.into_iter().find(|(d, _)| d.is_some()) {
        return Some(Cap { depth, source });
    }
    histogram_cap(profile, tables).map(|depth| Cap {
        depth,
        source: CapSource::Histogram,
    })
}

/// Smallest depth the histogram detector will call a cap; real caps are far deeper.
const MIN_DETECTED_CAP: u32 = 8;

/// Detects a cap from the depth histogram. The candidate is the maximum depth `D`. It is a cap when
/// (a) `D >= 8`, (b) samples pile up there — more samples at `D` than at any of the four depths just
/// below, as happens when every deeper stack is cut to `D` — and (c) at least two samples at `D`, and
/// at least half of them, have a root that is not a root of their thread's samples shallower than `D`.
/// Genuinely deep but whole stacks (which end at their thread's root) fail (c).
pub(crate) fn histogram_cap(profile: &Profile, tables: &StackTables) -> Option<u32> {
    let samples = profile.samples();
    let max = samples.stacks.iter().map(|&s| tables.depth(s)).max()?;
    if max < MIN_DETECTED_CAP {
        return None;
    }
    let mut near = [0u64; 5]; // counts at max-4 ..= max
    for &s in &samples.stacks {
        let d = tables.depth(s);
        if d + 4 >= max {
            near[(d + 4 - max) as usize] += 1;
        }
    }
    let at_max = near[4];
    if at_max < 2 || near[..4].iter().any(|&c| c >= at_max) {
        return None;
    }
    let roots = thread_roots(profile, tables, max);
    let foreign = samples
        .stacks
        .iter()
        .zip(&samples.threads)
        .filter(|&(&s, &t)| tables.depth(s) == max && !is_thread_root(&roots, t, tables.root(s)))
        .count() as u64;
    (foreign >= 2 && foreign * 2 >= at_max).then_some(max)
}

/// `(thread, root frame)` of every complete sample: one with code frames and a depth other than
/// `cap` (a stack deeper than the cap was evidently not cut by it).
pub(crate) fn thread_roots(
    profile: &Profile,
    tables: &StackTables,
    cap: u32,
) -> HashSet<(ThreadId, FrameId)> {
    let samples = profile.samples();
    samples
        .stacks
        .iter()
        .zip(&samples.threads)
        .filter(|&(&s, _)| tables.depth(s) != cap)
        .filter_map(|(&s, &t)| tables.root(s).map(|r| (t, r)))
        .collect()
}

fn is_thread_root(
    roots: &HashSet<(ThreadId, FrameId)>,
    thread: ThreadId,
    root: Option<FrameId>,
) -> bool {
    root.is_some_and(|r| roots.contains(&(thread, r)))
}

/// One flag per sample: true when the sample was cut by `cap` (see the module doc).
pub(crate) fn truncated_flags(profile: &Profile, tables: &StackTables, cap: u32) -> Vec<bool> {
    let roots = thread_roots(profile, tables, cap);
    let samples = profile.samples();
    samples
        .stacks
        .iter()
        .zip(&samples.threads)
        .map(|(&s, &t)| tables.depth(s) == cap && !is_thread_root(&roots, t, tables.root(s)))
        .collect()
}
