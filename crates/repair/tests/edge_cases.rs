//! Small hand-built profiles for the cases the generator does not isolate.

use rootline_profile::{FrameId, FrameKind, Profile, SampleType, StackId, ThreadId};
use rootline_repair::{CapSource, RepairOptions, SampleOutcome, repair};

struct Builder {
    p: Profile,
    thread: ThreadId,
}

impl Builder {
    fn new(producer: &str) -> Builder {
        let mut p = Profile::new(vec![SampleType::samples()]);
        p.metadata.producer = producer.to_string();
        let thread = p.intern_thread(1, 1);
        Builder { p, thread }
    }

    fn frames(&mut self, names: &str) -> Vec<FrameId> {
        names
            .split(';')
            .map(|n| self.p.intern_named_frame(n, FrameKind::Native))
            .collect()
    }

    fn sample(&mut self, time: u64, names: &str) {
        let frames = self.frames(names);
        let stack = self.p.intern_stack_root_first(frames).unwrap();
        self.p.push_sample(time, self.thread, stack, &[1]).unwrap();
    }

    fn stack_names(&self, i: usize) -> String {
        let stack: StackId = self.p.samples().stacks[i];
        let mut names: Vec<&str> = self
            .p
            .stack_frames(stack)
            .map(|f| self.p.frame_name(f))
            .collect();
        names.reverse();
        names.join(";")
    }
}

fn cap(n: u32) -> RepairOptions {
    RepairOptions {
        cap: Some(n),
        ..RepairOptions::default()
    }
}

#[test]
fn a_run_at_the_start_is_anchored_by_a_later_sample() {
    let mut b = Builder::new("test");
    // Cap 4. The first two samples are cut; only the third, complete and deep enough, anchors them.
    b.sample(1, "c;d;e;x");
    b.sample(2, "c;d;e;y");
    b.sample(3, "main;a;b");
    b.sample(4, "main;a;b;c");
    let report = repair(&mut b.p, &cap(4)).unwrap();
    assert_eq!(
        report.outcomes,
        [
            SampleOutcome::Unrepairable,
            SampleOutcome::Unrepairable,
            SampleOutcome::Whole,
            SampleOutcome::Whole
        ]
    );
    // With a later sample that overlaps, the backward pass repairs both, the first through the
    // second.
    // (`main` alone shows that `main` is the thread's root, so `main;a;b;c` at the cap is whole.)
    let mut b = Builder::new("test");
    b.sample(0, "main");
    b.sample(1, "c;d;e;x");
    b.sample(2, "b;c;d;y");
    b.sample(3, "main;a;b;c");
    let report = repair(&mut b.p, &cap(4)).unwrap();
    assert_eq!(
        report.outcomes[1..],
        [
            SampleOutcome::Exact,
            SampleOutcome::Exact,
            SampleOutcome::Whole
        ]
    );
    assert_eq!(b.stack_names(1), "main;a;b;c;d;e;x");
    assert_eq!(b.stack_names(2), "main;a;b;c;d;y");
}

#[test]
fn unalignable_samples_are_kept_with_a_marker_below_leading_pseudo_frames() {
    let mut b = Builder::new("test");
    let threads = b.p.intern_named_frame("Threads", FrameKind::Pseudo);
    let push = |b: &mut Builder, t: u64, names: &str| {
        let mut frames = vec![threads];
        frames.extend(b.frames(names));
        let stack = b.p.intern_stack_root_first(frames).unwrap();
        b.p.push_sample(t, b.thread, stack, &[1]).unwrap();
    };
    push(&mut b, 1, "main;a");
    push(&mut b, 2, "x;y;z");
    let report = repair(&mut b.p, &cap(3)).unwrap();
    assert_eq!(report.outcomes[1], SampleOutcome::Unrepairable);
    assert_eq!(b.stack_names(1), "Threads;[truncated: depth cap 3];x;y;z");
    assert_eq!(b.p.metadata.truncated_samples, 1);
    assert_eq!(b.p.metadata.extra["repair.unrepairable"], "1");
    assert_eq!(b.stack_names(0), "Threads;main;a");
}

#[test]
fn samples_out_of_time_order_are_repaired_in_time_order() {
    let mut b = Builder::new("test");
    b.sample(3, "d;e;f;z"); // cut, at t=3: its donor is the repaired t=2 sample
    b.sample(1, "main;a;b;c");
    b.sample(2, "b;c;d;e"); // cut
    b.sample(0, "main");
    let report = repair(&mut b.p, &cap(4)).unwrap();
    assert_eq!(
        report.outcomes,
        [
            SampleOutcome::Exact,
            SampleOutcome::Whole,
            SampleOutcome::Exact,
            SampleOutcome::Whole
        ]
    );
    assert_eq!(b.stack_names(0), "main;a;b;c;d;e;f;z");
}

#[test]
fn threads_do_not_lend_frames_to_each_other() {
    let mut b = Builder::new("test");
    b.sample(1, "main;a;b;c");
    let other = b.p.intern_thread(1, 2);
    let frames = b.frames("b;c;d;e");
    let stack = b.p.intern_stack_root_first(frames).unwrap();
    b.p.push_sample(2, other, stack, &[1]).unwrap();
    let report = repair(&mut b.p, &cap(4)).unwrap();
    // On thread 2 nothing is complete: the cut sample cannot borrow thread 1's base.
    assert_eq!(report.outcomes[1], SampleOutcome::Unrepairable);
    assert_eq!(report.threads.len(), 2);
}

#[test]
fn perf_cap_applies_to_perf_and_whole_native_stacks_stay() {
    // A perf-like profile: the cap of 127 comes from the producer.
    let deep: Vec<String> = (0..140).map(|i| format!("f{i}")).collect();
    let whole = format!("_start;main;{}", deep.join(";"));
    let mut b = Builder::new("perf script");
    b.sample(1, &whole.split(';').take(120).collect::<Vec<_>>().join(";"));
    let all: Vec<&str> = whole.split(';').collect();
    b.sample(2, &all[all.len() - 127..].join(";"));
    let report = repair(&mut b.p, &RepairOptions::default()).unwrap();
    assert_eq!(
        report.cap.map(|c| (c.depth, c.source)),
        Some((127, CapSource::Producer))
    );
    assert_eq!(report.outcomes[1], SampleOutcome::Exact);
    assert_eq!(b.stack_names(1), whole);

    // rootline record writes whole stacks; 130 deep and 127 deep both end at `_start`.
    let mut b = Builder::new("rootline record");
    b.sample(1, &all[..130].join(";"));
    b.sample(2, &all[..127].join(";"));
    b.sample(3, &all[..127].join(";"));
    let before = b.p.samples().clone();
    let report = repair(&mut b.p, &cap(127)).unwrap();
    assert_eq!(report.totals().truncated, 0);
    assert_eq!(b.p.samples(), &before);
}

#[test]
fn empty_and_pseudo_only_profiles_are_fine() {
    let mut b = Builder::new("dotnet-trace");
    let report = repair(&mut b.p, &RepairOptions::default()).unwrap();
    assert!(report.outcomes.is_empty());
    let cpu = b.p.intern_named_frame("CPU_TIME", FrameKind::Managed);
    let stack = b.p.intern_stack(None, cpu);
    b.p.push_sample(1, b.thread, stack, &[1]).unwrap();
    let report = repair(&mut b.p, &RepairOptions::default()).unwrap();
    assert_eq!(report.outcomes, [SampleOutcome::Whole]);
}

#[test]
fn frames_align_by_function_so_rejitted_code_still_matches() {
    // The donor ran tier-0 code of `b` and `c` (one address), the cut sample tier-1 code (another):
    // different frames of the same functions.
    let mut b = Builder::new("test");
    let frame = |b: &mut Builder, name: &str, address: u64| {
        let id = b.p.intern_named_frame(name, FrameKind::Jit);
        let f = *b.p.frame(id);
        b.p.intern_frame(rootline_profile::Frame { address, ..f })
    };
    let main = frame(&mut b, "main", 0x10);
    let donor = [
        main,
        frame(&mut b, "a", 0x20),
        frame(&mut b, "b", 0x30),
        frame(&mut b, "c", 0x40),
    ];
    let cut = [
        frame(&mut b, "b", 0x130),
        frame(&mut b, "c", 0x140),
        frame(&mut b, "d", 0x150),
    ];
    let donor = b.p.intern_stack_root_first(donor).unwrap();
    let cut = b.p.intern_stack_root_first(cut).unwrap();
    b.p.push_sample(1, b.thread, donor, &[1]).unwrap();
    b.p.push_sample(2, b.thread, cut, &[1]).unwrap();
    let report = repair(&mut b.p, &cap(3)).unwrap();
    assert_eq!(report.outcomes[1], SampleOutcome::Exact);
    let repaired: Vec<u64> =
        b.p.stack_frames(b.p.samples().stacks[1])
            .map(|f| b.p.frame(f).address)
            .collect();
    // The base is the donor's own frames; the cut part keeps its addresses.
    assert_eq!(repaired, [0x150, 0x140, 0x130, 0x20, 0x10]);
}

#[test]
fn a_shallow_sample_between_deep_ones_does_not_break_the_chain() {
    let mut b = Builder::new("test");
    b.sample(1, "main;a;b;c"); // complete (cap 5)
    b.sample(2, "b;c;d;e;x"); // cut: repaired from sample 1
    b.sample(3, "main;print"); // complete but shares nothing with the cut stacks
    b.sample(4, "c;d;e;f;y"); // cut: the nearest donors offer nothing; the last repair does
    let report = repair(&mut b.p, &cap(5)).unwrap();
    assert_eq!(report.outcomes[3], SampleOutcome::Exact);
    assert_eq!(b.stack_names(3), "main;a;b;c;d;e;f;y");
}

/// Samples (index) whose stack carries the repair gap frame, and the gap count of each.
fn gaps(b: &Builder) -> Vec<(usize, usize)> {
    let samples = b.p.samples();
    (0..samples.len())
        .filter_map(|i| {
            let n =
                b.p.stack_frames(samples.stacks[i])
                    .filter(|&f| rootline_profile::pseudo::is_repair_gap(&b.p, f))
                    .count();
            (n > 0).then_some((i, n))
        })
        .collect()
}

#[test]
fn a_guessed_join_inside_a_recursion_shows_the_gap() {
    let mut b = Builder::new("test");
    // Cap 5. How many `r` the cut hid no neighbour can say.
    b.sample(0, "main;w;r;r");
    b.sample(1, "r;r;r;r;x");
    let report = repair(&mut b.p, &cap(5)).unwrap();
    assert_eq!(report.outcomes[1], SampleOutcome::Ambiguous);
    assert_eq!(
        b.stack_names(1),
        "main;w;[repair: frames unknown];r;r;r;r;x"
    );
    let gap =
        b.p.stack_frames(b.p.samples().stacks[1])
            .find(|&f| rootline_profile::pseudo::is_repair_gap(&b.p, f))
            .unwrap();
    assert_eq!(b.p.frame(gap).kind, FrameKind::Pseudo);
    assert_eq!(gaps(&b), [(1, 1)]);
    assert_eq!(b.p.metadata.extra["repair.ambiguous"], "1");
    assert_eq!(b.p.metadata.extra["repair.exact"], "0");
    assert_eq!(b.p.metadata.extra["repair.unrepairable"], "0");
    // A gap is not a truncation: the stack reaches its root.
    assert_eq!(b.p.metadata.truncated_samples, 0);
}

#[test]
fn an_exact_join_has_no_gap_and_an_exact_join_to_a_guess_inherits_its_one_gap() {
    let mut b = Builder::new("test");
    // Cap 5. Sample 1 sits between two complete samples that disagree on its base (`a` or `b`):
    // a guess, marked. Sample 2 aligns exactly (`e;f;g`) with sample 1's repair, so it lends its
    // base and its gap. Sample 4 aligns exactly with sample 3, a complete sample: no gap.
    b.sample(0, "main;a;c;d");
    b.sample(1, "c;d;e;f;g");
    b.sample(2, "e;f;g;h;i");
    b.sample(3, "main;b;c;d");
    b.sample(4, "c;d;k;l;m");
    let report = repair(&mut b.p, &cap(5)).unwrap();
    assert_eq!(
        report.outcomes,
        [
            SampleOutcome::Whole,
            SampleOutcome::Ambiguous,
            SampleOutcome::Ambiguous,
            SampleOutcome::Whole,
            SampleOutcome::Exact
        ]
    );
    assert_eq!(
        b.stack_names(1),
        "main;a;[repair: frames unknown];c;d;e;f;g"
    );
    assert_eq!(
        b.stack_names(2),
        "main;a;[repair: frames unknown];c;d;e;f;g;h;i"
    );
    assert_eq!(b.stack_names(4), "main;b;c;d;k;l;m");
    assert_eq!(gaps(&b), [(1, 1), (2, 1)]);
}

#[test]
fn a_guess_on_a_guess_keeps_one_gap_and_only_the_samples_own_frames_after_it() {
    let mut b = Builder::new("test");
    // Cap 5. Sample 2 aligns with sample 1's repair inside the recursion again: the `r` frames that
    // sample 1 had between its gap and this join are as unsure as the join, so they go.
    b.sample(0, "main;w;r;r");
    b.sample(1, "r;r;r;r;x");
    b.sample(2, "r;x;y;z;q");
    let report = repair(&mut b.p, &cap(5)).unwrap();
    assert_eq!(report.outcomes[2], SampleOutcome::Ambiguous);
    assert_eq!(
        b.stack_names(2),
        "main;w;[repair: frames unknown];r;x;y;z;q"
    );
    assert_eq!(gaps(&b), [(1, 1), (2, 1)]);
    // Repairing again changes nothing: repaired stacks are deeper than the cap.
    let before = b.p.samples().stacks.clone();
    let again = repair(&mut b.p, &cap(5)).unwrap();
    assert_eq!(again.totals().truncated, 0);
    assert_eq!(b.p.samples().stacks, before);
}
