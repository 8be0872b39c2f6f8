//! Makes stacks that another profiler cut at its depth cap whole again — exactly where the data
//! allows, flagged where it does not.
//!
//! EventPipe (dotnet-trace) keeps only the 100 leaf-most managed frames of a stack and Linux perf
//! the 127 leaf-most frames; every deeper sample loses its base (`Main`, the thread's entry, …), which
//! splits flame graphs and breaks every span of a timeline view around it. Repair works on a
//! [`Profile`] from any reader, sample by sample, in linear time, and never deletes a sample.
//!
//! What the caller does: read a profile (any format), call [`repair`] (or
//! [`repair_with_progress`]) with [`RepairOptions`], write the profile out, show the
//! [`RepairReport`]. What this crate does:
//! - finds the cap ([`CapSource`]: forced, [`Metadata::depth_cap`], the producer's known cap, or
//!   the depth histogram) and the samples it cut (depth, without pseudo frames, equal to the cap and
//!   a root that is not one of the thread's roots) — module [`detect`];
//! - aligns each cut stack with its nearest complete or repaired neighbours on the same thread and
//!   re-attaches the missing base frames below the producer's leading pseudo frames, choosing the
//!   least-change alignment and recording whether it was the only one ([`SampleOutcome`]);
//! - puts the repair gap frame, `[repair: frames unknown]` ([`rootline_profile::pseudo::REPAIR_GAP`],
//!   a pseudo frame), between the base and the cut part when the alignment was a guess, so every
//!   output format shows the join; an ambiguous sample carries exactly one gap, an exact one none;
//! - marks stacks it cannot align with a `[truncated: depth cap N]` base frame (they still do not
//!   reach their thread's root, and say so like any other truncated stack);
//! - leaves every other sample untouched, and records totals in [`Metadata::extra`] under
//!   `repair.*` (`repair.truncated`, `repair.exact`, `repair.ambiguous`, `repair.unrepairable`,
//!   `repair.cap`, `repair.cap_source`).
//!
//! ```
//! use rootline_profile::{FrameKind, Profile, SampleType};
//! use rootline_repair::{repair, RepairOptions, SampleOutcome};
//!
//! let mut p = Profile::new(vec![SampleType::samples()]);
//! let t = p.intern_thread(1, 1);
//! let f: Vec<_> = ["Main", "Run", "A", "B", "C", "D", "Leaf"]
//!     .iter()
//!     .map(|n| p.intern_named_frame(n, FrameKind::Managed))
//!     .collect();
//! // Main;Run;A;B is complete; A;B;C;D;Leaf is what a producer with a cap of 5 keeps of
//! // Main;Run;A;B;C;D;Leaf.
//! let whole = p.intern_stack_root_first([f[0], f[1], f[2], f[3]]).unwrap();
//! let cut = p.intern_stack_root_first([f[2], f[3], f[4], f[5], f[6]]).unwrap();
//! p.push_sample(0, t, whole, &[1]).unwrap();
//! p.push_sample(1, t, cut, &[1]).unwrap();
//! let options = RepairOptions { cap: Some(5), ..RepairOptions::default() };
//! let report = repair(&mut p, &options).unwrap();
//! assert_eq!(report.outcomes, [SampleOutcome::Whole, SampleOutcome::Exact]);
//! assert_eq!(p.stack_depth(p.samples().stacks[1]), 7); // Main;Run;A;B;C;D;Leaf
//! ```
//!
//! [`Metadata::depth_cap`]: rootline_profile::Metadata::depth_cap
//! [`Metadata::extra`]: rootline_profile::Metadata::extra

#![forbid(unsafe_code)]

mod align;
pub mod detect;
mod engine;
mod pseudo;
mod report;

pub use detect::{Cap, CapSource};
pub use report::{RepairReport, SampleOutcome, ThreadReport};

use rootline_profile::{Profile, ProfileError};

/// How to repair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairOptions {
    /// Force this depth cap instead of taking it from the metadata, the producer or the histogram.
    pub cap: Option<u32>,
    /// Fewest frames of a donor that must agree with a cut stack's root end before its base is
    /// re-attached (at least 1; default 2, so a lone shared frame is not taken as evidence).
    pub min_overlap: usize,
}

impl Default for RepairOptions {
    fn default() -> Self {
        RepairOptions {
            cap: None,
            min_overlap: 2,
        }
    }
}

/// Errors from repair. Only an inconsistent profile (ids out of range) can cause one.
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    /// The profile rejected a change.
    #[error("profile rejected a repaired stack: {0}")]
    Profile(#[from] ProfileError),
}

/// Repairs `profile` in place; see the crate doc. Equivalent to [`repair_with_progress`] without
/// progress.
pub fn repair(profile: &mut Profile, options: &RepairOptions) -> Result<RepairReport, RepairError> {
    repair_with_progress(profile, options, &mut |_, _| {})
}

/// Repairs `profile` in place, calling `progress(done, total)` now and then with counts of samples
/// handled (for a progress bar).
pub fn repair_with_progress(
    profile: &mut Profile,
    options: &RepairOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<RepairReport, RepairError> {
    let tables = detect::StackTables::new(profile);
    let cap = detect::resolve_cap(profile, &tables, options.cap);
    let total = profile.samples().len();
    let by_thread = samples_by_thread(profile);
    let spans_before: Vec<u64> = by_thread
        .iter()
        .map(|idx| span_count(profile, idx))
        .collect();
    let mut outcomes = vec![SampleOutcome::Whole; total];

    if let Some(cap) = cap {
        let truncated = detect::truncated_flags(profile, &tables, cap.depth);
        if truncated.iter().any(|&t| t) {
            let mut engine = engine::Engine::new(profile, tables, cap.depth, options.min_overlap);
            let mut done = 0u64;
            let mut tick = || {
                done += 1;
                if done.is_multiple_of(65_536) || done == total as u64 {
                    progress(done, total as u64);
                }
            };
            for indices in &by_thread {
                engine.repair_thread(indices, &truncated, &mut outcomes, &mut tick)?;
            }
        }
    }
    progress(total as u64, total as u64);

    let threads = by_thread
        .iter()
        .enumerate()
        .filter(|(_, idx)| !idx.is_empty())
        .map(|(t, idx)| {
            let id = rootline_profile::ThreadId(t as u32);
            let count = |o: SampleOutcome| {
                idx.iter().filter(|&&i| outcomes[i as usize] == o).count() as u64
            };
            let (exact, ambiguous, unrepairable) = (
                count(SampleOutcome::Exact),
                count(SampleOutcome::Ambiguous),
                count(SampleOutcome::Unrepairable),
            );
            ThreadReport {
                thread: Some(id),
                tid: profile.thread(id).tid,
                name: profile.thread_name(id).map(str::to_string),
                samples: idx.len() as u64,
                truncated: exact + ambiguous + unrepairable,
                exact,
                ambiguous,
                unrepairable,
                spans_before: spans_before[t],
                spans_after: span_count(profile, idx),
            }
        })
        .collect();
    let report = RepairReport {
        cap,
        outcomes,
        threads,
    };
    record_totals(profile, &report);
    Ok(report)
}

/// Each thread's sample indexes, in time order (stable for equal times).
fn samples_by_thread(profile: &Profile) -> Vec<Vec<u32>> {
    let samples = profile.samples();
    let mut by_thread = vec![Vec::new(); profile.threads().len()];
    for (i, t) in samples.threads.iter().enumerate() {
        by_thread[t.index()].push(i as u32);
    }
    for idx in &mut by_thread {
        if !idx.is_sorted_by_key(|&i| samples.times[i as usize]) {
            idx.sort_by_key(|&i| samples.times[i as usize]);
        }
    }
    by_thread
}

fn span_count(profile: &Profile, indices: &[u32]) -> u64 {
    let stacks = &profile.samples().stacks;
    report::count_spans(profile, indices.iter().map(|&i| stacks[i as usize]))
}

fn record_totals(profile: &mut Profile, report: &RepairReport) {
    let total = report.totals();
    let extra = &mut profile.metadata.extra;
    if let Some(cap) = report.cap {
        extra.insert("repair.cap".into(), cap.depth.to_string());
        extra.insert("repair.cap_source".into(), cap.source.as_str().into());
    }
    extra.insert("repair.truncated".into(), total.truncated.to_string());
    extra.insert("repair.exact".into(), total.exact.to_string());
    extra.insert("repair.ambiguous".into(), total.ambiguous.to_string());
    extra.insert("repair.unrepairable".into(), total.unrepairable.to_string());
    profile.metadata.truncated_samples += total.unrepairable;
}
