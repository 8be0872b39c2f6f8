//! pprof: our output read by `go tool pprof` and npm `pprof-format`; real files (written now by Go's
//! runtime/pprof and gperftools, and the third-party fixtures when present) read and checked against
//! `go tool pprof`; round trips; bad input.

mod pprof_common;
use pprof_common as common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{fixtures, have_tool, real_tools, rich_profile, run, scratch, stack_totals};
use prost::Message;
use rootline_formats::pprof::{self, proto};
use rootline_formats::{FormatError, Position};
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

/// pprof files the real writers make now: Go's CPU and heap profiles (gzipped profile.proto) and
/// a gperftools legacy CPU profile, each when its tool is installed.
fn generated_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(go) = real_tools::go_profiles() {
        out.extend([go.cpu.clone(), go.heap.clone()]);
    }
    out.extend(real_tools::gperftools_cpu_profile().map(Path::to_path_buf));
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
    assert_eq!(
        types,
        [
            "alloc_objects",
            "alloc_space",
            "inuse_objects",
            "inuse_space"
        ]
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

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn byte_error(result: Result<Profile, FormatError>) -> (u64, String) {
    match result {
        Err(FormatError::Invalid {
            position: Position::Byte(at),
            message,
        }) => (at, message),
        Err(other) => panic!("expected a positioned error, got {other}"),
        Ok(_) => panic!("expected an error"),
    }
}

/// Cuts of a gzipped profile.proto: inside the protobuf, an error before the cut (most cuts fall
/// inside a field; the few at field boundaries decode to fewer rows); inside the gzip stream, a gzip
/// error.
fn assert_cuts_of_protobuf_are_positioned(name: &str, gz: &[u8]) {
    let raw = gunzip(gz);
    let mut errors = 0;
    for cut in 1..raw.len() {
        match pprof::read(&raw[..cut]) {
            Ok(_) => {}
            Err(FormatError::Invalid {
                position: Position::Byte(at),
                ..
            }) => {
                assert!(at < cut as u64, "{name}: cut {cut}: error at {at}");
                errors += 1;
            }
            Err(other) => panic!("{name}: cut {cut}: {other}"),
        }
    }
    assert!(errors > raw.len() / 2, "{name}: {errors} errors");
    for cut in 2..gz.len() {
        let (at, message) = byte_error(pprof::read(&gz[..cut]));
        assert!(at <= cut as u64, "{name}");
        assert!(message.contains("gzip"), "{name}: {message}");
    }
}

/// Length of a legacy CPU profile's binary part: header, sample records and the trailer
/// record (count 0, depth 1, pc 0), before the maps text.
fn legacy_binary_len(bytes: &[u8]) -> usize {
    let word = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
    // Header: 0, the number of header words that follow (3), version, period, padding.
    let header_words = 2 + word(1) as usize;
    let mut i = header_words;
    loop {
        let (count, depth) = (word(i), word(i + 1) as usize);
        i += 2 + depth;
        if count == 0 && depth == 1 && word(i - 1) == 0 {
            return i * 8;
        }
    }
}

/// Cuts of a legacy CPU profile: a cut inside a word of the binary records is an error before the
/// cut; a cut in the maps text after them still reads.
fn assert_cuts_of_legacy_are_positioned(name: &str, legacy: &[u8]) {
    let binary = legacy_binary_len(legacy);
    assert!(binary < legacy.len(), "{name}: no maps text");
    let mut errors = 0;
    // Every 11th cut (the words are 8 bytes, so cuts land at every offset within a word).
    for cut in (1..legacy.len()).step_by(11) {
        match pprof::read(&legacy[..cut]) {
            Err(e) => {
                let (at, _) = byte_error(Err(e));
                assert!(at < cut as u64, "{name}: cut {cut}: error at {at}");
                errors += 1;
            }
            // A cut between two words of the records reads as the records before it.
            Ok(_) => assert!(
                cut >= binary || cut % 8 == 0,
                "{name}: cut {cut} inside a word of the {binary}-byte records read"
            ),
        }
    }
    assert!(errors >= binary / 11 * 7 / 8, "{name}: {errors} errors");
}

#[test]
fn truncated_input_gives_positioned_errors() {
    let test = "truncated_input_gives_positioned_errors";
    let mut protobufs = Vec::new();
    let mut legacies = Vec::new();
    if let Some(go) = real_tools::go_profiles() {
        protobufs.extend([go.cpu.clone(), go.heap.clone()]);
    }
    legacies.extend(real_tools::gperftools_cpu_profile().map(Path::to_path_buf));
    protobufs.extend(fixtures::third_party(
        test,
        "pprof/internal/report/testdata/sample.cpu",
    ));
    legacies.extend(fixtures::third_party(
        test,
        "pprof/profile/testdata/cppbench.cpu",
    ));
    for path in protobufs {
        let name = path.display().to_string();
        assert_cuts_of_protobuf_are_positioned(&name, &std::fs::read(&path).unwrap());
    }
    for path in legacies {
        let name = path.display().to_string();
        assert_cuts_of_legacy_are_positioned(&name, &std::fs::read(&path).unwrap());
    }
}

#[test]
fn wrong_wire_types_and_bad_keys_are_errors_at_their_offset() {
    // A valid empty-ish profile, then field 2 (sample) as a varint.
    let mut bytes = proto::Profile {
        string_table: vec![String::new()],
        ..Default::default()
    }
    .encode_to_vec();
    let at = bytes.len() as u64;
    bytes.extend_from_slice(&[0x10, 0x01]);
    let (pos, message) = byte_error(pprof::read(&bytes[..]));
    assert_eq!(pos, at);
    assert!(message.contains("field 2 (sample)"), "{message}");
    // Group wire type.
    let (pos, message) = byte_error(pprof::read(&[0x0a, 0x00, 0x13][..]));
    assert_eq!(pos, 2);
    assert!(message.contains("wire type 3"), "{message}");
    // A length running past the end.
    let (_, message) = byte_error(pprof::read(&[0x12, 0x7f, 0x00][..]));
    assert!(message.contains("cut short"), "{message}");
    // string_table[0] must be empty.
    let bad = proto::Profile {
        string_table: vec!["x".into()],
        ..Default::default()
    };
    let (_, message) = byte_error(pprof::read(&bad.encode_to_vec()[..]));
    assert!(message.contains("string_table[0]"), "{message}");
}

fn small_profile() -> proto::Profile {
    proto::Profile {
        sample_type: vec![proto::ValueType { r#type: 1, unit: 2 }],
        sample: vec![proto::Sample {
            location_id: vec![1],
            value: vec![5],
            label: vec![],
        }],
        location: vec![proto::Location {
            id: 1,
            line: vec![proto::Line {
                function_id: 1,
                line: 3,
                column: 0,
            }],
            ..Default::default()
        }],
        function: vec![proto::Function {
            id: 1,
            name: 3,
            ..Default::default()
        }],
        string_table: vec!["".into(), "samples".into(), "count".into(), "f".into()],
        ..Default::default()
    }
}

#[test]
fn thread_and_time_labels_pick_the_thread_and_time() {
    let mut m = small_profile();
    let base = m.string_table.len() as i64;
    m.string_table.extend(
        [
            "thread_id",
            "42",
            "thread_name",
            "main-loop",
            "pid",
            "timestamp_ns",
            "span",
            "nanoseconds",
        ]
        .map(String::from),
    );
    let label = |key: i64, str: i64, num: i64, num_unit: i64| proto::Label {
        key: base + key,
        str: if str < 0 { 0 } else { base + str },
        num,
        num_unit: if num_unit < 0 { 0 } else { base + num_unit },
    };
    m.sample[0].label = vec![
        label(0, 1, 0, -1),       // thread_id="42" (string, as Go's pprof labels are)
        label(2, 3, 0, -1),       // thread_name="main-loop"
        label(4, -1, 7, -1),      // pid=7 (numeric)
        label(5, -1, 123_456, 7), // timestamp_ns=123456 nanoseconds
        label(6, 1, 0, -1),       // span="42": no place in the model
    ];
    m.time_nanos = 100;
    let mut untimed = m.sample[0].clone();
    untimed.label.clear();
    m.sample.push(untimed);
    let p = pprof::read(&m.encode_to_vec()[..]).unwrap();
    let samples = p.samples();
    let t = p.thread(samples.threads[0]);
    assert_eq!((t.pid, t.tid), (7, 42));
    assert_eq!(p.thread_name(samples.threads[0]), Some("main-loop"));
    assert_eq!(
        samples.times,
        [123_456, 100],
        "an unlabelled sample takes the profile's start"
    );
    let t = p.thread(samples.threads[1]);
    assert_eq!((t.pid, t.tid), (0, 0));
    assert_eq!(p.metadata.extra["pprof.dropped_label_keys"], "span");
}

/// An edit that breaks a valid message.
type Change = Box<dyn Fn(&mut proto::Profile)>;

#[test]
fn out_of_range_ids_and_indexes_are_errors_naming_the_row() {
    let good = small_profile();
    assert_eq!(
        pprof::read(&good.encode_to_vec()[..]).unwrap().totals(),
        [5]
    );
    let sample_offset = {
        let mut m = good.clone();
        m.sample.clear();
        // sample_type comes first in field order, then the sample.
        proto::Profile {
            sample_type: m.sample_type,
            ..Default::default()
        }
        .encode_to_vec()
        .len() as u64
    };
    let cases: Vec<(Change, &str)> = vec![
        (
            Box::new(|m| m.sample[0].location_id = vec![99]),
            "location 99",
        ),
        (
            Box::new(|m| m.location[0].line[0].function_id = 7),
            "function 7",
        ),
        (Box::new(|m| m.location[0].mapping_id = 4), "mapping 4"),
        (Box::new(|m| m.function[0].name = 40), "string 40"),
        (Box::new(|m| m.sample_type[0].unit = -1), "string -1"),
        (Box::new(|m| m.sample[0].value = vec![1, 2]), "2 values"),
        (Box::new(|m| m.location[0].id = 0), "id 0"),
        (
            Box::new(|m| {
                m.period_type = Some(proto::ValueType {
                    r#type: 50,
                    unit: 0,
                })
            }),
            "the period type refers to string 50",
        ),
        (
            Box::new(|m| m.comment = vec![9]),
            "a comment refers to string 9",
        ),
        (
            Box::new(|m| m.function.push(m.function[0])),
            "function id 1 appears twice",
        ),
        (
            Box::new(|m| {
                m.sample[0].label = vec![proto::Label {
                    key: 77,
                    ..Default::default()
                }]
            }),
            "string 77",
        ),
    ];
    for (i, (change, expected)) in cases.iter().enumerate() {
        let mut m = good.clone();
        change(&mut m);
        let (at, message) = byte_error(pprof::read(&m.encode_to_vec()[..]));
        assert!(message.contains(expected), "case {i}: {message}");
        if expected.starts_with("location 99") || expected.contains("values") {
            assert_eq!(at, sample_offset, "case {i}");
        }
        if expected.contains("period type") {
            // period_type (field 11) is written after every field before it.
            let mut before = m.clone();
            before.period_type = None;
            before.period = 0;
            before.comment.clear();
            before.default_sample_type = 0;
            before.doc_url = 0;
            assert_eq!(at, before.encode_to_vec().len() as u64, "case {i}");
        }
    }
}

#[test]
fn gzip_bomb_is_refused_with_a_clear_error() {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..16 {
        encoder.write_all(&zeros).unwrap();
    }
    let bomb = encoder.finish().unwrap();
    assert!(bomb.len() < 64 << 10, "{} bytes", bomb.len());
    let (_, message) = byte_error(pprof::read_with_limit(&bomb[..], 4 << 20));
    assert!(message.contains("gzip bomb"), "{message}");
    // Raw input over the limit too.
    let (at, message) = byte_error(pprof::read_with_limit(&zeros[..], 1000));
    assert_eq!(at, 1000);
    assert!(message.contains("limit"), "{message}");
}

#[test]
fn empty_and_foreign_input_are_errors() {
    assert!(matches!(
        pprof::read(&b""[..]),
        Err(FormatError::Invalid {
            position: Position::Input,
            ..
        })
    ));
    byte_error(pprof::read(&b"a;b;c 1\n"[..]));
    byte_error(pprof::read(&b"{\"traceEvents\": []}"[..]));
}

/// A small deterministic xorshift generator for the mutation test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Bounded mutation test: thousands of damaged variants of real and synthetic profiles must give a
/// profile or a positioned error, never a panic. (`fuzz/` holds the unbounded libFuzzer target.)
#[test]
fn mutated_inputs_never_panic() {
    let mut seeds = vec![
        pprof::to_message(&rich_profile()).encode_to_vec(),
        small_profile().encode_to_vec(),
    ];
    // Real files: the ones written now, and the fixtures when present.
    for path in generated_files() {
        let bytes = std::fs::read(&path).unwrap();
        seeds.push(if bytes.starts_with(&[0x1f, 0x8b]) {
            gunzip(&bytes)
        } else {
            bytes
        });
    }
    let test = "mutated_inputs_never_panic (fixtures)";
    for (path, gzipped) in [
        ("pprof/internal/report/testdata/sample.cpu", true),
        ("speedscope/sample/profiles/pprof/simple.prof", true),
        ("pprof/profile/testdata/go.crc32.cpu", false),
    ] {
        if let Some(path) = fixtures::third_party(test, path) {
            let bytes = std::fs::read(path).unwrap();
            seeds.push(if gzipped { gunzip(&bytes) } else { bytes });
        }
    }
    let mut gz = Vec::new();
    pprof::write(&rich_profile(), &mut gz).unwrap();
    seeds.push(gz);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut ok, mut err) = (0, 0);
    for round in 0..4000 {
        let mut bytes = seeds[round % seeds.len()].clone();
        for _ in 0..=rng.below(4) {
            let at = rng.below(bytes.len());
            match rng.below(6) {
                0 => bytes[at] ^= 1 << rng.below(8),
                1 => bytes[at] = rng.next() as u8,
                2 => {
                    bytes.insert(at, rng.next() as u8);
                }
                3 if bytes.len() > 1 => {
                    bytes.remove(at);
                }
                4 => bytes.truncate(at.max(1)),
                _ => {
                    // Duplicate a slice: repeated fields and stale ids.
                    let end = (at + rng.below(64)).min(bytes.len());
                    let copy = bytes[at..end].to_vec();
                    let to = rng.below(bytes.len());
                    bytes.splice(to..to, copy);
                }
            }
        }
        match pprof::read_with_limit(&bytes[..], 16 << 20) {
            Ok(_) => ok += 1,
            Err(FormatError::Invalid { .. }) => err += 1,
            Err(other) => panic!("round {round}: unexpected error kind {other}"),
        }
    }
    eprintln!("mutants: {ok} read, {err} rejected");
    assert!(err > 1000 && ok > 10, "{ok} read, {err} rejected");
}
