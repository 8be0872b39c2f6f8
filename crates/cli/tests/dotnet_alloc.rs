//! `rootline dotnet collect --alloc` on a live .NET process, on every installed runtime (CoreCLR
//! 3.1 and .NET 8): a program that allocates three quarters of its bytes as `byte[4096]` in one
//! method and a quarter as `int[1024]` (the same size) in another, choosing at random which each
//! time so that no pattern lines up with the runtime's tick. The GC allocation ticks must give each
//! method and type its share of the bytes within 10%, and the writers must carry the allocation
//! columns: `report`/`convert --value alloc-bytes`, speedscope's views per column (and the
//! speedscope web app showing the bytes), and pprof's `alloc_space`/`alloc_objects` as
//! `go tool pprof` reads them.

#[path = "../../dotnet/tests/common/live.rs"]
mod live;
#[path = "../../../tests/support/real_tools.rs"]
mod real_tools;
#[path = "../../../tests/support/speedscope_check.rs"]
mod speedscope_check;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use live::{Runtime, for_each_runtime};
use rootline_profile::{FrameKind, Profile, SampleType, pseudo};

const SOURCE: &str = include_str!("../../dotnet/tests/data/Alloc.cs");

const BIG: &str = "Alloc!Alloc.Big(int32)";
const SMALL: &str = "Alloc!Alloc.Small(int32)";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rootline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args(args)
        .output()
        .expect("run rootline")
}

/// Bytes per (code frame above the allocation frame, allocated type), and the total, checking each
/// sample's columns; `one_per_event` when each sample is one event (not summed per stack, as pprof
/// files are).
fn bytes_by_site(profile: &Profile, one_per_event: bool) -> (BTreeMap<(String, String), i64>, i64) {
    let types = profile.sample_types();
    let bytes = types
        .iter()
        .position(|t| *t == SampleType::alloc_bytes())
        .expect("an alloc-bytes column");
    let ticks = types
        .iter()
        .position(|t| *t == SampleType::alloc_count())
        .expect("an alloc-count column");
    let cpu = types.iter().position(|t| t.name == "samples").unwrap();
    let samples = profile.samples();
    let mut sites = BTreeMap::new();
    let mut total = 0;
    for (i, &stack) in samples.stacks.iter().enumerate() {
        let leaf = profile.stack(stack).frame;
        let Some(ty) = pseudo::alloc_type_of(profile.frame_name(leaf)) else {
            // A thread sample: its own column only.
            assert_eq!(samples.values[bytes][i], 0);
            assert_eq!(samples.values[ticks][i], 0);
            assert!(samples.values[cpu][i] >= 1);
            continue;
        };
        assert!(pseudo::is_pseudo_frame(profile, leaf));
        if one_per_event {
            assert_eq!(profile.frame(leaf).kind, FrameKind::Pseudo);
            assert_eq!(
                samples.values[ticks][i], 1,
                "one tick per allocation sample"
            );
        } else {
            assert!(samples.values[ticks][i] >= 1);
        }
        assert_eq!(samples.values[cpu][i], 0);
        let caller = profile
            .stack(stack)
            .parent
            .map_or("(none)", |p| profile.frame_name(profile.stack(p).frame));
        let b = samples.values[bytes][i];
        assert!(b > 0);
        *sites
            .entry((caller.to_string(), ty.to_string()))
            .or_default() += b;
        total += b;
    }
    (sites, total)
}

/// Sums value column `column` of the sample lines of `go tool pprof -raw` output; checks its header.
fn go_pprof_sum(pprof: &Path, header: &[&str], column: usize) -> i64 {
    let raw = Command::new("go")
        .args(["tool", "pprof", "-raw", "-symbolize=none"])
        .arg(pprof)
        .output()
        .unwrap();
    assert!(raw.status.success(), "{raw:?}");
    let text = String::from_utf8(raw.stdout).unwrap();
    let samples = text.split_once("Samples:\n").unwrap().1;
    let got: Vec<&str> = samples.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(got, header);
    samples
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .filter_map(|(values, _)| {
            let v: Vec<i64> = values
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            (v.len() == header.len()).then(|| v[column])
        })
        .sum()
}

#[test]
fn allocation_ticks_attribute_bytes_to_methods_and_types() {
    for_each_runtime(
        "allocation_ticks_attribute_bytes_to_methods_and_types",
        allocations,
    );
}

fn allocations(runtime: &Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let exe = runtime.build_program(SOURCE, "Alloc", dir.path());
    let mut target = runtime.start(&exe, 0, 0);
    let trace = dir.path().join("alloc.nettrace");
    let out = rootline(&[
        "dotnet",
        "collect",
        "--alloc",
        "-p",
        &target.pid().to_string(),
        "--duration",
        "3",
        "-o",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    target.assert_still_answers();
    drop(target);

    let (profile, stats) =
        rootline_dotnet::read_profile_with_stats(std::fs::File::open(&trace).unwrap()).unwrap();
    eprintln!("{runtime}: {stats:?}");
    assert!(
        stats.managed_samples + stats.external_samples > 50,
        "CPU samples are kept: {stats:?}"
    );
    assert!(stats.allocation_ticks > 1000, "{stats:?}");
    // Main → Big is 2 frames deep (3 with Main's caller): no stack reaches EventPipe's cap.
    assert_eq!(stats.allocation_ticks_at_cap, 0);
    let (sites, total) = bytes_by_site(&profile, true);
    for ((caller, ty), bytes) in &sites {
        eprintln!(
            "{runtime}: {:6.2}% {bytes:>12} {caller} [{ty}]",
            100.0 * *bytes as f64 / total as f64
        );
    }
    let share = |caller: &str, ty: &str| {
        sites
            .get(&(caller.to_string(), ty.to_string()))
            .copied()
            .unwrap_or(0) as f64
            / total as f64
    };
    let big = share(BIG, "System.Byte[]");
    let small = share(SMALL, "System.Int32[]");
    assert!((big - 0.75).abs() <= 0.075, "Big has {big:.4} of the bytes");
    assert!(
        (small - 0.25).abs() <= 0.025,
        "Small has {small:.4} of the bytes"
    );
    // Ticks carry the bytes since the previous tick: about 100 KB each.
    let per_tick = total as f64 / stats.allocation_ticks as f64;
    assert!(
        (90_000.0..200_000.0).contains(&per_tick),
        "{per_tick} bytes per tick"
    );
    // The allocating method's stack is whole: it runs from Main.
    let main = "Alloc!Alloc.Main(class System.String[])";
    let whole = profile
        .samples()
        .stacks
        .iter()
        .filter(|&&s| pseudo::alloc_type_of(profile.frame_name(profile.stack(s).frame)).is_some())
        .filter(|&&s| {
            let names: Vec<&str> = profile
                .stack_frames(s)
                .map(|f| profile.frame_name(f))
                .collect();
            names.get(1) == Some(&BIG) && names.last() == Some(&main)
        })
        .count();
    assert!(whole > 100, "{whole} Big allocation stacks run from Main");

    // report and convert pick the allocation column by name.
    let report = rootline(&[
        "report",
        trace.to_str().unwrap(),
        "--value",
        "alloc-bytes",
        "--top",
        "5",
    ]);
    assert!(report.status.success(), "{report:?}");
    let text = String::from_utf8_lossy(&report.stdout);
    eprintln!("{text}");
    assert!(text.contains("[alloc: System.Byte[]]"), "{text}");
    assert!(
        text.contains(&format!(
            "allocations: {} GC allocation ticks",
            stats.allocation_ticks
        )),
        "{text}"
    );
    let folded = dir.path().join("alloc.folded");
    let conv = rootline(&[
        "convert",
        trace.to_str().unwrap(),
        "--value",
        "alloc-bytes",
        "-o",
        folded.to_str().unwrap(),
    ]);
    assert!(conv.status.success(), "{conv:?}");
    let folded = std::fs::read_to_string(&folded).unwrap();
    let mut folded_total = 0i64;
    let mut folded_big = 0i64;
    for line in folded.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: i64 = n.parse().unwrap();
        folded_total += n;
        if stack.ends_with(&format!("{BIG};[alloc: System.Byte[]]")) {
            folded_big += n;
        }
    }
    assert_eq!(folded_total, total);
    assert_eq!(
        folded_big,
        sites[&(BIG.to_string(), "System.Byte[]".to_string())]
    );

    // speedscope: a profile per thread for the time column and for each allocation column.
    let ss = dir.path().join("alloc.speedscope.json");
    let conv = rootline(&[
        "convert",
        trace.to_str().unwrap(),
        "-o",
        ss.to_str().unwrap(),
    ]);
    assert!(conv.status.success(), "{conv:?}");
    let file: serde_json::Value = serde_json::from_slice(&std::fs::read(&ss).unwrap()).unwrap();
    let mut by_view: BTreeMap<(String, String), i64> = BTreeMap::new();
    for p in file["profiles"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let view = name.rsplit_once(" — ").unwrap().1.to_string();
        let unit = p["unit"].as_str().unwrap().to_string();
        let sum: i64 = p["weights"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_i64().unwrap())
            .sum();
        *by_view.entry((view, unit)).or_default() += sum;
    }
    assert_eq!(by_view[&("alloc-bytes".into(), "bytes".into())], total);
    assert_eq!(
        by_view[&("alloc-count".into(), "none".into())],
        stats.allocation_ticks as i64
    );
    assert!(by_view[&("wall".into(), "nanoseconds".into())] > 0);
    assert_eq!(by_view.len(), 3, "{by_view:?}");

    // Chromium JSON is a timeline of thread samples: allocation ticks, which take no time, are
    // no slices (they do not stretch or cut the samples' slices) but instant events on their
    // thread, with the type and bytes as args and the stack in `sf`.
    let json = dir.path().join("alloc.json");
    let conv = rootline(&[
        "convert",
        trace.to_str().unwrap(),
        "-o",
        json.to_str().unwrap(),
    ]);
    assert!(conv.status.success(), "{conv:?}");
    let events: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let frames = &events["stackFrames"];
    let mut instant_bytes: BTreeMap<String, i64> = BTreeMap::new();
    let mut instants = 0;
    for e in events["traceEvents"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap_or_default();
        if e["ph"] != "i" {
            assert!(!name.starts_with("[alloc: "), "{e}");
            continue;
        }
        instants += 1;
        assert_eq!(e["s"], "t");
        let ty = e["args"]["allocated_type"].as_str().unwrap();
        assert_eq!(name, format!("[alloc: {ty}]"));
        let sf = &frames[e["sf"].as_u64().unwrap().to_string()];
        assert_eq!(sf["name"], name);
        *instant_bytes.entry(ty.to_string()).or_default() += e["args"]["bytes"].as_i64().unwrap();
    }
    assert_eq!(instants, stats.allocation_ticks);
    assert_eq!(instant_bytes.values().sum::<i64>(), total);
    let byte_share = instant_bytes["System.Byte[]"] as f64 / total as f64;
    assert!((byte_share - 0.75).abs() <= 0.075, "{instant_bytes:?}");
    let back = rootline(&["report", json.to_str().unwrap()]);
    assert!(back.status.success(), "{back:?}");
    let said = String::from_utf8_lossy(&back.stderr);
    assert!(!said.contains("warning"), "{said}");

    // speedscope's web app shows the bytes view (`--value alloc-bytes`: the only view), frames and
    // allocated types included.
    if speedscope_check::present(&workspace(), "the speedscope web app check") {
        let only = dir.path().join("bytes.speedscope.json");
        let conv = rootline(&[
            "convert",
            trace.to_str().unwrap(),
            "--value",
            "alloc-bytes",
            "-o",
            only.to_str().unwrap(),
        ]);
        assert!(conv.status.success(), "{conv:?}");
        let file: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&only).unwrap()).unwrap();
        let first = file["profiles"][0]["name"].as_str().unwrap().to_owned();
        assert!(first.ends_with(" — alloc-bytes"), "{first}");
        let output = Command::new("node")
            .arg(workspace().join("tests/js-speedscope/speedscope-check.mjs"))
            .arg(&only)
            .arg(&first)
            .args(["Alloc.Big(int32)", "[alloc: System.Int32[]]"])
            .output()
            .expect("run node");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("\"ok\":true"),
            "speedscope check failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    // pprof: Go's allocation sample types, read by go tool pprof with the same totals.
    let pprof = dir.path().join("alloc.pb.gz");
    let conv = rootline(&[
        "convert",
        trace.to_str().unwrap(),
        "-o",
        pprof.to_str().unwrap(),
    ]);
    assert!(conv.status.success(), "{conv:?}");
    // Read back: the same columns and bytes per type; the type label is known, not dropped.
    let back = rootline_formats::pprof::read(std::io::BufReader::new(
        std::fs::File::open(&pprof).unwrap(),
    ))
    .unwrap();
    assert_eq!(back.sample_types(), profile.sample_types());
    assert_eq!(bytes_by_site(&back, false), (sites.clone(), total));
    assert!(
        !back.metadata.extra.contains_key("pprof.dropped_label_keys"),
        "{:?}",
        back.metadata.extra
    );
    if !real_tools::available("go", &["version"], "apt-get install golang-go") {
        return;
    }
    let header = [
        "samples/count",
        "wall/nanoseconds",
        "alloc_space/bytes",
        "alloc_objects/count",
    ];
    assert_eq!(go_pprof_sum(&pprof, &header, 2), total);
    assert_eq!(
        go_pprof_sum(&pprof, &header, 3),
        stats.allocation_ticks as i64
    );
    // Each allocation carries its type as a label too: go tool pprof's breakdown by label gives
    // the types their shares of the bytes.
    let tags = Command::new("go")
        .args(["tool", "pprof", "-sample_index=alloc_space", "-tags"])
        .arg(&pprof)
        .output()
        .unwrap();
    assert!(tags.status.success(), "{tags:?}");
    let text = String::from_utf8(tags.stdout).unwrap();
    let types = text
        .split_once("allocated_type:")
        .unwrap_or_else(|| panic!("no allocated_type label: {text}"))
        .1;
    // Lines like `23.0GB (75.05%): System.Byte[]`, largest first, up to a blank line.
    let shares: Vec<(f64, &str)> = types
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| {
            let (left, ty) = l.rsplit_once("): ").unwrap();
            let pct = left
                .rsplit_once('(')
                .unwrap()
                .1
                .trim()
                .trim_end_matches('%');
            (pct.parse().unwrap(), ty)
        })
        .collect();
    assert_eq!(shares[0].1, "System.Byte[]", "{text}");
    assert_eq!(shares[1].1, "System.Int32[]", "{text}");
    assert!((shares[0].0 - 75.0).abs() <= 7.5, "{text}");
    assert!((shares[1].0 - 25.0).abs() <= 2.5, "{text}");
}
