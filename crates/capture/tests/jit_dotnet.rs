//! CoreCLR (the .NET Core 3.1 runtime of PyPI `dotnetcore2`, started with
//! `COMPlus_PerfMapEnabled=1`) and Mono (`mono --jitmap`): JIT frames named from the runtime's perf
//! map, unwound through JIT code into the runtime's native frames, checked against the target's
//! known call graph (`tests/jit/Calls.cs`).

mod jit;

use std::path::{Path, PathBuf};
use std::process::Command;

use jit::{Graph, Rate, Running, Setup, is_native_root, record_and_check, require, sources, which};

const DEEP: usize = 150;
const SHALLOW: usize = 30;

/// The `dotnet` host: `$ROOTLINE_DOTNET`, else the one the `dotnetcore2` wheel ships.
fn dotnet() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ROOTLINE_DOTNET") {
        return Some(PathBuf::from(p));
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import dotnetcore2,os;print(os.path.dirname(dotnetcore2.__file__))",
        ])
        .output()
        .ok()?;
    let host = Path::new(String::from_utf8(out.stdout).ok()?.trim()).join("bin/dotnet");
    (out.status.success() && host.exists()).then_some(host)
}

/// Compiles `Calls.cs` with `mcs` into `dir`; writes a runtimeconfig for the host's framework.
fn build(mcs: &Path, dir: &Path, dotnet: Option<&Path>) -> PathBuf {
    let exe = dir.join("Calls.exe");
    let status = Command::new(mcs)
        .arg("-optimize+")
        .arg(format!("-out:{}", exe.display()))
        .arg(sources().join("Calls.cs"))
        .status()
        .expect("run mcs");
    assert!(status.success(), "mcs failed");
    if let Some(dotnet) = dotnet {
        let fw = dotnet
            .parent()
            .unwrap()
            .join("shared/Microsoft.NETCore.App");
        let mut versions: Vec<String> = std::fs::read_dir(&fw)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        versions.sort();
        let config = format!(
            r#"{{"runtimeOptions":{{"tfm":"netcoreapp3.1","framework":{{"name":"Microsoft.NETCore.App","version":"{}"}},"configProperties":{{"System.Globalization.Invariant":true}}}}}}"#,
            versions.pop().expect("a framework version")
        );
        std::fs::write(dir.join("Calls.runtimeconfig.json"), config).unwrap();
    }
    exe
}

fn coreclr_short(name: &str) -> Option<&'static str> {
    Some(match name {
        "Calls::Main(string[])" => "Main",
        "Calls::Shallow(object)" => "Shallow",
        "Calls::Down(int32,int32)" => "Down",
        "Calls::Spin(int32)" => "Spin",
        "Calls::Step(int32,int32)" => "Step",
        _ => return None,
    })
}

fn mono_short(name: &str) -> Option<&'static str> {
    Some(match name {
        "Calls:Main (string[])" => "Main",
        "Calls:Shallow (object)" => "Shallow",
        "Calls:Down (int,int)" => "Down",
        "Calls:Spin (int)" => "Spin",
        "Calls:Step (int,int)" => "Step",
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

const RECURSION: [(&str, usize); 2] = [("Main", DEEP + 1), ("Shallow", SHALLOW + 1)];

/// Mono's test takes many samples: a shallower recursion keeps each one cheap.
const MONO_DEEP: usize = 20;
const MONO_SHALLOW: usize = 10;
const MONO_RECURSION: [(&str, usize); 2] = [("Main", MONO_DEEP + 1), ("Shallow", MONO_SHALLOW + 1)];

#[test]
fn coreclr_frames_are_named_whole_and_true() {
    let test = "coreclr_frames_are_named_whole_and_true";
    let Some(dotnet) = require(test, "the .NET runtime (pip install dotnetcore2)", dotnet()) else {
        return;
    };
    let Some(mcs) = require(test, "mcs (apt-get install mono-mcs)", which("mcs")) else {
        return;
    };
    let setup = Setup::new();
    let exe = build(&mcs, setup.path(), Some(&dotnet));
    let mut cmd = Command::new(&dotnet);
    cmd.arg(&exe)
        .args([
            DEEP.to_string(),
            SHALLOW.to_string(),
            "1".into(),
            "60".into(),
        ])
        .env("COMPlus_PerfMapEnabled", "1")
        .env("DOTNET_CLI_TELEMETRY_OPTOUT", "1");
    let target = Running::start(cmd);
    let graph = Graph {
        short: &coreclr_short,
        entries: &["Main", "Shallow"],
        edges: &EDGES,
        recursion: Some(("Down", "Spin", RECURSION.to_vec())),
        is_root: &is_native_root,
    };
    let rate = Rate {
        hz: 4000,
        seconds: 6.0,
        stack_kib: 60,
    };
    let (recording, v) = record_and_check("coreclr", target.pid(), rate, &graph, 2000);
    v.assert_whole_and_true();
    assert!(v.exact_recursion > 1000);
    // Managed frames carry their kind and their assembly as the mapping.
    let p = &recording.profile;
    let main = p
        .frames()
        .iter()
        .find(|f| p.string(p.function(f.function).name) == "Calls::Main(string[])")
        .expect("a Main frame");
    assert_eq!(main.kind, rootline_profile::FrameKind::Managed);
    assert_eq!(p.string(p.mapping(main.mapping.unwrap()).path), "Calls");
}

#[test]
fn mono_frames_are_named_whole_and_true() {
    let test = "mono_frames_are_named_whole_and_true";
    let Some(mono) = require(test, "mono (apt-get install mono-runtime)", which("mono")) else {
        return;
    };
    let Some(mcs) = require(test, "mcs (apt-get install mono-mcs)", which("mcs")) else {
        return;
    };
    let setup = Setup::new();
    let exe = build(&mcs, setup.path(), None);
    let mut cmd = Command::new(&mono);
    cmd.arg("--jitmap").arg(&exe).args([
        MONO_DEEP.to_string(),
        MONO_SHALLOW.to_string(),
        "2".into(),
        "60".into(),
    ]);
    let target = Running::start(cmd);
    let graph = Graph {
        short: &mono_short,
        entries: &["Main", "Shallow"],
        edges: &EDGES,
        recursion: Some(("Down", "Spin", MONO_RECURSION.to_vec())),
        is_root: &is_native_root,
    };
    let rate = Rate {
        hz: 20_000,
        seconds: 10.0,
        stack_kib: 16,
    };
    let (_, v) = record_and_check("mono", target.pid(), rate, &graph, 20_000);
    v.assert_whole_and_true();
}
