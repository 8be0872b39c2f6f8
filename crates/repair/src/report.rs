//! What repair did: one outcome per sample and counts per thread.

use std::fmt;

use rootline_profile::{Profile, StackId, ThreadId};

use crate::detect::Cap;

/// What repair did to one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SampleOutcome {
    /// Not truncated; left exactly as it was.
    Whole,
    /// Truncated, and exactly one base was consistent with its neighbours; that base was re-attached.
    Exact,
    /// Truncated, and several bases were consistent (e.g. a recursion count the data cannot reveal);
    /// the least-change one was re-attached, with a `[repair: frames unknown]` frame at the join
    /// (or inherited from the donor's base), and the sample is flagged as a guess.
    Ambiguous,
    /// Truncated and not alignable with any neighbour; kept, with a `[truncated: …]` base frame.
    Unrepairable,
}

impl SampleOutcome {
    /// A short lower-case name: `whole`, `exact`, `ambiguous`, `unrepairable`.
    pub fn as_str(self) -> &'static str {
        match self {
            SampleOutcome::Whole => "whole",
            SampleOutcome::Exact => "exact",
            SampleOutcome::Ambiguous => "ambiguous",
            SampleOutcome::Unrepairable => "unrepairable",
        }
    }
}

/// Counts for one thread (or, from [`RepairReport::totals`], for the whole profile).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadReport {
    /// The thread (`None` for the totals of [`RepairReport::totals`]).
    pub thread: Option<ThreadId>,
    /// Thread id as the producer gave it.
    pub tid: u32,
    /// Thread name, when known.
    pub name: Option<String>,
    /// Samples on the thread.
    pub samples: u64,
    /// Samples found truncated.
    pub truncated: u64,
    /// Truncated samples repaired with a unique alignment.
    pub exact: u64,
    /// Truncated samples repaired with a least-change guess among several alignments.
    pub ambiguous: u64,
    /// Truncated samples kept with a `[truncated: …]` base frame.
    pub unrepairable: u64,
    /// Spans a timeline view (B/E events written from the samples) shows before repair.
    pub spans_before: u64,
    /// Spans after repair.
    pub spans_after: u64,
}

impl ThreadReport {
    /// Spans that repair merged into their neighbours (before minus after; 0 if repair added spans).
    pub fn spans_merged(&self) -> u64 {
        self.spans_before.saturating_sub(self.spans_after)
    }

    fn add(&mut self, other: &ThreadReport) {
        self.samples += other.samples;
        self.truncated += other.truncated;
        self.exact += other.exact;
        self.ambiguous += other.ambiguous;
        self.unrepairable += other.unrepairable;
        self.spans_before += other.spans_before;
        self.spans_after += other.spans_after;
    }
}

/// The result of [`crate::repair`]: the cap used, one outcome per sample and counts per thread.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// The depth cap used, or `None` when no cap was known or detected (then nothing is truncated).
    pub cap: Option<Cap>,
    /// One outcome per sample, in sample order.
    pub outcomes: Vec<SampleOutcome>,
    /// Counts per thread that has samples, in thread id order.
    pub threads: Vec<ThreadReport>,
}

impl RepairReport {
    /// Counts summed over all threads.
    pub fn totals(&self) -> ThreadReport {
        let mut total = ThreadReport::default();
        for t in &self.threads {
            total.add(t);
        }
        total
    }
}

impl fmt::Display for RepairReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cap {
            Some(cap) => writeln!(f, "depth cap: {} ({})", cap.depth, cap.source.as_str())?,
            None => writeln!(f, "depth cap: none known or detected; nothing is truncated")?,
        }
        writeln!(
            f,
            "{:<24} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12}",
            "thread",
            "samples",
            "truncated",
            "exact",
            "ambiguous",
            "unrepairable",
            "spans before",
            "spans merged"
        )?;
        let total = self.totals();
        for t in self.threads.iter().chain(std::iter::once(&total)) {
            let label = if t.thread.is_none() {
                "total".to_string()
            } else {
                match &t.name {
                    Some(name) => format!("{} {}", t.tid, name),
                    None => t.tid.to_string(),
                }
            };
            writeln!(
                f,
                "{:<24} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12}",
                label,
                t.samples,
                t.truncated,
                t.exact,
                t.ambiguous,
                t.unrepairable,
                t.spans_before,
                t.spans_merged()
            )?;
        }
        Ok(())
    }
}

/// Spans a timeline shows for a sequence of stacks written as B/E events: every frame that is not
/// shared with the previous sample begins a span. Cost per sample is the number of frames that change
/// (the walk to the common ancestor in the stack trie).
pub(crate) fn count_spans(profile: &Profile, stacks: impl Iterator<Item = StackId>) -> u64 {
    let mut prev: Option<StackId> = None;
    let mut spans = 0u64;
    for stack in stacks {
        let shared = prev.map_or(0, |p| common_depth(profile, p, stack));
        spans += u64::from(profile.stack_depth(stack) - shared);
        prev = Some(stack);
    }
    spans
}

/// Depth of the deepest common ancestor of two trie nodes (0 when they share no root).
fn common_depth(profile: &Profile, a: StackId, b: StackId) -> u32 {
    let (mut a, mut b) = (Some(a), Some(b));
    let depth = |s: Option<StackId>| s.map_or(0, |s| profile.stack_depth(s));
    while depth(a) > depth(b) {
        a = a.and_then(|s| profile.stack(s).parent);
    }
    while depth(b) > depth(a) {
        b = b.and_then(|s| profile.stack(s).parent);
    }
    while a != b {
        a = a.and_then(|s| profile.stack(s).parent);
        b = b.and_then(|s| profile.stack(s).parent);
    }
    depth(a)
}
