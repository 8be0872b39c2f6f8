//! Helpers shared by the pprof and OTLP integration tests: fixtures and generated inputs, external
//! tools, stack maps.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use rootline_profile::{Frame, FrameKind, Function, Mapping, Profile, SampleType};

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[path = "../../../../tests/support/fixtures.rs"]
pub mod fixtures;
#[path = "../../../../tests/support/real_tools.rs"]
pub mod real_tools;

/// A scratch directory for this test binary's outputs.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Checks that `program` runs (`args` e.g. `["version"]`). In CI a missing tool fails the test; else
/// the caller skips with the printed reason.
pub fn have_tool(program: &str, args: &[&str], install_hint: &str) -> bool {
    let ok = Command::new(program)
        .args(args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        let message =
            format!("`{program}` is not available ({install_hint}; scripts/test.sh does it)");
        if std::env::var_os("CI").is_some() {
            panic!("{message}");
        }
        eprintln!("skipping: {message}");
    }
    ok
}

/// Runs a command and returns its stdout, failing the test with its stderr when it fails.
pub fn run(command: &mut Command) -> String {
    let out = command.output().expect("the command starts");
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// Total of the first value column per stack (names root first, joined by `;`).
pub fn stack_totals(profile: &Profile) -> BTreeMap<String, i64> {
    let samples = profile.samples();
    let mut out = BTreeMap::new();
    let mut frames = Vec::new();
    for (i, &stack) in samples.stacks.iter().enumerate() {
        profile.stack_frames_root_first(stack, &mut frames);
        let key = frames
            .iter()
            .map(|&f| profile.frame_name(f))
            .collect::<Vec<_>>()
            .join(";");
        let value = samples.values.first().map_or(1, |c| c[i]);
        *out.entry(key).or_insert(0) += value;
    }
    out
}

/// A profile with what the writers must handle: two threads in two processes with names, inlined
/// frames at one address, name-only frames, a kernel frame, a truncation marker, a mapping with a
/// build id, and two value columns.
pub fn rich_profile() -> Profile {
    let mut p = Profile::new(vec![SampleType::samples(), SampleType::cpu_nanoseconds()]);
    p.metadata.producer = "test".into();
    p.metadata.start_time_ns = 1_700_000_000_000_000_000;
    p.metadata.end_time_ns = 1_700_000_001_000_000_000;
    p.metadata.sample_rate_hz = Some(999);
    p.set_process_name(10, "server");
    let path = p.intern_string("/usr/bin/server");
    let build_id = p.intern_string("0123456789abcdef");
    let mapping = p.intern_mapping(Mapping {
        start: 0x400000,
        end: 0x500000,
        file_offset: 0,
        path,
        build_id: Some(build_id),
    });
    let file = p.intern_string("server.c");
    let native = |p: &mut Profile, name: &str, address: u64, line: u32, depth: u8| {
        let name = p.intern_string(name);
        let function = p.intern_function(Function::new(name, Some(file)));
        p.intern_frame(Frame {
            function,
            mapping: Some(mapping),
            address,
            line: Some(line),
            inline_depth: depth,
            kind: FrameKind::Native,
            from_live_memory: false,
        })
    };
    let start = p.intern_named_frame("_start", FrameKind::Native);
    let main = native(&mut p, "main", 0x401000, 10, 0);
    let work = native(&mut p, "work", 0x402000, 20, 0);
    let inl1 = native(&mut p, "inlined_outer", 0x402000, 30, 1);
    let inl2 = native(&mut p, "inlined_inner", 0x402000, 40, 2);
    let leaf = native(&mut p, "leaf", 0x403000, 50, 0);
    let syscall = p.intern_named_frame("sys_write", FrameKind::Kernel);
    let truncated = p.intern_named_frame("[truncated: stack copy too small]", FrameKind::Truncated);
    let t1 = p.intern_thread(10, 11);
    p.set_thread_name(t1, "worker-1");
    let t2 = p.intern_thread(20, 21);
    let s1 = p
        .intern_stack_root_first([start, main, work, inl1, inl2])
        .unwrap();
    let s2 = p
        .intern_stack_root_first([start, main, leaf, syscall])
        .unwrap();
    let s3 = p.intern_stack_root_first([truncated, leaf]).unwrap();
    let s4 = p.intern_stack_root_first([start, main]).unwrap();
    let t0 = p.metadata.start_time_ns;
    for (n, (thread, stack)) in [
        (t1, s1),
        (t1, s2),
        (t2, s1),
        (t1, s1),
        (t2, s3),
        (t2, s4),
        (t1, s3),
    ]
    .into_iter()
    .enumerate()
    {
        let n = n as u64;
        p.push_sample(
            t0 + n * 1_001_001,
            thread,
            stack,
            &[1 + n as i64, 1_001_001 * (1 + n as i64)],
        )
        .unwrap();
    }
    p
}

/// pprof files the real writers make now: Go's CPU and heap profiles (gzipped profile.proto) and
/// a gperftools legacy CPU profile, each when its tool is installed.
pub fn generated_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(go) = real_tools::go_profiles() {
        out.extend([go.cpu.clone(), go.heap.clone()]);
    }
    out.extend(real_tools::gperftools_cpu_profile().map(Path::to_path_buf));
    out
}

/// The bytes of gzip data.
pub fn gunzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .unwrap();
    out
}
