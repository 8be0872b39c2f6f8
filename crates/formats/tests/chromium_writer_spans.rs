//! The Chromium writer's span shape: spans follow functions (not addresses), and profiles that
//! carry counts instead of times keep their proportions.

use rootline_formats::{chromium, folded};
use rootline_profile::{Frame, FrameKind, Function, Profile, SampleType};

fn count_phase(json: &str, name: &str, phase: &str) -> usize {
    json.matches(&format!(
        "{{\"name\":\"{name}\",\"cat\":\"sampleEvent\",\"ph\":\"{phase}\""
    ))
    .count()
}

#[test]
fn one_span_per_call_even_when_the_address_changes() {
    let mut p = Profile::new(vec![SampleType::wall_nanoseconds()]);
    let t = p.intern_thread(1, 1);
    let main_name = p.intern_string("Main");
    let main_fn = p.intern_function(Function::new(main_name, None));
    let leaf_a = p.intern_named_frame("A", FrameKind::Managed);
    let leaf_b = p.intern_named_frame("B", FrameKind::Managed);
    // Main at three call sites (three addresses), one call of Main throughout.
    for (k, (address, leaf)) in [(0x10, leaf_a), (0x20, leaf_b), (0x30, leaf_a)]
        .into_iter()
        .enumerate()
    {
        let main = p.intern_frame(Frame {
            function: main_fn,
            mapping: None,
            address,
            line: None,
            inline_depth: 0,
            kind: FrameKind::Managed,
            from_live_memory: false,
        });
        let stack = p.intern_stack_root_first([main, leaf]).unwrap();
        p.push_sample(k as u64 * 1_000_000, t, stack, &[1_000_000])
            .unwrap();
    }
    let mut out = Vec::new();
    chromium::write(&p, &mut out).unwrap();
    let json = String::from_utf8(out).unwrap();
    assert_eq!(count_phase(&json, "Main", "B"), 1, "{json}");
    assert_eq!(count_phase(&json, "Main", "E"), 1, "{json}");
    assert_eq!(count_phase(&json, "A", "B"), 2, "{json}");
    // Still a valid trace whose stacks read back by name.
    let back = chromium::read(json.as_bytes()).unwrap();
    let mut frames = Vec::new();
    let names: Vec<String> = back
        .samples()
        .stacks
        .iter()
        .map(|&s| {
            back.stack_frames_root_first(s, &mut frames);
            frames
                .iter()
                .map(|&f| back.frame_name(f))
                .collect::<Vec<_>>()
                .join(";")
        })
        .collect();
    assert_eq!(names, ["Main;A", "Main;B", "Main;A"]);
}

#[test]
fn collapsed_counts_become_proportional_span_lengths() {
    let p = folded::read("app;main;hot 90\napp;main;cold 10\n".as_bytes()).unwrap();
    let mut out = Vec::new();
    chromium::write(&p, &mut out).unwrap();
    let back = chromium::read(&out[..]).unwrap();
    let wall = back
        .sample_types()
        .iter()
        .position(|t| t.name == "wall")
        .unwrap();
    let samples = back.samples();
    let mut frames = Vec::new();
    let mut hot = 0;
    let mut total = 0;
    for (i, &stack) in samples.stacks.iter().enumerate() {
        back.stack_frames_root_first(stack, &mut frames);
        let value = samples.values[wall][i];
        total += value;
        if frames.last().is_some_and(|&f| back.frame_name(f) == "hot") {
            hot += value;
        }
    }
    assert_eq!(hot * 10, total * 9, "hot {hot} of {total}");
}

#[test]
fn an_off_cpu_interval_is_a_slice_as_long_as_the_thread_stayed_off() {
    let mut p = Profile::new(vec![
        SampleType::cpu_nanoseconds(),
        SampleType::off_cpu_nanoseconds(),
        SampleType::wall_nanoseconds(),
    ]);
    let t = p.intern_thread(1, 1);
    let main = p.intern_named_frame("main", FrameKind::Native);
    let work = p.intern_named_frame("work", FrameKind::Native);
    let wait = p.intern_named_frame("wait", FrameKind::Native);
    let off = p.intern_named_frame("[off-cpu: blocked]", FrameKind::Pseudo);
    let working = p.intern_stack_root_first([main, work]).unwrap();
    let blocked = p.intern_stack_root_first([main, wait, off]).unwrap();
    // Work for 1 ms, block at 1 ms for 5 ms, the next CPU sample at 10 ms (the sampler saw the
    // thread again only then).
    p.push_sample(0, t, working, &[1_000_000, 0, 1_000_000])
        .unwrap();
    p.push_sample(1_000_000, t, blocked, &[0, 5_000_000, 5_000_000])
        .unwrap();
    p.push_sample(10_000_000, t, working, &[1_000_000, 0, 1_000_000])
        .unwrap();
    let mut out = Vec::new();
    chromium::write(&p, &mut out).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let at = |name: &str, ph: &str| -> Vec<f64> {
        json["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == name && e["ph"] == ph)
            .map(|e| e["ts"].as_f64().unwrap())
            .collect()
    };
    // The blocked slice runs from 1 ms to 6 ms (in µs), not to the next sample at 10 ms.
    assert_eq!(at("[off-cpu: blocked]", "B"), vec![1000.0]);
    assert_eq!(at("[off-cpu: blocked]", "E"), vec![6000.0]);
    assert_eq!(at("wait", "E"), vec![6000.0]);
}
