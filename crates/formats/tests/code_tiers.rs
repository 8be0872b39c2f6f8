//! A .NET method seen at two JIT code tiers, written to every format: folded output merges the
//! two (one name), and each format that has a place for the tier or the runtime's own name keeps
//! it where its real readers see it (`go tool pprof -raw`, the Python OTLP protos, JSON parsers,
//! our own readers).

mod pprof_common;
use pprof_common as common;

use std::collections::BTreeMap;
use std::process::Command;

use common::{have_tool, run, scratch};
use rootline_formats::{chromium, folded, fxprof, otlp, pprof, speedscope};
use rootline_profile::{Frame, FrameKind, Function, Profile, SampleType};
use serde_json::Value as Json;

const SPIN: &str = "Calls::Spin(int32)";
const TIERS: [(&str, i64); 2] = [("QuickJitted", 2), ("OptimizedTier1OSR", 3)];

fn raw(tier: &str) -> String {
    format!("int32 [Calls] Calls::Spin(int32)[{tier}]")
}

/// `Main → Spin`, Spin sampled at two tiers (2 and 3 samples of 1 ms).
fn two_tiers() -> Profile {
    let mut p = Profile::new(vec![SampleType::wall_nanoseconds()]);
    let thread = p.intern_thread(7, 7);
    p.set_thread_name(thread, "main");
    let main = p.intern_named_frame("Calls::Main(string[])", FrameKind::Managed);
    let name = p.intern_string(SPIN);
    let mut time = 0;
    for (i, (tier, count)) in TIERS.into_iter().enumerate() {
        let function = Function {
            system_name: Some(p.intern_string(&raw(tier))),
            tier: Some(p.intern_string(tier)),
            ..Function::new(name, None)
        };
        let function = p.intern_function(function);
        let frame = p.intern_frame(Frame {
            function,
            mapping: None,
            address: 0x7f00_0000_1000 + 0x100 * i as u64,
            line: None,
            inline_depth: 0,
            kind: FrameKind::Managed,
            from_live_memory: false,
        });
        let root = p.intern_stack(None, main);
        let leaf = p.intern_stack(Some(root), frame);
        for _ in 0..count {
            p.push_sample(time, thread, leaf, &[1_000_000]).unwrap();
            time += 1_000_000;
        }
    }
    p
}

#[test]
fn folded_output_merges_the_tiers_of_one_method() {
    let p = two_tiers();
    assert_eq!(p.functions().len(), 3, "two Spin functions and Main");
    let lines: Vec<(String, i64)> = folded::lines(&p).into_iter().collect();
    assert_eq!(
        lines,
        [(format!("main;Calls::Main(string[]);{SPIN}"), 5_000_000)],
        "one line for both tiers"
    );
    let mut text = Vec::new();
    folded::write(&p, &mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(!text.contains("Tier"), "{text}");
}

#[test]
fn pprof_system_names_are_the_runtime_names() {
    let p = two_tiers();
    let path = scratch("code-tiers").join("tiers.pb.gz");
    let mut bytes = Vec::new();
    pprof::write(&p, &mut bytes).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    // Our reader keeps them.
    let back = pprof::read(&bytes[..]).unwrap();
    let mut system: Vec<&str> = back
        .functions()
        .iter()
        .filter_map(|f| Some(back.string(f.system_name?)))
        .collect();
    system.sort();
    assert_eq!(system, [raw("OptimizedTier1OSR"), raw("QuickJitted")]);
    // `go tool pprof -raw` prints a function's system name beside its name when they differ.
    if have_tool("go", &["version"], "apt-get install golang-go") {
        let text = run(Command::new("go")
            .args(["tool", "pprof", "-raw", "-symbolize=none"])
            .arg(&path)
            .env("PPROF_BINARY_PATH", scratch("no-binaries")));
        for (tier, _) in TIERS {
            assert!(
                text.contains(&format!("({})", raw(tier))),
                "{tier}:\n{text}"
            );
        }
        assert!(!text.contains("(Calls::Main"), "{text}");
    }
}

#[test]
fn otlp_locations_carry_the_tier_and_functions_the_system_name() {
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
    let p = two_tiers();
    let path = scratch("code-tiers").join("tiers.otlp.pb");
    let mut bytes = Vec::new();
    otlp::write(&p, &mut bytes).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/otlp_decode.py");
    let d: Json =
        serde_json::from_str(&run(Command::new("python3").arg(&script).arg(&path))).unwrap();
    let strings: Vec<&str> = d["strings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let s = |v: &Json| strings[v.as_u64().unwrap() as usize];
    // Per location: its function's name and system name, and its code tier attribute.
    let mut seen = BTreeMap::new();
    for location in d["locations"].as_array().unwrap().iter().skip(1) {
        let line = &location[2][0];
        let function = &d["functions"][line[0].as_u64().unwrap() as usize];
        let tier = location[3].as_array().unwrap().iter().find_map(|a| {
            let attribute = &d["attributes"][a.as_u64().unwrap() as usize];
            (s(&attribute[0]) == otlp::CODE_TIER_ATTRIBUTE)
                .then(|| attribute[1].as_str().unwrap().to_owned())
        });
        seen.insert(
            (s(&function[0]).to_owned(), tier),
            s(&function[1]).to_owned(),
        );
    }
    let expected: BTreeMap<(String, Option<String>), String> = [
        (
            ("Calls::Main(string[])".to_owned(), None),
            "Calls::Main(string[])".to_owned(),
        ),
        (
            (SPIN.to_owned(), Some("QuickJitted".to_owned())),
            raw("QuickJitted"),
        ),
        (
            (SPIN.to_owned(), Some("OptimizedTier1OSR".to_owned())),
            raw("OptimizedTier1OSR"),
        ),
    ]
    .into_iter()
    .collect();
    assert_eq!(seen, expected);
    // Stacks still fold by name: one stack for both tiers.
    let stacks = d["profiles"][0]["stacks"].as_object().unwrap();
    assert_eq!(stacks.len(), 1, "{stacks:?}");
}

#[test]
fn chromium_slices_carry_the_tier_as_args() {
    let p = two_tiers();
    let mut out = Vec::new();
    chromium::write(&p, &mut out).unwrap();
    let json: Json = serde_json::from_slice(&out).unwrap();
    let spins: Vec<(String, String)> = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "B" && e["name"] == SPIN)
        .map(|e| {
            (
                e["args"]["tier"].as_str().unwrap().to_owned(),
                e["args"]["system_name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        spins,
        TIERS.map(|(t, _)| (t.to_owned(), raw(t))).to_vec(),
        "one slice per tier, in time order"
    );
    let main = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["ph"] == "B" && e["name"] == "Calls::Main(string[])")
        .unwrap();
    assert!(main.get("args").is_none(), "{main}");
    // Our reader still reads the file, one name for both tiers.
    let back = chromium::read(&out[..]).unwrap();
    let lines = folded::lines(&back);
    assert_eq!(lines.len(), 1, "{lines:?}");
}

#[test]
fn speedscope_frames_show_the_tier_in_their_file_field() {
    let p = two_tiers();
    let mut out = Vec::new();
    speedscope::write(&p, &mut out).unwrap();
    let json: Json = serde_json::from_slice(&out).unwrap();
    let frames: Vec<(String, Option<String>)> = json["shared"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_owned(),
                f["file"].as_str().map(str::to_owned),
            )
        })
        .collect();
    assert_eq!(
        frames,
        [
            ("Calls::Main(string[])".to_owned(), None),
            (SPIN.to_owned(), Some("[QuickJitted]".to_owned())),
            (SPIN.to_owned(), Some("[OptimizedTier1OSR]".to_owned())),
        ]
    );
    // Read back: the tier again, no file.
    let back = speedscope::read(&out[..]).unwrap();
    let mut tiers: Vec<&str> = back
        .functions()
        .iter()
        .filter_map(|f| {
            assert!(f.file.is_none());
            Some(back.string(f.tier?))
        })
        .collect();
    tiers.sort();
    assert_eq!(tiers, ["OptimizedTier1OSR", "QuickJitted"]);
}

#[test]
fn firefox_profiler_frames_are_in_a_subcategory_per_tier() {
    let p = two_tiers();
    let mut out = Vec::new();
    fxprof::write(&p, &mut out).unwrap();
    let json: Json = serde_json::from_slice(&out).unwrap();
    let categories = json["meta"]["categories"].as_array().unwrap();
    let managed = categories
        .iter()
        .position(|c| c["name"] == "Managed")
        .unwrap();
    let subcategories: Vec<&str> = categories[managed]["subcategories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(subcategories, ["Other", "QuickJitted", "OptimizedTier1OSR"]);
    // Each Spin frame is in its tier's subcategory.
    let thread = &json["threads"][0];
    let strings: Vec<&str> = thread["stringArray"]
        .as_array()
        .or_else(|| json["shared"]["stringArray"].as_array())
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let frames = &thread["frameTable"];
    let funcs = &thread["funcTable"];
    let mut seen = Vec::new();
    for i in 0..frames["length"].as_u64().unwrap() as usize {
        let func = frames["func"][i].as_u64().unwrap() as usize;
        let name = strings[funcs["name"][func].as_u64().unwrap() as usize];
        let sub = frames["subcategory"][i].as_u64().unwrap() as usize;
        seen.push((name, subcategories[sub]));
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            ("Calls::Main(string[])", "Other"),
            (SPIN, "OptimizedTier1OSR"),
            (SPIN, "QuickJitted"),
        ]
    );
}
