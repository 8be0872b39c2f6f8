//! pprof input that is damaged, hostile or foreign: positioned errors for every cut, wrong wire
//! types, out-of-range ids, gzip bombs; labels picking the thread and time; and mutated real files
//! never panic.

mod pprof_common;
use pprof_common as common;

use std::path::Path;

use common::{fixtures, generated_files, gunzip, real_tools, rich_profile};
use prost::Message;
use rootline_formats::pprof::{self, proto};
use rootline_formats::{FormatError, Position};
use rootline_profile::Profile;

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
