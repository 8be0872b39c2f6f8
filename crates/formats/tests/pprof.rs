//! pprof: our output read by `go tool pprof` and npm `pprof-format`; real files (written now by Go's
//! runtime/pprof and gperftools, and the third-party fixtures when present) read and checked against
//! `go tool pprof`; round trips; bad input.

mod pprof_common;
use pprof_common as common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{
    fixtures, generated_files, gunzip, have_tool, real_tools, rich_profile, run, scratch,
    stack_totals,
};
use rootline_formats::FormatError;
use rootline_formats::pprof::{self, proto};
use rootline_profile::{FrameKind, Profile};

/// What a third-party reader reports: value totals per column and first-column totals per stack.
#[derive(Debug, PartialEq)]
struct Summary {
    totals: Vec<i64>,
    stacks: BTreeMap<String, i64>,
}

/// Our [`Summary`] of `profile`. Stacks whose every sample has only zero values are left out, as
/// pprof leaves out samples with all values zero when it reads a file.
fn summary_of(profile: &Profile) -> Summary {
    let samples = profile.samples();
    let mut stacks = BTreeMap::new();
    let mut frames = Vec::new();
    for i in 0..samples.len() {
        if samples.values.iter().all(|column| column[i] == 0) {
            continue;
        }
        profile.stack_frames_root_first(samples.stacks[i], &mut frames);
        let key = frames
            .iter()
            .map(|&f| profile.frame_name(f))
            .collect::<Vec<_>>()
            .join(";");
        let value = samples.values.first().map_or(1, |c| c[i]);
        *stacks.entry(key).or_insert(0) += value;
    }
    Summary {
        totals: profile.totals(),
        stacks,
    }
}

/// Parses `go tool pprof -raw` output into a [`Summary`].
fn parse_go_raw(text: &str) -> Summary {
    let mut columns = 0;
    let mut samples: Vec<(Vec<i64>, Vec<u64>)> = Vec::new();
    let mut locations: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut section = "";
    let mut current = 0u64;
    for line in text.lines() {
        match line.trim_end() {
            "Samples:" => {
                section = "samples";
                continue;
            }
            "Locations" => {
                section = "locations";
                continue;
            }
            "Mappings" => {
                section = "mappings";
                continue;
            }
            _ => {}
        }
        if section == "samples" {
            if columns == 0 {
                columns = line.split_whitespace().count();
                continue;
            }
            let Some((values, ids)) = line.split_once(':') else {
                continue;
            };
            let values: Option<Vec<i64>> =
                values.split_whitespace().map(|v| v.parse().ok()).collect();
            let Some(values) = values.filter(|v| v.len() == columns) else {
                continue; // a label line
            };
            let ids = ids
                .split_whitespace()
                .map(|id| id.parse().expect("location id"))
                .collect();
            samples.push((values, ids));
        } else if section == "locations" {
            let trimmed = line.trim_start();
            let function = |entry: &str| -> String {
                let entry = entry.trim_end();
                let entry = entry.rsplit_once(" s=").map_or(entry, |(e, _)| e);
                entry
                    .rsplit_once(' ')
                    .map_or(entry, |(name, _)| name)
                    .to_owned()
            };
            if let Some((id, rest)) = trimmed
                .split_once(": 0x")
                .filter(|(id, _)| id.bytes().all(|b| b.is_ascii_digit()))
            {
                current = id.parse().unwrap();
                let (address, mut entry) = rest.split_once(' ').unwrap_or((rest, ""));
                if entry.starts_with("M=") {
                    entry = entry.split_once(' ').map_or("", |(_, e)| e);
                }
                let entry = entry.trim();
                let names = locations.entry(current).or_default();
                if entry.is_empty() {
                    names.push(format!("0x{address}"));
                } else {
                    names.push(function(entry));
                }
            } else if !trimmed.is_empty() {
                locations.get_mut(&current).unwrap().push(function(trimmed));
            }
        }
    }
    let mut totals = vec![0i64; columns];
    let mut stacks = BTreeMap::new();
    for (values, ids) in samples {
        for (t, v) in totals.iter_mut().zip(&values) {
            *t += v;
        }
        let mut names: Vec<&str> = ids
            .iter()
            .flat_map(|id| locations[id].iter().map(String::as_str))
            .collect();
        names.reverse();
        *stacks.entry(names.join(";")).or_insert(0) += values.first().copied().unwrap_or(1);
    }
    Summary { totals, stacks }
}

fn go_pprof_raw(path: &Path) -> Summary {
    let empty = scratch("no-binaries");
    let text = run(Command::new("go")
        .args(["tool", "pprof", "-raw", "-symbolize=none"])
        .arg(path)
        .env("PPROF_BINARY_PATH", empty));
    parse_go_raw(&text)
}

fn pprof_format_decode(path: &Path) -> Summary {
    let dir = common::workspace().join("tests/js-pprof");
    let json = run(Command::new("node")
        .arg(dir.join("decode.mjs"))
        .arg(path)
        .current_dir(&dir));
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    let number = |v: &serde_json::Value| v.as_str().unwrap().parse::<i64>().unwrap();
    Summary {
        totals: value["totals"]
            .as_array()
            .unwrap()
            .iter()
            .map(number)
            .collect(),
        stacks: value["stacks"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), number(v)))
            .collect(),
    }
}

/// The real pprof files among the fixtures: every file under `pprof/` except texts and licences,
/// plus the sample profiles other viewers ship. Empty (after a printed reason) when the fixtures are
/// absent.
fn fixture_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                let name = path.file_name().unwrap().to_str().unwrap();
                if !(name.ends_with(".string") || name.ends_with(".md") || name == "LICENSE") {
                    out.push(path);
                }
            }
        }
    }
    let (Some(pprof), Some(speedscope)) = (
        fixtures::third_party("the pprof fixtures", "pprof"),
        fixtures::third_party("the pprof fixtures", "speedscope/sample/profiles/pprof"),
    ) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    walk(&pprof, &mut out);
    walk(&speedscope, &mut out);
    out.sort();
    assert!(out.len() >= 7, "fixtures missing under {}", pprof.display());
    out
}

fn read_file(path: &Path) -> Result<Profile, FormatError> {
    pprof::read(&std::fs::read(path).unwrap()[..])
}

fn write_to(profile: &Profile, name: &str) -> PathBuf {
    let path = scratch("pprof-out").join(name);
    let mut bytes = Vec::new();
    pprof::write(profile, &mut bytes).unwrap();
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Profiles to write: the rich synthetic one, the generated files and every fixture we read.
fn profiles_to_write() -> Vec<(String, Profile)> {
    let mut out = vec![("rich".to_owned(), rich_profile())];
    for path in generated_files().into_iter().chain(fixture_files()) {
        if let Ok(p) = read_file(&path) {
            out.push((path.file_name().unwrap().to_string_lossy().into_owned(), p));
        }
    }
    out
}

#[test]
fn go_tool_pprof_reads_our_output_with_equal_totals_and_stacks() {
    if !have_tool("go", &["version"], "apt-get install golang-go") {
        return;
    }
    for (name, profile) in profiles_to_write() {
        let path = write_to(&profile, &format!("{name}.pb.gz"));
        let theirs = go_pprof_raw(&path);
        assert_eq!(theirs, summary_of(&profile), "{name}");
        assert!(!theirs.stacks.is_empty(), "{name}");
    }
}

#[test]
fn pprof_format_reads_our_output_with_equal_totals_and_stacks() {
    if !have_tool("node", &["--version"], "apt-get install nodejs")
        || !have_tool(
            "node",
            &[
                "-e",
                "require(process.argv[1] + '/tests/js-pprof/node_modules/pprof-format')",
                common::workspace().to_str().unwrap(),
            ],
            "npm ci in tests/js-pprof",
        )
    {
        return;
    }
    for (name, profile) in profiles_to_write() {
        let path = write_to(&profile, &format!("{name}.pprof"));
        assert_eq!(pprof_format_decode(&path), summary_of(&profile), "{name}");
    }
}

/// Every pprof fixture is read; where google/pprof ships its expected text (`FILE.string`, the
/// legacy CPU profiles), totals and stacks match it; and all agree with `go tool pprof -raw`.
#[test]
fn fixtures_are_read_and_agree_with_expected_output_and_go_tool_pprof() {
    let files = fixture_files();
    if files.is_empty() {
        return;
    }
    let go = have_tool("go", &["version"], "apt-get install golang-go");
    let mut expected_checked = 0;
    for path in files {
        let profile = read_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!profile.samples().is_empty(), "{}", path.display());
        let ours = summary_of(&profile);
        let expected = path.with_file_name(format!(
            "{}.string",
            path.file_name().unwrap().to_str().unwrap()
        ));
        if expected.exists() {
            let text = std::fs::read_to_string(&expected).unwrap();
            assert_eq!(ours, parse_go_raw(&text), "{}", path.display());
            expected_checked += 1;
        }
        if go {
            assert_eq!(ours, go_pprof_raw(&path), "{}", path.display());
        }
    }
    assert_eq!(expected_checked, 3);
}

/// What Go's runtime/pprof and gperftools write now is read, and agrees with `go tool pprof -raw`.
#[test]
fn go_and_gperftools_profiles_are_read_and_agree_with_go_tool_pprof() {
    let files = generated_files();
    if files.is_empty() || !have_tool("go", &["version"], "apt-get install golang-go") {
        return;
    }
    for path in &files {
        let profile = read_file(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!profile.samples().is_empty(), "{}", path.display());
        assert_eq!(
            summary_of(&profile),
            go_pprof_raw(path),
            "{}",
            path.display()
        );
    }
    // The Go profiles name the workload's functions, innermost last.
    let go = real_tools::go_profiles().unwrap();
    let cpu = stack_totals(&read_file(&go.cpu).unwrap());
    assert!(
        cpu.keys()
            .any(|s| s.ends_with("main.main;main.outer;main.middle;main.leaf")),
        "{cpu:?}"
    );
    let heap = read_file(&go.heap).unwrap();
    let types: Vec<&str> = heap
        .sample_types()
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    // Go's allocation types read as rootline's own (and are written back under Go's names).
    assert_eq!(
        types,
        ["alloc-count", "alloc-bytes", "inuse_objects", "inuse_space"]
    );
    // 100 live 4 KiB buffers from main.allocate, every allocation sampled (MemProfileRate = 1).
    let allocate: i64 = common::stack_totals(&heap)
        .iter()
        .filter(|(s, _)| s.ends_with("main.main;main.allocate"))
        .map(|(_, v)| v)
        .sum();
    assert!(allocate >= 100, "{allocate} allocations in main.allocate");
}

/// Every sample's thread and frames (leaf first) with its values, for exact comparisons.
fn detailed(profile: &Profile) -> BTreeMap<String, Vec<i64>> {
    let samples = profile.samples();
    let mut out: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for i in 0..samples.len() {
        let thread = profile.thread(samples.threads[i]);
        let mut key = format!(
            "{}/{}/{}:",
            thread.pid,
            thread.tid,
            profile.thread_name(samples.threads[i]).unwrap_or("")
        );
        for f in profile.stack_frames(samples.stacks[i]) {
            let frame = profile.frame(f);
            let function = profile.function(frame.function);
            let mapping = frame.mapping.map(|m| {
                let m = profile.mapping(m);
                (
                    m.start,
                    m.end,
                    profile.string(m.path).to_owned(),
                    m.build_id.map(|b| profile.string(b).to_owned()),
                )
            });
            let kind = match frame.kind {
                // pprof has no frame kinds; name-only kernel frames read back as native.
                FrameKind::Kernel if frame.mapping.is_none() => FrameKind::Native,
                kind => kind,
            };
            key += &format!(
                " [{} {:?} {:#x} {:?} d{} {:?} {:?}]",
                profile.string(function.name),
                function.file.map(|f| profile.string(f)),
                frame.address,
                frame.line,
                frame.inline_depth,
                mapping,
                kind
            );
        }
        let values = out
            .entry(key)
            .or_insert_with(|| vec![0; samples.values.len()]);
        for (v, column) in values.iter_mut().zip(&samples.values) {
            *v += column[i];
        }
    }
    out
}

#[test]
fn round_trip_keeps_frames_threads_and_totals() {
    for (name, profile) in profiles_to_write() {
        let mut bytes = Vec::new();
        pprof::write(&profile, &mut bytes).unwrap();
        let back = pprof::read(&bytes[..]).unwrap();
        assert_eq!(back.sample_types(), profile.sample_types(), "{name}");
        assert_eq!(back.totals(), profile.totals(), "{name}");
        assert_eq!(stack_totals(&back), stack_totals(&profile), "{name}");
        assert_eq!(detailed(&back), detailed(&profile), "{name}");
        assert_eq!(back.metadata.start_time_ns, profile.metadata.start_time_ns);
        assert_eq!(back.metadata.end_time_ns, profile.metadata.end_time_ns);
        // A second trip gives the same bytes: the writer is deterministic.
        let mut again = Vec::new();
        pprof::write(&back, &mut again).unwrap();
        let (a, b) = (
            pprof::decode_message(&gunzip(&bytes)).unwrap(),
            pprof::decode_message(&gunzip(&again)).unwrap(),
        );
        assert_eq!(a.sample.len(), b.sample.len(), "{name}");
        assert_eq!(a.location.len(), b.location.len(), "{name}");
    }
}

#[test]
fn inlined_frames_share_one_location_innermost_first() {
    let profile = rich_profile();
    let message = pprof::to_message(&profile);
    let s = |i: i64| message.string_table[i as usize].as_str();
    let function_name = |id: u64| s(message.function[id as usize - 1].name);
    let inlined: Vec<&proto::Location> = message
        .location
        .iter()
        .filter(|l| l.line.len() > 1)
        .collect();
    assert_eq!(inlined.len(), 1);
    let names: Vec<&str> = inlined[0]
        .line
        .iter()
        .map(|l| function_name(l.function_id))
        .collect();
    assert_eq!(names, ["inlined_inner", "inlined_outer", "work"]);
    assert_eq!(inlined[0].address, 0x402000);
    // Name-only frames have locations of their own, and every location is distinct.
    let mut keys: Vec<_> = message
        .location
        .iter()
        .map(|l| (l.mapping_id, l.address, l.line.clone()))
        .collect();
    let n = keys.len();
    keys.sort_by_key(|k| format!("{k:?}"));
    keys.dedup();
    assert_eq!(keys.len(), n);
    // Samples are summed per (thread, stack): 7 events on 6 distinct (thread, stack) pairs.
    assert_eq!(message.sample.len(), 6);
    let labels: Vec<(&str, i64, &str)> = message.sample[0]
        .label
        .iter()
        .map(|l| (s(l.key), l.num, s(l.str)))
        .collect();
    assert_eq!(
        labels,
        [
            ("thread_id", 11, ""),
            ("pid", 10, ""),
            ("thread_name", 0, "worker-1")
        ]
    );
    assert_eq!(s(message.period_type.unwrap().r#type), "cpu");
    assert_eq!(message.period, 1_000_000_000 / 999);
}
