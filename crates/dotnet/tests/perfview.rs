//! The reader against real traces from perfview's test inputs, checked against TraceEvent's
//! per-event-type counts (the `.baseline.txt` files beside them). These files are among the optional
//! third-party fixtures: without them the tests skip; `live.rs` and `corrupt.rs` read traces
//! collected at test time.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{FIXTURES, count_events, fixture, perfview_dir};
use rootline_dotnet::read_profile_with_stats;
use rootline_profile::FrameKind;

/// Per provider, the sorted event counts of a TraceEvent baseline (`Provider/Task/Opcode, count, …`).
fn baseline_counts(dir: &Path, name: &str) -> BTreeMap<String, Vec<u64>> {
    let path = dir.join(format!("{name}.nettrace.baseline.txt"));
    let text = std::fs::read_to_string(&path).expect("baseline");
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim_start_matches('\u{feff}');
        let mut parts = line.splitn(3, ", ");
        let (Some(event), Some(count)) = (parts.next(), parts.next()) else {
            continue;
        };
        let provider = event.split('/').next().unwrap().to_string();
        out.entry(provider)
            .or_default()
            .push(count.parse().expect("count"));
    }
    for v in out.values_mut() {
        v.sort_unstable();
    }
    out
}

type ById = BTreeMap<(String, u32), u64>;
type ByProvider = BTreeMap<String, Vec<u64>>;

fn our_counts(dir: &Path, name: &str) -> (ById, ByProvider) {
    let by_id = count_events(&fixture(dir, name));
    // TraceEvent's 3.0 baseline has no line for runtime event 190 (35 events, no manifest name in
    // that TraceEvent) and lists runtime events 200 and 201 (15 + 1) under a single name "GC" (16).
    let mut by_id_as_traceevent_names = by_id.clone();
    if name == FIXTURES[0] {
        let rt = |id: u32| ("Microsoft-Windows-DotNETRuntime".to_string(), id);
        assert_eq!(by_id_as_traceevent_names.remove(&rt(190)), Some(35));
        let merged = by_id_as_traceevent_names.remove(&rt(201)).unwrap_or(0);
        *by_id_as_traceevent_names.get_mut(&rt(200)).unwrap() += merged;
    }
    // TraceEvent's 5.0 baseline has no lines for the rundown's method events 144
    // (MethodDCEndVerbose, 1499) and 150 (MethodDCEndILToNativeMap, 363).
    if name == FIXTURES[1] {
        let rd = |id: u32| ("Microsoft-Windows-DotNETRuntimeRundown".to_string(), id);
        assert_eq!(by_id_as_traceevent_names.remove(&rd(144)), Some(1499));
        assert_eq!(by_id_as_traceevent_names.remove(&rd(150)), Some(363));
    }
    let mut by_provider: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for ((provider, _), n) in &by_id_as_traceevent_names {
        by_provider.entry(provider.clone()).or_default().push(*n);
    }
    for v in by_provider.values_mut() {
        v.sort_unstable();
    }
    (by_id, by_provider)
}

#[test]
fn event_counts_equal_traceevent_baselines() {
    let Some(dir) = perfview_dir("event_counts_equal_traceevent_baselines") else {
        return;
    };
    for name in [FIXTURES[0], FIXTURES[1], FIXTURES[2]] {
        let (_, ours) = our_counts(&dir, name);
        assert_eq!(ours, baseline_counts(&dir, name), "{name}");
    }
}

#[test]
fn dotnetcore30_counts_of_the_events_a_profile_uses() {
    let Some(dir) = perfview_dir("dotnetcore30_counts_of_the_events_a_profile_uses") else {
        return;
    };
    let (by_id, _) = our_counts(&dir, FIXTURES[0]);
    let get = |p: &str, id: u32| by_id.get(&(p.to_string(), id)).copied().unwrap_or(0);
    assert_eq!(get("Microsoft-DotNETCore-SampleProfiler", 0), 35_161);
    assert_eq!(get("Microsoft-Windows-DotNETRuntime", 10), 35_458); // GCAllocationTick
    assert_eq!(get("Microsoft-Windows-DotNETRuntime", 143), 53); // MethodLoadVerbose
    assert_eq!(get("Microsoft-Windows-DotNETRuntime", 152), 14); // ModuleLoad
}

#[test]
fn dotnetcore30_profile_has_every_sample_and_allocation_tick() {
    let Some(dir) = perfview_dir("dotnetcore30_profile_has_every_sample_and_allocation_tick")
    else {
        return;
    };
    let (profile, stats) = read_profile_with_stats(&fixture(&dir, FIXTURES[0])[..]).unwrap();
    assert_eq!(stats.managed_samples + stats.external_samples, 35_161);
    assert_eq!(stats.allocation_ticks, 35_458);
    assert_eq!(profile.samples().len(), 35_161 + 35_458);
    let types: Vec<&str> = profile
        .sample_types()
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(types, ["samples", "wall", "alloc-bytes", "alloc-count"]);
    let totals = profile.totals();
    assert_eq!(totals[0], 35_161);
    // Every tick reports at least the 100 KB tick threshold (more when a large object crossed it).
    assert_eq!(totals[2], 4_235_066_536);
    assert!(totals[2] > 35_458 * 100_000);
    assert_eq!(totals[3], 35_458);
    // Each tick's stack ends in the allocated type; thread samples' stacks end in code.
    let mut by_type: std::collections::BTreeMap<&str, i64> = Default::default();
    for (i, &stack) in profile.samples().stacks.iter().enumerate() {
        let leaf = profile.stack(stack).frame;
        let ty = rootline_profile::pseudo::alloc_type_of(profile.frame_name(leaf));
        let ticks = profile.samples().values[3][i];
        assert_eq!(ty.is_some(), ticks == 1, "{}", profile.frame_name(leaf));
        if let Some(ty) = ty {
            assert_eq!(profile.frame(leaf).kind, FrameKind::Pseudo);
            *by_type.entry(ty).or_default() += profile.samples().values[2][i];
        }
    }
    eprintln!("{by_type:?}");
    assert!(!by_type.contains_key(rootline_profile::pseudo::ALLOC_UNKNOWN_TYPE));
    assert_eq!(profile.metadata.depth_cap, Some(100));
    assert_eq!(profile.metadata.producer, "EventPipe");
    assert_eq!(profile.processes()[0].pid, 10064);
    // Times are Unix nanoseconds in June 2019, in order.
    let times = &profile.samples().times;
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    assert!(times[0] > 1_560_000_000_000_000_000 && times[0] < 1_561_000_000_000_000_000);
}

#[test]
fn speedscope_inputs_resolve_managed_frames_through_rundown() {
    let Some(dir) = perfview_dir("speedscope_inputs_resolve_managed_frames_through_rundown") else {
        return;
    };
    for (name, samples) in [(FIXTURES[3], 6331), (FIXTURES[4], 7423)] {
        let (profile, stats) = read_profile_with_stats(&fixture(&dir, name)[..]).unwrap();
        assert_eq!(profile.samples().len(), samples, "{name}");
        assert_eq!(
            profile.sample_types().len(),
            2,
            "{name}: no allocation column"
        );
        assert!(stats.methods > 400, "{name}: {} methods", stats.methods);
        let named = stats.resolved_sample_frames as f64 / stats.sample_frames as f64;
        assert!(named > 0.95, "{name}: only {named:.3} of frames named");
        // Names look like dotnet-trace's: Module!Namespace.Type.Method(params).
        let mut saw_main = false;
        for frame in profile.frames() {
            assert_eq!(frame.kind, FrameKind::Managed);
            let name = profile.string(profile.function(frame.function).name);
            assert!(name.contains('!'), "{name}");
            saw_main |= name.ends_with(".Main(class System.String[])");
        }
        assert!(saw_main, "{name}: no Main frame");
    }
}

#[test]
fn reads_format_v5_metadata_names_and_v2_array_fields() {
    let Some(dir) = perfview_dir("reads_format_v5_metadata_names_and_v2_array_fields") else {
        return;
    };
    let data = fixture(&dir, FIXTURES[1]);
    let mut reader = rootline_dotnet::NetTraceReader::new(&data[..]).unwrap();
    while reader.next_event().unwrap().is_some() {}
    let test_events: Vec<_> = reader
        .metadata()
        .values()
        .filter(|m| m.provider == "TestEventSource0")
        .collect();
    assert_eq!(test_events.len(), 3);
    let e1 = test_events.iter().find(|m| m.name == "TestEvent1").unwrap();
    assert_eq!(e1.fields[0].type_code, 19, "arg0 is an array");
}
