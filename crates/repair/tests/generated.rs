//! Repair on generated .NET-like profiles: the same samples whole and cut as EventPipe cuts them.

mod support;

use rootline_profile::{FrameKind, Profile};
use rootline_repair::{CapSource, RepairOptions, SampleOutcome, repair};
use support::dotnet_like::{Config, generate, names};

fn managed_depth(profile: &Profile, stack: rootline_profile::StackId) -> usize {
    names(profile, stack)
        .iter()
        .filter(|n| !rootline_profile::pseudo::is_pseudo_name(n))
        .count()
}

#[test]
fn repairing_the_cut_profile_gives_back_the_whole_one() {
    let generated = generate(&Config::default());
    let whole = generated.whole.unwrap();
    let mut cut = generated.cut;
    let before = cut.samples().clone();
    let report = repair(&mut cut, &RepairOptions::default()).unwrap();

    assert_eq!(
        report.cap.map(|c| (c.depth, c.source)),
        Some((100, CapSource::Producer))
    );
    // Nothing deleted, times and values untouched.
    let after = cut.samples();
    assert_eq!(after.len(), before.len());
    assert_eq!(after.times, before.times);
    assert_eq!(after.threads, before.threads);
    assert_eq!(after.values, before.values);

    let (mut deep, mut exact, mut exact_right, mut ambiguous, mut ambiguous_right) =
        (0, 0, 0, 0, 0);
    let mut unrepairable = 0;
    for i in 0..after.len() {
        let truth = names(&whole, whole.samples().stacks[i]);
        let got = names(&cut, after.stacks[i]);
        let was_cut = managed_depth(&whole, whole.samples().stacks[i]) > 100;
        deep += usize::from(was_cut);
        match report.outcomes[i] {
            SampleOutcome::Whole => {
                assert!(!was_cut, "sample {i} was cut but not detected");
                assert_eq!(
                    after.stacks[i], before.stacks[i],
                    "whole sample {i} changed"
                );
            }
            SampleOutcome::Exact => {
                assert!(was_cut, "sample {i} was not cut but was repaired");
                exact += 1;
                exact_right += usize::from(got == truth);
            }
            SampleOutcome::Ambiguous => {
                assert!(was_cut);
                ambiguous += 1;
                ambiguous_right += usize::from(got == truth);
            }
            SampleOutcome::Unrepairable => {
                assert!(was_cut);
                unrepairable += 1;
                // Kept, with the marker right below the producer's leading pseudo frames.
                assert_eq!(got[3], "[truncated: depth cap 100]");
                assert_eq!(got[..3], truth[..3]);
                assert_eq!(got[4..], names(&cut, before.stacks[i])[3..]);
            }
        }
        // A guessed join shows as exactly one gap frame; nothing else has one.
        let gap_frames = got
            .iter()
            .filter(|n| rootline_profile::pseudo::is_repair_gap_name(n))
            .count();
        let expected_gaps = usize::from(report.outcomes[i] == SampleOutcome::Ambiguous);
        assert_eq!(gap_frames, expected_gaps, "sample {i}: {got:?}");
        if report.outcomes[i] != SampleOutcome::Whole {
            // The pseudo frames stay at the root, above the re-attached base; the leaf end is the
            // producer's.
            assert_eq!(got[..3], truth[..3], "sample {i}");
            assert_eq!(got.last(), truth.last(), "sample {i}");
        }
    }
    eprintln!(
        "samples {} cut {deep}: exact {exact} ({exact_right} right), ambiguous {ambiguous} \
         ({ambiguous_right} right), unrepairable {unrepairable}",
        after.len()
    );
    let totals = report.totals();
    assert_eq!(totals.truncated as usize, deep);
    assert_eq!(
        (totals.exact, totals.ambiguous, totals.unrepairable),
        (exact as u64, ambiguous as u64, unrepairable as u64)
    );
    // The generator makes most cut samples alignable with a unique base, and some inside recursion.
    assert!(deep > 1000, "generator made only {deep} cut samples");
    assert!(exact * 2 > deep, "only {exact} of {deep} cut samples exact");
    assert!(ambiguous > 0, "recursion was never flagged ambiguous");
    assert!(
        exact_right * 100 >= exact * 99,
        "only {exact_right} of {exact} exact repairs equal the whole stack"
    );
    assert_eq!(
        cut.metadata.extra.get("repair.exact"),
        Some(&exact.to_string())
    );
    assert_eq!(cut.metadata.truncated_samples, unrepairable as u64);
    // Spans are continuous again: far fewer begin after repair.
    assert!(totals.spans_after * 2 < totals.spans_before, "{totals:?}");
}

#[test]
fn whole_profiles_deeper_than_the_cap_are_left_unchanged() {
    let whole = generate(&Config {
        ticks: 1500,
        ..Config::default()
    })
    .whole
    .unwrap();
    // As rootline record would label it (no cap known: the histogram must not invent one), and as
    // a dotnet-trace file with the cap forced: samples exactly at the cap end at their thread root.
    for (producer, cap) in [("rootline record", None), ("dotnet-trace", Some(100))] {
        let mut p = whole.clone();
        p.metadata.producer = producer.to_string();
        let report = repair(
            &mut p,
            &RepairOptions {
                cap,
                ..RepairOptions::default()
            },
        )
        .unwrap();
        assert_eq!(report.totals().truncated, 0, "{producer}");
        assert_eq!(p.samples(), whole.samples(), "{producer}");
        assert_eq!(p.stacks().len(), whole.stacks().len(), "{producer}");
    }
}

#[test]
fn cap_is_detected_from_the_histogram_without_a_producer_tag() {
    let mut cut = generate(&Config {
        ticks: 1500,
        whole: false,
        ..Config::default()
    })
    .cut;
    cut.metadata.producer = "speedscope file".to_string();
    let report = repair(&mut cut, &RepairOptions::default()).unwrap();
    assert_eq!(
        report.cap.map(|c| (c.depth, c.source)),
        Some((100, CapSource::Histogram))
    );
    assert!(report.totals().exact > 0);
}

#[test]
fn repair_is_idempotent() {
    let mut cut = generate(&Config {
        ticks: 1000,
        whole: false,
        ..Config::default()
    })
    .cut;
    repair(&mut cut, &RepairOptions::default()).unwrap();
    let once = cut.samples().clone();
    let report = repair(&mut cut, &RepairOptions::default()).unwrap();
    assert_eq!(report.totals().truncated, 0);
    assert_eq!(cut.samples(), &once);
    assert!(
        cut.frames()
            .iter()
            .all(|f| f.kind != FrameKind::Truncated || cut.metadata.truncated_samples > 0)
    );
}
