//! `rootline record --alloc` on .NET targets, on every installed runtime (CoreCLR 3.1 and .NET
//! 8), against the ground truth of tests/data/Alloc.cs: three quarters of its bytes are
//! `byte[4096]` allocated in `Big`, a quarter `int[1024]` (the same size) in `Small`. Recorded with
//! `-p` on a running process and as a launched command, the GC allocation ticks must give each
//! method and type its share of the bytes within 10 points, on stacks that run from `Main`, as
//! samples of the threads perf samples (same thread ids), beside perf's own CPU samples. A `-p`
//! .NET process gets the ticks only; a launched command also the native sampler, whose
//! `[alloc: malloc]` samples of the runtime's own allocations come beside the ticks.
#![cfg(target_os = "linux")]

#[path = "../../dotnet/tests/common/live.rs"]
mod live;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use live::{Runtime, for_each_runtime};
use rootline_profile::{FrameKind, Profile, SampleType, pseudo};

const SOURCE: &str = include_str!("../../dotnet/tests/data/Alloc.cs");

const BIG: &str = "Alloc!Alloc.Big(int32)";
const SMALL: &str = "Alloc!Alloc.Small(int32)";
const MAIN: &str = "Alloc!Alloc.Main(class System.String[])";

fn rootline(args: &[&str], extra: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args(args)
        .args(extra)
        .output()
        .expect("run rootline")
}

fn read(path: &Path) -> Profile {
    let read =
        rootline_profile::read_rlp(std::io::BufReader::new(std::fs::File::open(path).unwrap()))
            .unwrap();
    assert!(read.tail.is_none(), "{:?}", read.tail);
    read.profile
}

/// What the allocation samples of a recording say.
struct Ticks {
    /// Bytes per (caller of the allocation frame, type).
    sites: BTreeMap<(String, String), i64>,
    total: i64,
    ticks: i64,
    /// Thread ids of the allocation samples, and of the CPU samples.
    alloc_tids: Vec<u32>,
    cpu_tids: Vec<u32>,
    /// Allocation samples of `Big` whose stack runs from `Main`.
    whole_big: usize,
    /// Native allocation samples (`[alloc: malloc]` and the like).
    native: usize,
}

fn ticks(profile: &Profile) -> Ticks {
    let types = profile.sample_types();
    let column = |t: &SampleType| types.iter().position(|s| s == t).unwrap();
    let (bytes, count) = (
        column(&SampleType::alloc_bytes()),
        column(&SampleType::alloc_count()),
    );
    let (samples_col, cpu) = (
        column(&SampleType::samples()),
        column(&SampleType::cpu_nanoseconds()),
    );
    let samples = profile.samples();
    let mut t = Ticks {
        sites: BTreeMap::new(),
        total: 0,
        ticks: 0,
        alloc_tids: Vec::new(),
        cpu_tids: Vec::new(),
        whole_big: 0,
        native: 0,
    };
    for i in 0..samples.len() {
        let stack = samples.stacks[i];
        let leaf = profile.stack(stack).frame;
        let tid = profile.thread(samples.threads[i]).tid;
        let Some(ty) = pseudo::alloc_type_of(profile.frame_name(leaf)) else {
            // A perf sample: CPU columns only.
            assert_eq!(samples.values[bytes][i], 0);
            assert_eq!(samples.values[count][i], 0);
            assert!(samples.values[samples_col][i] >= 1);
            assert!(samples.values[cpu][i] > 0);
            t.cpu_tids.push(tid);
            continue;
        };
        assert_eq!(profile.frame(leaf).kind, FrameKind::Pseudo);
        assert_eq!(samples.values[samples_col][i], 0);
        if pseudo::NATIVE_ALLOC_FUNCTIONS.contains(&ty) {
            assert!(samples.values[bytes][i] > 0 && samples.values[count][i] > 0);
            t.native += 1;
            continue;
        }
        assert_eq!(samples.values[count][i], 1, "one tick per sample");
        assert_eq!(samples.values[samples_col][i], 0);
        assert_eq!(samples.values[cpu][i], 0);
        let b = samples.values[bytes][i];
        assert!(b > 0);
        let names: Vec<&str> = profile
            .stack_frames(stack)
            .map(|f| profile.frame_name(f))
            .collect();
        let caller = names.get(1).copied().unwrap_or("(none)");
        if caller == BIG && names.last() == Some(&MAIN) {
            t.whole_big += 1;
        }
        *t.sites
            .entry((caller.to_string(), ty.to_string()))
            .or_default() += b;
        t.total += b;
        t.ticks += 1;
        t.alloc_tids.push(tid);
    }
    t
}

/// Checks the shares of the bytes and that the ticks are samples of perf's threads.
fn check(runtime: &Runtime, how: &str, profile: &Profile) {
    let t = ticks(profile);
    for ((caller, ty), bytes) in &t.sites {
        eprintln!(
            "{runtime} {how}: {:6.2}% {bytes:>12} {caller} [{ty}]",
            100.0 * *bytes as f64 / t.total as f64
        );
    }
    eprintln!(
        "{runtime} {how}: {} ticks, {} bytes, {} CPU samples",
        t.ticks,
        t.total,
        t.cpu_tids.len()
    );
    assert!(t.ticks > 500, "{runtime} {how}: {} ticks", t.ticks);
    // The native sampler runs on a launched command only: a .NET process given with -p is
    // left to its ticks.
    if how == "launched" {
        assert!(
            t.native > 0,
            "{runtime}: no native allocation of the runtime sampled"
        );
    } else {
        assert_eq!(
            t.native, 0,
            "{runtime} {how}: native samples of a .NET process"
        );
    }
    assert!(t.cpu_tids.len() > 50, "perf's CPU samples are kept");
    let share = |caller: &str, ty: &str| {
        t.sites
            .get(&(caller.to_string(), ty.to_string()))
            .copied()
            .unwrap_or(0) as f64
            / t.total as f64
    };
    let big = share(BIG, "System.Byte[]");
    let small = share(SMALL, "System.Int32[]");
    assert!((big - 0.75).abs() <= 0.10, "{how}: Big has {big:.4}");
    assert!((small - 0.25).abs() <= 0.10, "{how}: Small has {small:.4}");
    assert!(big + small > 0.95, "{how}: {:?}", t.sites);
    assert!(
        t.whole_big > 100,
        "{how}: {} Big stacks from Main",
        t.whole_big
    );
    // The allocating thread is the thread perf sampled burning the CPU in Big and Small: the
    // program allocates on its main thread only.
    let mut main_cpu = t.cpu_tids.clone();
    main_cpu.sort_unstable();
    let busiest = main_cpu
        .chunk_by(|a, b| a == b)
        .max_by_key(|c| c.len())
        .map(|c| c[0])
        .unwrap();
    let on_busiest = t.alloc_tids.iter().filter(|&&tid| tid == busiest).count();
    assert!(
        on_busiest as f64 >= 0.99 * t.alloc_tids.len() as f64,
        "{how}: {on_busiest} of {} ticks on thread {busiest}, perf's busiest",
        t.alloc_tids.len()
    );
}

#[test]
fn record_alloc_attributes_dotnet_bytes_to_methods_and_types() {
    for_each_runtime(
        "record_alloc_attributes_dotnet_bytes_to_methods_and_types",
        |runtime| {
            by_pid(runtime);
            launched(runtime);
        },
    );
}

fn by_pid(runtime: &Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let exe = runtime.build_program(SOURCE, "Alloc", dir.path());
    let mut target = runtime.start(&exe, 0, 0);
    let out = dir.path().join("alloc.rlp");
    let pid = target.pid().to_string();
    let run = rootline(
        &["record", "--alloc", "-p", &pid, "--duration", "3", "-o"],
        &[&out],
    );
    let said = String::from_utf8_lossy(&run.stderr);
    eprintln!("{said}");
    assert!(run.status.success(), "{run:?}");
    assert!(said.contains("GC allocation ticks"), "{said}");
    target.assert_still_answers();
    drop(target);
    let profile = read(&out);
    check(runtime, "-p", &profile);

    // report and convert pick the allocation column by name.
    let report = rootline(&["report", "--value", "alloc-bytes", "--top", "5"], &[&out]);
    assert!(report.status.success(), "{report:?}");
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(text.contains("[alloc: System.Byte[]]"), "{text}");
    otlp_types(&out, dir.path());
}

/// The OTLP export, decoded by PyPI `opentelemetry-proto`: the `alloc_space` profile's samples
/// carry their type as the `rootline.allocated_type` attribute, with the ground truth's shares.
fn otlp_types(rlp: &Path, dir: &Path) {
    let python = Command::new("python3")
        .args([
            "-c",
            "import opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2",
        ])
        .output();
    if !python.is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var_os("CI").is_none(),
            "pip install opentelemetry-proto==1.45.2"
        );
        eprintln!("skipping the OTLP check: pip install opentelemetry-proto==1.45.2");
        return;
    }
    let otlp = dir.join("alloc.otlp.pb");
    let conv = rootline(&["convert", "-o"], &[&otlp, rlp]);
    assert!(conv.status.success(), "{conv:?}");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../formats/tests/otlp_decode.py");
    let decoded = Command::new("python3")
        .arg(script)
        .arg(&otlp)
        .output()
        .unwrap();
    assert!(decoded.status.success(), "{decoded:?}");
    let d: serde_json::Value = serde_json::from_slice(&decoded.stdout).unwrap();
    let space = d["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "alloc_space/bytes")
        .expect("an alloc_space profile");
    let total = space["total"].as_i64().unwrap();
    let by = &space["by_attribute"];
    let share = |ty: &str| {
        by[format!("rootline.allocated_type={ty}")]
            .as_i64()
            .unwrap_or(0) as f64
            / total as f64
    };
    let (bytes, ints) = (share("System.Byte[]"), share("System.Int32[]"));
    eprintln!("OTLP: {bytes:.4} System.Byte[], {ints:.4} System.Int32[]");
    assert!((bytes - 0.75).abs() <= 0.10, "{by}");
    assert!((ints - 0.25).abs() <= 0.10, "{by}");
}

fn launched(runtime: &Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let exe = runtime.build_program(SOURCE, "Alloc", dir.path());
    let out = dir.path().join("launched.rlp");
    let run = Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args(["record", "--alloc", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&runtime.dotnet)
        .arg(&exe)
        .env("ALLOC_SECONDS", "3")
        .env("DOTNET_CLI_TELEMETRY_OPTOUT", "1")
        .output()
        .expect("run rootline");
    let said = String::from_utf8_lossy(&run.stderr);
    eprintln!("{said}");
    assert!(run.status.success(), "{run:?}");
    assert!(said.contains("the command exited with status 0"), "{said}");
    check(runtime, "launched", &read(&out));
}

#[test]
fn record_alloc_samples_malloc_of_a_target_that_is_not_dotnet() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("native.rlp");
    let attach = |profile: &Profile| profile.metadata.extra.get("alloc.attach").cloned();
    // -p of a process without a diagnostics socket: its libc is probed.
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = sleeper.id().to_string();
    let run = rootline(
        &["record", "--alloc", "-p", &pid, "--duration", "1", "-o"],
        &[&out],
    );
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let said = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{said}");
    let profile = read(&out);
    let how = attach(&profile);
    assert!(
        how.as_deref().is_some_and(|h| h.starts_with("uprobe")),
        "{how:?}"
    );
    assert!(profile.sample_types().contains(&SampleType::alloc_bytes()));
    // A launched command that starts no runtime: the sampler library, and no note about .NET.
    let run = rootline(&["record", "--alloc", "-o"], &[&out])
        .status
        .success();
    assert!(!run, "a command is required");
    let run = Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args(["record", "--alloc", "-o"])
        .arg(&out)
        .args([
            "--",
            "sh",
            "-c",
            "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done",
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{said}");
    assert!(!said.contains(".NET"), "{said}");
    let profile = read(&out);
    assert_eq!(attach(&profile).as_deref(), Some("preload"));
    assert!(!profile.samples().is_empty());
}
