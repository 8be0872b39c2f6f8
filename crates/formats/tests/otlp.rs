//! OTLP profiles: our `ExportProfilesServiceRequest` decoded by PyPI `opentelemetry-proto` (generated
//! from the same proto release), compared table by table and stack by stack.

mod pprof_common;
use pprof_common as common;

use std::collections::{BTreeMap, HashSet};
use std::process::Command;

use common::{fixtures, have_tool, real_tools, rich_profile, run, scratch};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use rootline_formats::{otlp, pprof};
use rootline_profile::Profile;
use serde_json::{Value as Json, json};

fn profiles() -> Vec<(String, Profile)> {
    let mut out = vec![("rich".to_owned(), rich_profile())];
    // Real profiles: Go's, written now, and the fixtures when present.
    let go = real_tools::go_profiles();
    let generated = go.iter().flat_map(|go| [go.cpu.clone(), go.heap.clone()]);
    let present = [
        "pprof/internal/report/testdata/sample.cpu",
        "pprof/internal/driver/testdata/go.nomappings.crash",
        "speedscope/sample/profiles/pprof/simple.prof",
    ]
    .into_iter()
    .filter_map(|path| fixtures::third_party("otlp tests (fixtures)", path));
    for path in generated.chain(present) {
        let bytes = std::fs::read(&path).unwrap();
        out.push((path.display().to_string(), pprof::read(&bytes[..]).unwrap()));
    }
    out
}

/// Per value column: total per stack (names root first, joined by `;`).
fn stacks_per_column(profile: &Profile) -> Vec<BTreeMap<String, i64>> {
    let samples = profile.samples();
    let mut out = vec![BTreeMap::new(); samples.values.len()];
    let mut frames = Vec::new();
    for (i, &stack) in samples.stacks.iter().enumerate() {
        profile.stack_frames_root_first(stack, &mut frames);
        let key = frames
            .iter()
            .map(|&f| profile.frame_name(f))
            .collect::<Vec<_>>()
            .join(";");
        for (c, column) in samples.values.iter().enumerate() {
            *out[c].entry(key.clone()).or_insert(0) += column[i];
        }
    }
    out
}

#[test]
fn python_opentelemetry_proto_decodes_our_request() {
    if !have_tool(
        "python3",
        &[
            "-c",
            "import opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2",
        ],
        "pip install opentelemetry-proto==1.45.2",
    ) {
        return;
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/otlp_decode.py");
    for (name, profile) in profiles() {
        let request = otlp::to_request(&profile);
        let path = scratch("otlp-out").join(format!("{}.otlp.pb", name.replace('/', "_")));
        let mut bytes = Vec::new();
        otlp::write(&profile, &mut bytes).unwrap();
        std::fs::write(&path, &bytes).unwrap();
        let decoded: Json =
            serde_json::from_str(&run(Command::new("python3").arg(&script).arg(&path))).unwrap();

        // The dictionary, field by field, as Python sees it.
        let d = request.dictionary.as_ref().unwrap();
        assert_eq!(decoded["strings"], json!(d.string_table), "{name}");
        let functions: Vec<Json> = d
            .function_table
            .iter()
            .map(|f| {
                json!([
                    f.name_strindex,
                    f.system_name_strindex,
                    f.filename_strindex,
                    f.start_line
                ])
            })
            .collect();
        assert_eq!(decoded["functions"], json!(functions), "{name}");
        let mappings: Vec<Json> = d
            .mapping_table
            .iter()
            .map(|m| {
                json!([
                    m.memory_start,
                    m.memory_limit,
                    m.file_offset,
                    m.filename_strindex,
                    m.attribute_indices
                ])
            })
            .collect();
        assert_eq!(decoded["mappings"], json!(mappings), "{name}");
        let locations: Vec<Json> = d
            .location_table
            .iter()
            .map(|l| {
                let lines: Vec<Json> = l
                    .lines
                    .iter()
                    .map(|x| json!([x.function_index, x.line, x.column]))
                    .collect();
                json!([l.mapping_index, l.address, lines, l.attribute_indices])
            })
            .collect();
        assert_eq!(decoded["locations"], json!(locations), "{name}");
        let attributes: Vec<Json> = d
            .attribute_table
            .iter()
            .map(|a| {
                let value = match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(Value::StringValue(s)) => json!(s),
                    Some(Value::IntValue(n)) => json!(n),
                    None => Json::Null,
                    Some(other) => panic!("unexpected attribute value {other:?}"),
                };
                json!([a.key_strindex, value, a.unit_strindex])
            })
            .collect();
        assert_eq!(decoded["attributes"], json!(attributes), "{name}");
        let stacks: Vec<Json> = d
            .stack_table
            .iter()
            .map(|s| json!(s.location_indices))
            .collect();
        assert_eq!(decoded["stacks"], json!(stacks), "{name}");

        // Every table starts with its zero value; stacks are stored once.
        assert_eq!(d.string_table[0], "");
        assert_eq!(decoded["stacks"][0], json!([]));
        assert_eq!(decoded["functions"][0], json!([0, 0, 0, 0]));
        let distinct: HashSet<_> = profile.samples().stacks.iter().collect();
        assert_eq!(d.stack_table.len(), distinct.len() + 1, "{name}");

        // One OTLP profile per value column, with our counts, totals and stacks.
        let samples = profile.samples();
        let groups: HashSet<_> = samples.threads.iter().zip(&samples.stacks).collect();
        let per_column = stacks_per_column(&profile);
        let decoded_profiles = decoded["profiles"].as_array().unwrap();
        assert_eq!(decoded_profiles.len(), profile.sample_types().len());
        for (c, p) in decoded_profiles.iter().enumerate() {
            let t = &profile.sample_types()[c];
            // Go's names, as in pprof: `alloc_space` for `alloc-bytes`, …
            assert_eq!(p["type"], json!(format!("{}/{}", t.pprof_name(), t.unit)));
            assert_eq!(p["samples"], json!(groups.len()), "{name}");
            assert_eq!(p["events"], json!(samples.len()), "{name}");
            assert_eq!(p["total"], json!(profile.totals()[c]), "{name}");
            assert_eq!(p["stacks"], json!(per_column[c]), "{name}");
            assert_eq!(p["profile_id"].as_str().unwrap().len(), 32);
        }
    }
}

#[test]
fn threads_times_and_frame_kinds_are_attributes() {
    let profile = rich_profile();
    let request = otlp::to_request(&profile);
    let d = request.dictionary.as_ref().unwrap();
    let s = |i: i32| d.string_table[i as usize].as_str();
    let attribute = |i: i32| {
        let a = &d.attribute_table[i as usize];
        let value = match a.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(Value::StringValue(v)) => v.clone(),
            Some(Value::IntValue(n)) => n.to_string(),
            _ => String::new(),
        };
        format!("{}={value}", s(a.key_strindex))
    };
    let scope = &request.resource_profiles[0].scope_profiles[0];
    let first = &scope.profiles[0];
    // Events of one thread and stack are one sample with a value and a timestamp per event.
    let sample = &first.samples[0];
    assert_eq!(sample.values, [1, 4]);
    let t0 = profile.metadata.start_time_ns;
    assert_eq!(sample.timestamps_unix_nano, [t0, t0 + 3 * 1_001_001]);
    let attrs: Vec<String> = sample
        .attribute_indices
        .iter()
        .map(|&i| attribute(i))
        .collect();
    assert_eq!(
        attrs,
        ["thread.id=11", "process.pid=10", "thread.name=worker-1"]
    );
    // Frame kinds.
    let mut kinds: Vec<String> = d
        .location_table
        .iter()
        .flat_map(|l| l.attribute_indices.iter().map(|&i| attribute(i)))
        .collect();
    kinds.sort();
    kinds.dedup();
    assert_eq!(
        kinds,
        [
            "profile.frame.type=kernel",
            "profile.frame.type=native",
            "profile.frame.type=truncated"
        ]
    );
    // The inlined chain is one location, innermost first.
    let inlined: Vec<Vec<&str>> = d
        .location_table
        .iter()
        .filter(|l| l.lines.len() > 1)
        .map(|l| {
            l.lines
                .iter()
                .map(|x| s(d.function_table[x.function_index as usize].name_strindex))
                .collect()
        })
        .collect();
    assert_eq!(inlined, [["inlined_inner", "inlined_outer", "work"]]);
    // The build id is a mapping attribute.
    let mapping = &d.mapping_table[1];
    assert_eq!(
        attribute(mapping.attribute_indices[0]),
        "process.executable.build_id.gnu=0123456789abcdef"
    );
    assert_eq!(first.period, 1_000_000_000 / 999);
    assert_eq!(first.time_unix_nano, t0);
}
