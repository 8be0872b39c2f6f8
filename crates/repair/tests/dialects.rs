//! Repair of generated deep .NET-like stacks written in dotnet-trace's Chromium and speedscope
//! dialects, read back with rootline's readers: once whole, once cut to the 100 leaf-most managed
//! frames as EventPipe cuts them.

mod support;

use std::collections::HashMap;

use rootline_formats::{chromium, speedscope};
use rootline_profile::Profile;
use rootline_repair::{RepairOptions, RepairReport, SampleOutcome, repair};
use support::dotnet_like::{Config, generate, names};
use support::dotnet_trace_files::{write_chromium, write_speedscope};

struct Outcome {
    exact: usize,
    exact_right: usize,
    ambiguous: usize,
    unrepairable: usize,
}

/// Repairs `cut` and compares every sample with the sample of `whole` on the same thread at the
/// same time.
fn repair_and_compare(whole: &Profile, cut: &mut Profile) -> (RepairReport, Outcome) {
    let truth: HashMap<(u32, u64), Vec<String>> = (0..whole.samples().len())
        .map(|i| {
            let s = whole.samples();
            let tid = whole.thread(s.threads[i]).tid;
            ((tid, s.times[i]), names(whole, s.stacks[i]))
        })
        .collect();
    let before = cut.samples().clone();
    let report = repair(cut, &RepairOptions::default()).unwrap();
    let after = cut.samples();
    assert_eq!(after.times, before.times);
    assert_eq!(after.values, before.values);
    let mut o = Outcome {
        exact: 0,
        exact_right: 0,
        ambiguous: 0,
        unrepairable: 0,
    };
    for i in 0..after.len() {
        let tid = cut.thread(after.threads[i]).tid;
        let expected = &truth[&(tid, after.times[i])];
        let got = names(cut, after.stacks[i]);
        match report.outcomes[i] {
            SampleOutcome::Whole => {
                assert_eq!(after.stacks[i], before.stacks[i]);
                assert_eq!(&got, expected, "sample {i} is whole in the cut file");
            }
            SampleOutcome::Exact => {
                o.exact += 1;
                o.exact_right += usize::from(&got == expected);
            }
            SampleOutcome::Ambiguous => o.ambiguous += 1,
            SampleOutcome::Unrepairable => o.unrepairable += 1,
        }
    }
    (report, o)
}

fn check(o: &Outcome, what: &str) {
    eprintln!(
        "{what}: exact {} ({} right), ambiguous {}, unrepairable {}",
        o.exact, o.exact_right, o.ambiguous, o.unrepairable
    );
    assert!(o.exact > 1000, "{what}: only {} exact", o.exact);
    assert!(o.ambiguous > 0, "{what}: recursion never flagged");
    assert!(
        o.exact_right * 100 >= o.exact * 99,
        "{what}: {} of {} exact repairs right",
        o.exact_right,
        o.exact
    );
}

/// Spans (`B` events) of the frame named `name` per thread in a Chromium file. A plain text scan
/// (each event is one flat JSON object), fast even in unoptimised test builds.
fn begins(json: &[u8], name: &str) -> HashMap<u64, usize> {
    let text = std::str::from_utf8(json).unwrap();
    let (events, _) = text.split_once("stackFrames").unwrap();
    let mut out = HashMap::new();
    for (at, _) in events.match_indices(name) {
        let start = events[..at].rfind('{').unwrap();
        let end = at + events[at..].find('}').unwrap();
        let event: serde_json::Value = serde_json::from_str(&events[start..=end]).unwrap();
        if event["ph"] == "B" && event["name"].as_str().is_some_and(|n| n.ends_with(name)) {
            *out.entry(event["tid"].as_u64().unwrap()).or_default() += 1;
        }
    }
    out
}

fn config() -> Config {
    Config {
        workers: 2,
        ticks: 1000,
        seed: 23,
        ..Config::default()
    }
}

#[test]
fn chromium_dialect_repairs_to_the_whole_stacks_and_continuous_spans() {
    let g = generate(&config());
    let (mut whole_json, mut cut_json) = (Vec::new(), Vec::new());
    write_chromium(g.whole.as_ref().unwrap(), &mut whole_json).unwrap();
    write_chromium(&g.cut, &mut cut_json).unwrap();
    let whole = chromium::read(&whole_json[..]).unwrap();
    let mut cut = chromium::read(&cut_json[..]).unwrap();
    assert!(
        cut.metadata.producer.contains("dotnet-trace"),
        "{}",
        cut.metadata.producer
    );

    let (report, o) = repair_and_compare(&whole, &mut cut);
    check(&o, "chromium");
    assert_eq!(report.cap.unwrap().depth, 100);

    // Written back in the same dialect, the spans of the thread roots are as continuous as in the
    // whole trace on every thread the repair left no sample unrepaired.
    let mut fixed_json = Vec::new();
    chromium::write(&cut, &mut fixed_json).unwrap();
    for root in [
        "Thread.StartCallback()",
        "App.Program.Main(class System.String[])",
    ] {
        let (w, c, f) = (
            begins(&whole_json, root),
            begins(&cut_json, root),
            begins(&fixed_json, root),
        );
        for t in &report.threads {
            let tid = u64::from(t.tid);
            let Some(&whole_spans) = w.get(&tid) else {
                continue;
            };
            eprintln!(
                "{root} on {tid}: whole {whole_spans}, cut {}, repaired {}",
                c.get(&tid).copied().unwrap_or(0),
                f.get(&tid).copied().unwrap_or(0)
            );
            assert!(
                c.get(&tid).copied().unwrap_or(0) > whole_spans,
                "{root} on {tid} not split"
            );
            if t.unrepairable == 0 {
                assert_eq!(f.get(&tid), Some(&whole_spans), "{root} on {tid}");
            }
        }
    }
}

#[test]
fn speedscope_dialect_repairs_to_the_whole_stacks() {
    let g = generate(&config());
    let (mut whole_json, mut cut_json) = (Vec::new(), Vec::new());
    write_speedscope(g.whole.as_ref().unwrap(), &mut whole_json).unwrap();
    write_speedscope(&g.cut, &mut cut_json).unwrap();
    let whole = speedscope::read(&whole_json[..]).unwrap();
    let mut cut = speedscope::read(&cut_json[..]).unwrap();
    // The cap is known from dotnet-trace's exporter tag.
    let (report, o) = repair_and_compare(&whole, &mut cut);
    check(&o, "speedscope");
    let cap = report.cap.unwrap();
    assert_eq!((cap.depth, cap.source.as_str()), (100, "producer"));
    // And the repaired profile is a valid speedscope file again.
    let mut out = Vec::new();
    speedscope::write(&cut, &mut out).unwrap();
    assert_eq!(
        speedscope::read(&out[..]).unwrap().samples().len(),
        cut.samples().len()
    );
}
