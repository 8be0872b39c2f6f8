//! A recording that hands its samples over (`Retention::HandOver`, as the agent runs it): each
//! flush delivers only new samples, the recording keeps none, its tables start over when they
//! pass the limit, and stacks stay whole and true across every start-over.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[path = "common/c_program.rs"]
mod c_program;
#[path = "common/callgraph.rs"]
mod callgraph;
#[path = "common/deep_thread.rs"]
mod deep_thread;

use callgraph::build_callgraph;
use deep_thread::{DeepStack, deep_command, deep_stack, each_stack};
use rootline_capture::recorder::{
    ChunkSink, KernelWalkMode, RecordOptions, Retention, Target, record,
};
use rootline_profile::Profile;

#[derive(Default)]
struct Seen {
    chunks: usize,
    samples: u64,
    started_over: usize,
    /// Samples in the program's hot leaf whose caller is not `a` (must stay 0).
    wrong_callers: u64,
    /// Samples in the program's leaf that do not reach `main` or `worker` (must stay 0).
    not_whole: u64,
    leaf_samples: u64,
    /// Largest number of frames plus stack nodes seen in one chunk's profile.
    max_entries: usize,
}

struct Collect(Arc<Mutex<Seen>>, usize);

impl ChunkSink for Collect {
    fn write_chunk(&mut self, profile: &Profile) -> std::io::Result<()> {
        let mut seen = self.0.lock().unwrap();
        seen.chunks += 1;
        seen.max_entries = seen
            .max_entries
            .max(profile.frames().len() + profile.stacks().len());
        let samples = profile.samples();
        let mut frames = Vec::new();
        for i in 0..samples.len() {
            seen.samples += 1;
            profile.stack_frames_root_first(samples.stacks[i], &mut frames);
            let names: Vec<&str> = frames.iter().map(|&f| profile.frame_name(f)).collect();
            if names.last() == Some(&"leaf") {
                seen.leaf_samples += 1;
                if names.len() < 2 || names[names.len() - 2] != "a" {
                    seen.wrong_callers += 1;
                }
                if !names.iter().any(|n| *n == "main" || *n == "worker") {
                    seen.not_whole += 1;
                }
            }
        }
        Ok(())
    }

    fn retention(&self) -> Retention {
        Retention::HandOver {
            max_entries: self.1,
        }
    }

    fn started_over(&mut self) {
        self.0.lock().unwrap().started_over += 1;
    }
}

#[test]
fn handed_over_samples_are_new_each_flush_and_tables_start_over() {
    // Bound at load time (-z now): the lazy-binding trampoline is the ground truth's subject, not
    // this test's.
    let binary = build_callgraph(
        "hand_over_callgraph",
        &["-O0", "-fno-omit-frame-pointer", "-Wl,-z,now"],
    );
    let mut opts = RecordOptions::new(Target::Command(vec![binary.into(), "2".into(), "1".into()]));
    opts.flush_interval = Duration::from_millis(100);
    // Without live stack reads a launched command's binaries are parsed on the loader thread,
    // so its first samples are set aside until then: this covers that path too.
    opts.live_stack_budget = 0;
    let seen = Arc::new(Mutex::new(Seen::default()));
    // Far below the program's working set of frames and stack nodes: the tables start over
    // at nearly every flush.
    let limit = 20;
    let sink = Collect(seen.clone(), limit);
    let recording = record(&opts, &AtomicBool::new(false), Some(Box::new(sink))).expect("records");
    let seen = seen.lock().unwrap();
    println!(
        "{} samples in {} chunks, {} start-overs, {} in leaf, largest tables {} entries, {} set aside",
        seen.samples,
        seen.chunks,
        seen.started_over,
        seen.leaf_samples,
        seen.max_entries,
        recording.stats.deferred
    );
    // Every sample was handed over exactly once and none is kept.
    assert_eq!(seen.samples, recording.stats.samples);
    assert_eq!(recording.profile.samples().len(), 0);
    assert!(seen.samples > 500, "{} samples", seen.samples);
    assert!(seen.chunks >= 5, "{} chunks", seen.chunks);
    assert!(seen.started_over >= 2, "{} start-overs", seen.started_over);
    // Stacks are resolved through the right tables after each start-over.
    assert!(
        seen.leaf_samples > 100,
        "{} leaf samples",
        seen.leaf_samples
    );
    assert_eq!(seen.wrong_callers, 0);
    assert_eq!(seen.not_whole, 0);
}

/// `tests/c/deep.c` on a second thread: 200 levels of `recurse` with 1 KiB of locals each (far
/// past the 16 KiB copy) above a spinning leaf, so each sample's outer frames are those of its
/// thread's last sample. They are reused from it (in-kernel walk: the last walk's trie node; live
/// reads: the proven outer part's node) while the tables start over at nearly every flush: a
/// node kept from before a start-over names nothing in the new tables, so every leaf sample
/// must still show all 200 levels from the thread's root (with live reads, a thread's first
/// samples, before a watch proves its outer frames, end `[truncated: live-unproven]`).
#[test]
fn deep_stacks_reused_from_a_threads_last_sample_stay_whole_across_start_overs() {
    const DEPTH: usize = 200;
    let binary = c_program::build_c(
        "deep.c",
        "hand_over_deep",
        &["-O2", "-fno-omit-frame-pointer"],
    );
    for walk in [KernelWalkMode::On, KernelWalkMode::Off] {
        let args = deep_command(None, &binary, DEPTH, "2");
        let mut opts = RecordOptions::new(Target::Command(args));
        opts.kernel_walk = walk;
        opts.flush_interval = Duration::from_millis(100);
        let seen = Arc::new(Mutex::new(DeepSeen::default()));
        let sink = DeepCollect(seen.clone(), DEPTH);
        let recording = match record(&opts, &AtomicBool::new(false), Some(Box::new(sink))) {
            Ok(r) => r,
            Err(e) if std::env::var_os("CI").is_none() && e.to_string().contains("BPF") => {
                eprintln!("skipped the in-kernel walk: {e}");
                continue;
            }
            Err(e) => panic!("record failed: {e}"),
        };
        let seen = seen.lock().unwrap();
        let reused = match walk {
            KernelWalkMode::On => recording.stats.kernel_walk.map_or(0, |k| k.outer_reused),
            _ => recording.stats.outer_cache.hits,
        };
        println!(
            "{walk:?}: {} in spin, {} whole, {} truncated, {} start-overs, {reused} reused outer \
             parts; wrong: {:?}",
            seen.in_leaf, seen.whole, seen.truncated, seen.started_over, seen.wrong
        );
        assert!(seen.started_over >= 3, "{} start-overs", seen.started_over);
        assert!(seen.in_leaf >= 300, "{} samples in spin", seen.in_leaf);
        assert!(
            reused >= 100,
            "only {reused} samples reused their outer frames"
        );
        assert!(seen.wrong.is_empty(), "{walk:?}: {:?}", seen.wrong);
        // The few samples before a watch first proves the outer frames (6-8 a run).
        assert!(
            seen.truncated <= 20,
            "{walk:?}: {} truncated",
            seen.truncated
        );
    }
}

#[derive(Default)]
struct DeepSeen {
    started_over: usize,
    in_leaf: u64,
    whole: u64,
    /// Leaf samples ending in an explicit `[truncated: …]` frame.
    truncated: u64,
    /// Leaf samples neither whole (`clone3 … worker, recurse × DEPTH, spin`) nor marked
    /// truncated: a few, shortened.
    wrong: Vec<String>,
}

struct DeepCollect(Arc<Mutex<DeepSeen>>, usize);

impl ChunkSink for DeepCollect {
    fn write_chunk(&mut self, profile: &Profile) -> std::io::Result<()> {
        let mut seen = self.0.lock().unwrap();
        each_stack(profile, |names| {
            let Some(verdict) = deep_stack(names, self.1) else {
                return;
            };
            seen.in_leaf += 1;
            match verdict {
                DeepStack::Whole => seen.whole += 1,
                DeepStack::Truncated => seen.truncated += 1,
                DeepStack::Wrong if seen.wrong.len() < 5 => {
                    let shown: Vec<&str> =
                        names.iter().copied().filter(|&n| n != "recurse").collect();
                    seen.wrong.push(shown.join(";"));
                }
                DeepStack::Wrong => {}
            }
        });
        Ok(())
    }

    fn retention(&self) -> Retention {
        Retention::HandOver { max_entries: 20 }
    }

    fn started_over(&mut self) {
        self.0.lock().unwrap().started_over += 1;
    }
}
