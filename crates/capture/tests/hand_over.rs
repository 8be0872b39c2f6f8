//! A recording that hands its samples over (`Retention::HandOver`, as the agent runs it): each
//! flush delivers only new samples, the recording keeps none, its tables start over when they
//! pass the limit, and stacks stay whole and true across every start-over.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[path = "common/callgraph.rs"]
mod callgraph;

use callgraph::build_callgraph;
use rootline_capture::recorder::{ChunkSink, RecordOptions, Retention, Target, record};
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
