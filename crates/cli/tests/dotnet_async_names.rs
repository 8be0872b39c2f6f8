//! `rootline dotnet collect` (EventPipe) from a live .NET 8 process running an async chain
//! (`crates/capture/tests/jit/Async.cs`): the state machines' `MoveNext` frames are named as the
//! methods written (`Async!Rootline.Tests.Async.Level`), their raw names kept as system names, and
//! methods carry the code tier the runtime's `MethodLoad` events give.

#[path = "../../dotnet/tests/common/live.rs"]
mod live;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use rootline_profile::{FrameKind, read_rlp};

/// Awaits in each chain: Level(DEPTH) down to Level(0).
const DEPTH: usize = 12;

const LEVEL: &str = "Async!Rootline.Tests.Async.Level";
const GENERIC: &str = "Async!Rootline.Tests.Async+Nested`1[System.__Canon].Generic";
const LEAF: &str = "Async!Rootline.Tests.Async.Leaf(int32)";

/// The target, killed when dropped.
struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn eventpipe_names_async_methods_as_written_with_their_tiers() {
    let test = "eventpipe_names_async_methods_as_written_with_their_tiers";
    // The .NET 8 runtime (the async chain's names are checked on its EventPipe events).
    let Some(runtime) = live::runtimes(test).into_iter().find(|r| r.major() == 8) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../capture/tests/jit/Async.cs");
    let source = std::fs::read_to_string(&source).unwrap();
    let exe = runtime.build_program(&source, "Async", dir.path());
    let mut child = Command::new(&runtime.dotnet)
        .arg(&exe)
        .args([DEPTH.to_string(), "60".into()])
        .env("DOTNET_CLI_TELEMETRY_OPTOUT", "1")
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let target = Target(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");

    let out_path = dir.path().join("async.rlp");
    let out = Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args(["dotnet", "collect", "-p", &target.0.id().to_string()])
        .args(["--duration", "3", "-o"])
        .arg(&out_path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let p = read_rlp(std::fs::File::open(&out_path).unwrap())
        .unwrap()
        .profile;

    // Each async method: its name as written, its state machine's as the system name, a tier.
    for (name, raw) in [
        (
            LEVEL,
            "Async!Rootline.Tests.Async+<Level>c__async0.MoveNext()",
        ),
        (
            GENERIC,
            "Async!Rootline.Tests.Async+Nested`1+<Generic>c__async0`1[System.__Canon,System.Int32].MoveNext()",
        ),
    ] {
        let functions: Vec<_> = p
            .functions()
            .iter()
            .filter(|f| p.string(f.name) == name)
            .collect();
        assert!(!functions.is_empty(), "no {name}");
        for f in functions {
            assert_eq!(f.system_name.map(|s| p.string(s)), Some(raw));
            assert!(f.tier.is_some(), "{name} has no tier");
        }
    }
    assert!(
        !p.functions()
            .iter()
            .any(|f| p.string(f.name).contains("<Level>")),
        "a Level state machine left unnamed"
    );
    // Leaf's code tiers, as the runtime's MethodLoad events said.
    let leaf_tiers: Vec<&str> = p
        .functions()
        .iter()
        .filter(|f| p.string(f.name) == LEAF)
        .filter_map(|f| Some(p.string(f.tier?)))
        .collect();
    println!("Leaf tiers: {leaf_tiers:?}");
    assert!(!leaf_tiers.is_empty());
    for tier in &leaf_tiers {
        assert!(
            [
                "QuickJitted",
                "OptimizedTier1",
                "OptimizedTier1OSR",
                "InstrumentedTier",
                "InstrumentedTierOptimized"
            ]
            .contains(tier),
            "{tier}"
        );
    }

    // Whole stacks in Leaf hold every level of the chain.
    let mut frames = Vec::new();
    let mut whole = 0;
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
        assert_eq!(
            names.iter().filter(|&&n| n == LEVEL).count(),
            DEPTH + 1,
            "{names:#?}"
        );
    }
    println!(
        "{whole} of {} samples are whole stacks in Leaf",
        p.samples().len()
    );
    assert!(whole > 100, "{whole}");
}
