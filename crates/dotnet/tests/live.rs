//! Collecting from a live .NET process over its diagnostics socket, on every installed runtime
//! (CoreCLR 3.1 and .NET 8).
//!
//! The target recurses 150 frames deep on its main thread and 30 on a worker, then spins. EventPipe
//! walks at most 100 frames, so the main thread's samples come back cut at exactly 100 managed
//! frames (the defect repair exists for) while the worker's are whole.

mod common;

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use common::live::{Runtime, for_each_runtime};
use rootline_dotnet::collect::{CollectOptions, StopReason, collect};
use rootline_dotnet::ipc::{self, DiagnosticsClient, IpcError, PerfMapType, SessionConfig};
use rootline_dotnet::{discover, read_profile_with_stats};
use rootline_profile::Profile;

fn leaf_name(p: &Profile, stack: rootline_profile::StackId) -> &str {
    p.frame_name(p.stack(stack).frame)
}

#[test]
fn collect_names_managed_frames_and_cuts_deep_stacks_at_100() {
    for_each_runtime(
        "collect_names_managed_frames_and_cuts_deep_stacks_at_100",
        collect_names_and_cuts,
    );
}

/// The worker thread's root-most frame as EventPipe reports it: CoreLib's `ThreadHelper.ThreadStart`
/// (ReadyToRun code) on 3.1; on .NET 8 the thread's start frames (`Thread.StartCallback`) are not
/// in EventPipe's stacks, which begin at the thread's own method.
fn worker_root(runtime: &Runtime) -> &'static str {
    if runtime.major() < 5 {
        "System.Private.CoreLib!System.Threading.ThreadHelper.ThreadStart(class System.Object)"
    } else {
        "Rec!Rec.Shallow(class System.Object)"
    }
}

fn collect_names_and_cuts(runtime: &Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let exe = runtime.build_target(dir.path());
    let mut target = runtime.start(&exe, 150, 30);
    let pid = target.pid();

    let listed = discover::list_processes();
    assert!(listed.iter().any(|p| p.pid == pid), "ps lists the target");

    let options = CollectOptions {
        duration: Some(Duration::from_secs(3)),
        ..CollectOptions::default()
    };
    let mut trace = Vec::new();
    let summary = collect(pid, &options, &mut trace, &AtomicBool::new(false)).unwrap();
    assert_eq!(summary.reason, StopReason::Deadline);
    assert!(summary.complete, "{summary:?}");
    assert_eq!(summary.bytes, trace.len() as u64);
    eprintln!("{summary:?}");

    let (profile, stats) = read_profile_with_stats(&trace[..]).unwrap();
    eprintln!("{stats:?}");
    assert!(
        profile.samples().len() > 100,
        "{} samples",
        profile.samples().len()
    );
    let named = stats.resolved_sample_frames as f64 / stats.sample_frames as f64;
    assert!(named >= 0.99, "only {named:.4} of managed frames named");
    assert_eq!(profile.metadata.depth_cap, Some(100));
    assert_eq!(profile.processes()[0].pid, pid);

    let spin = "Rec!Rec.Spin(int32)";
    let down = "Rec!Rec.Down(int32,int32)";
    let (mut deep, mut shallow) = (0, 0);
    for &stack in &profile.samples().stacks {
        let depth = profile.stack_depth(stack);
        assert!(depth <= 100, "a stack deeper than EventPipe's cap: {depth}");
        if leaf_name(&profile, stack) != spin {
            continue;
        }
        let names: Vec<&str> = profile
            .stack_frames(stack)
            .map(|f| profile.frame_name(f))
            .collect();
        let downs = names.iter().filter(|n| **n == down).count();
        if depth == 100 {
            // Cut: Spin and 99 Down frames; Main and the rest of the recursion are missing.
            deep += 1;
            assert_eq!(downs, 99, "{names:?}");
            assert_eq!(names.last(), Some(&down));
        } else {
            // The worker: Spin, 31 Down frames (30 if the JIT made Down(0)'s call to Spin a tail
            // call), then Shallow and the thread start frames, whole to the thread's root.
            shallow += 1;
            assert!(downs == 31 || downs == 30, "{names:?}");
            assert_eq!(names.last(), Some(&worker_root(runtime)), "{names:?}");
            assert!(
                names.contains(&"Rec!Rec.Shallow(class System.Object)"),
                "{names:?}"
            );
        }
    }
    assert!(
        deep > 100 && shallow > 100,
        "deep {deep}, shallow {shallow}"
    );
    // Samples caught in the recursion itself (leaf Down) are cut at 100 as well.
    assert!(stats.samples_at_cap >= deep);
    // Framework code is ReadyToRun (precompiled, never jitted): its frames are named from the
    // rundown's method events all the same. On 3.1 the worker starts in CoreLib; on .NET 8 every
    // session start runs CoreLib's EventSource callbacks (the runtime's own event source is
    // managed there).
    let corelib = profile
        .samples()
        .stacks
        .iter()
        .flat_map(|&s| profile.stack_frames(s))
        .map(|f| profile.frame_name(f))
        .filter(|n| n.starts_with("System.Private.CoreLib!System."))
        .count();
    assert!(corelib > 0, "no named CoreLib frame");

    if runtime.major() < 8 {
        // A 3.1 runtime does not know EnablePerfMap (.NET 8+): the refusal is reported, not
        // hidden, and the target is unharmed.
        let client = DiagnosticsClient::new(discover::find_socket(pid).unwrap());
        match client.enable_perf_map(PerfMapType::PerfMap) {
            Err(IpcError::Server { hresult, .. }) => assert_eq!(hresult, ipc::E_UNKNOWN_COMMAND),
            other => panic!("{other:?}"),
        }
        // What `record` does before sampling a .NET process: the refusal becomes advice.
        match rootline_dotnet::perfmap::PerfMapGuard::enable(pid) {
            rootline_dotnet::perfmap::Outcome::Unsupported(msg) => {
                assert!(msg.contains("COMPlus_PerfMapEnabled=1"), "{msg}")
            }
            other => panic!("{other:?}"),
        }
    } else {
        // .NET 8 answers EnablePerfMap with OK and starts writing /tmp/perf-PID.map, whose
        // addresses carry a `0x` prefix and whose names end in the code tier (`[QuickJitted]`,
        // `[OptimizedTier1]`, …); the guard switches it off again when dropped.
        let map = std::path::PathBuf::from(format!("/tmp/perf-{pid}.map"));
        let _ = std::fs::remove_file(&map);
        let guard = match rootline_dotnet::perfmap::PerfMapGuard::enable(pid) {
            rootline_dotnet::perfmap::Outcome::Enabled(g) => g,
            other => panic!("{other:?}"),
        };
        // Methods compiled before the switch are written as it is flipped, and the main loop
        // jits nothing new, so the map may fill a moment later: wait for it.
        let t0 = std::time::Instant::now();
        let mut text = String::new();
        while !text.contains("Rec::") && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(100));
            text = std::fs::read_to_string(&map).unwrap_or_default();
        }
        let first = text.lines().next().unwrap_or_default().to_string();
        eprintln!("perf map: {first}");
        assert!(first.starts_with("0x"), "{first:?}");
        assert!(
            text.lines()
                .any(|l| l.contains("Rec::") && l.ends_with(']')),
            "no Rec method with its code tier in the perf map"
        );
        assert!(guard.will_disable());
        guard.finish().expect("DisablePerfMap answered OK");
        let _ = std::fs::remove_file(&map);
    }
    target.assert_still_answers();
}

#[test]
fn an_abandoned_session_leaves_the_target_running() {
    for_each_runtime(
        "an_abandoned_session_leaves_the_target_running",
        abandoned_session,
    );
}

fn abandoned_session(runtime: &Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let exe = runtime.build_target(dir.path());
    let mut target = runtime.start(&exe, 40, 10);
    let pid = target.pid();
    let client = DiagnosticsClient::new(discover::find_socket(pid).unwrap());

    // A collector that dies mid-way: its socket closes without StopTracing.
    let mut session = client.start_session(&SessionConfig::default()).unwrap();
    let mut head = [0u8; 4096];
    std::io::Read::read_exact(&mut session.stream, &mut head).unwrap();
    assert_eq!(&head[..8], b"Nettrace");
    drop(session);
    target.assert_still_answers();

    // The runtime took the abandoned session down: a new collection starts, stops by its id
    // (the stream must be drained meanwhile: the runtime flushes into it before answering), and
    // ends with a whole trace.
    let options = CollectOptions {
        duration: Some(Duration::from_millis(1500)),
        ..CollectOptions::default()
    };
    let mut trace = Vec::new();
    let summary = collect(pid, &options, &mut trace, &AtomicBool::new(false)).unwrap();
    assert!(
        summary.complete && summary.stop_error.is_none(),
        "{summary:?}"
    );
    let (profile, _) = read_profile_with_stats(&trace[..]).unwrap();
    assert!(!profile.samples().is_empty());
    target.assert_still_answers();
}
