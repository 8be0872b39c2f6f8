//! Collecting from a live .NET Core 3.1 process over its diagnostics socket.
//!
//! The target recurses 150 frames deep on its main thread and 30 on a worker, then spins. EventPipe
//! walks at most 100 frames, so the main thread's samples come back cut at exactly 100 managed
//! frames (the defect repair exists for) while the worker's are whole.

mod common;

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use common::live::{Target, build_target, tools};
use rootline_dotnet::collect::{CollectOptions, StopReason, collect};
use rootline_dotnet::ipc::{self, DiagnosticsClient, IpcError, PerfMapType, SessionConfig};
use rootline_dotnet::{discover, read_profile_with_stats};
use rootline_profile::Profile;

fn leaf_name(p: &Profile, stack: rootline_profile::StackId) -> &str {
    p.frame_name(p.stack(stack).frame)
}

#[test]
fn collect_names_managed_frames_and_cuts_deep_stacks_at_100() {
    let Some((dotnet, mcs)) = tools("collect_names_managed_frames_and_cuts_deep_stacks_at_100")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let exe = build_target(&dotnet, &mcs, dir.path());
    let mut target = Target::start(&dotnet, &exe, 150, 30);
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
            assert_eq!(
                names.last(),
                Some(
                    &"System.Private.CoreLib!System.Threading.ThreadHelper.ThreadStart(class System.Object)"
                )
            );
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

    // A 3.1 runtime does not know EnablePerfMap (.NET 8+): the refusal is reported, not hidden,
    // and the target is unharmed.
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
    target.assert_still_answers();
}

#[test]
fn an_abandoned_session_leaves_the_target_running() {
    let Some((dotnet, mcs)) = tools("an_abandoned_session_leaves_the_target_running") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let exe = build_target(&dotnet, &mcs, dir.path());
    let mut target = Target::start(&dotnet, &exe, 40, 10);
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
