//! CoreCLR (the .NET Core 3.1 runtime of PyPI `dotnetcore2`, started with
//! `COMPlus_PerfMapEnabled=1`) and Mono (`mono --jitmap`): JIT frames named from the runtime's perf
//! map, unwound through JIT code into the runtime's native frames, checked against the target's
//! known call graph (`tests/jit/Calls.cs`).

mod jit;

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;

use jit::{Graph, Rate, Running, Setup, dotnet, is_native_root, record_and_check, require, which};

use rootline_capture::jit::parse_name;
use rootline_capture::jit::perfinfo::PerfInfo;
use rootline_dotnet::image::r2r::{R2rImage, method_names};

const DEEP: usize = 150;
const SHALLOW: usize = 30;

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
    let Some((dotnet, exe, _setup)) =
        dotnet::coreclr_program("coreclr_frames_are_named_whole_and_true", "Calls")
    else {
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
    let Some(mcs) = dotnet::mcs(test) else {
        return;
    };
    let setup = Setup::new();
    let exe = dotnet::build(&mcs, setup.path(), None, "Calls");
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

/// CoreCLR's own libraries run from their precompiled (ReadyToRun) code, which no perf map
/// names: the runtime lists the images it loads in `perfinfo-PID.map`, and each frame in one is
/// named from the image's ReadyToRun method entry points and metadata, with the image as its
/// mapping.
#[test]
fn coreclr_precompiled_frames_are_named_from_the_image() {
    let Some((dotnet, exe, _setup)) = dotnet::coreclr_program(
        "coreclr_precompiled_frames_are_named_from_the_image",
        "Precompiled",
    ) else {
        return;
    };
    let mut cmd = Command::new(&dotnet);
    cmd.arg(&exe)
        .arg("60")
        .env("COMPlus_PerfMapEnabled", "1")
        .env("COMPlus_TieredCompilation", "0")
        .env("DOTNET_CLI_TELEMETRY_OPTOUT", "1");
    let target = Running::start(cmd);
    let pid = target.pid();

    // The runtime's own perfinfo file: CoreLib loaded at a base where its file is mapped from
    // offset 0, the IL-only program at base 0.
    let info_path = format!("/tmp/perfinfo-{pid}.map");
    let mut info =
        PerfInfo::new(std::fs::File::open(&info_path).expect("the runtime writes perfinfo"));
    info.read_more().unwrap();
    assert!(info.bad_lines.is_empty(), "{:?}", info.bad_lines);
    let corelib = info
        .images
        .iter()
        .find(|i| i.path.ends_with("/System.Private.CoreLib.dll"))
        .expect("CoreLib's image load")
        .clone();
    let program = info
        .images
        .iter()
        .find(|i| i.path.ends_with("/Precompiled.exe"))
        .expect("the program's image load");
    assert_eq!(
        program.base, 0,
        "an IL-only assembly has no precompiled code"
    );
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let header = maps
        .lines()
        .find(|l| l.ends_with(&corelib.path))
        .expect("CoreLib is mapped");
    let (range, rest) = header.split_once(' ').unwrap();
    assert_eq!(
        u64::from_str_radix(range.split_once('-').unwrap().0, 16).unwrap(),
        corelib.base,
        "CoreLib's first mapping starts at its perfinfo base"
    );
    assert_eq!(rest.split_whitespace().nth(1), Some("00000000"));

    let rate = Rate {
        hz: 10_000,
        seconds: 5.0,
        stack_kib: 32,
    };
    let graph = dotnet::precompiled_graph();
    let (recording, v) = record_and_check("coreclr precompiled", pid, rate, &graph, 10_000);
    v.assert_whole_and_true();
    // Nearly every sample is in the program: a stack that lost Main and Work would not count.
    assert!(v.program_samples * 100 >= v.samples * 95, "program samples");
    let corelib_frames = dotnet::CoreLibFrames::collect(&recording.profile, &corelib.path);
    corelib_frames.print();
    corelib_frames.assert_named_and_true(2000);
}

/// Runs `exe` with perf maps on and `env`, waits `seconds` after `ready`, and returns the
/// runtime's perf map and CoreLib's path from its perfinfo file.
fn perf_map_of(dotnet: &Path, exe: &Path, env: &[(&str, &str)], seconds: u64) -> (String, String) {
    let mut cmd = Command::new(dotnet);
    cmd.arg(exe)
        .arg("60")
        .env("COMPlus_PerfMapEnabled", "1")
        .env("DOTNET_CLI_TELEMETRY_OPTOUT", "1")
        .envs(env.iter().copied());
    let target = Running::start(cmd);
    std::thread::sleep(std::time::Duration::from_secs(seconds));
    let pid = target.pid();
    let map = std::fs::read_to_string(format!("/tmp/perf-{pid}.map")).unwrap();
    let mut info = PerfInfo::new(std::fs::File::open(format!("/tmp/perfinfo-{pid}.map")).unwrap());
    info.read_more().unwrap();
    let corelib = info
        .images
        .iter()
        .find(|i| i.path.ends_with("/System.Private.CoreLib.dll"))
        .expect("CoreLib's image load");
    (map, corelib.path.clone())
}

/// The CoreLib methods of a perf map, by whether the runtime compiled them at tier 1
/// (`[OptimizedTier1]`) or otherwise; `generic` keeps instantiations of generic types and
/// methods (which the metadata alone does not spell).
fn corelib_methods(map: &str, generic: bool) -> (HashSet<String>, HashSet<String>) {
    let (mut other, mut tier1) = (HashSet::new(), HashSet::new());
    for (i, line) in map.lines().enumerate() {
        let Ok(entry) = rootline_capture::jit::perfmap::parse_line(line, i as u64 + 1) else {
            continue;
        };
        let name = parse_name(&entry.raw);
        if name.module.as_deref() != Some("System.Private.CoreLib") {
            continue;
        }
        let (owner, method) = name.name.split_once("::").unwrap();
        // The runtime's own stubs (`dynamicClass::IL_STUB_PInvoke`) have no metadata.
        if owner == "dynamicClass" || !generic && (owner.contains('[') || method.contains("!!")) {
            continue;
        }
        if entry.raw.ends_with("[OptimizedTier1]") {
            tier1.insert(name.name);
        } else {
            other.insert(name.name);
        }
    }
    (other, tier1)
}

/// The names read from CoreLib's image are the runtime's own.
///
/// With its precompiled code disabled (`COMPlus_ReadyToRun=0`) the runtime compiles every
/// CoreLib method it runs and names it in its perf map: each non-generic one must be spelled
/// exactly as the image's metadata spells it.
///
/// With tiered compilation on, a method (or instantiation) that starts in precompiled code is
/// later compiled at tier 1 only (`[OptimizedTier1]`, no `[QuickJitted]` before it): such methods must be among
/// those the image gives code for — except methods the runtime compiled before it opened its
/// perf map (start-up code), which are listed.
#[test]
fn coreclr_precompiled_names_match_the_runtimes_own() {
    let Some((dotnet, exe, _setup)) = dotnet::coreclr_program(
        "coreclr_precompiled_names_match_the_runtimes_own",
        "Precompiled",
    ) else {
        return;
    };

    let (map, corelib) = perf_map_of(&dotnet, &exe, &[("COMPlus_ReadyToRun", "0")], 1);
    let bytes = std::fs::read(&corelib).unwrap();
    let defined: HashSet<String> = method_names(&bytes).unwrap().into_iter().collect();
    let (other, tier1) = corelib_methods(&map, false);
    let compiled: Vec<&String> = other.union(&tier1).collect();
    let misspelled: Vec<&&String> = compiled.iter().filter(|n| !defined.contains(**n)).collect();
    let nested = compiled
        .iter()
        .filter(|n| n.split_once("::").is_some_and(|(o, _)| o.contains('+')))
        .count();
    println!(
        "CoreLib defines {} methods; the runtime compiled {} non-generic ones ({nested} of \
         nested types), spelled differently: {misspelled:#?}",
        defined.len(),
        compiled.len()
    );
    assert!(compiled.len() >= 300, "{} methods", compiled.len());
    assert!(misspelled.is_empty());
    let image = R2rImage::parse(&bytes).unwrap();
    assert_eq!(image.assembly, "System.Private.CoreLib");
    // Every entry point parsed: every piece of precompiled code named (funclets after their
    // method, as the runtime attributes them).
    assert_eq!(image.methods.len() as u32, image.runtime_functions);
    let with_code: HashSet<&str> = image
        .methods
        .iter()
        .flat_map(|m| m.name.split(" | "))
        .collect();
    // Instantiations the image has code for are spelled as the runtime spells them (those it
    // compiled may include instantiations the image has no code for).
    let (other, tier1) = corelib_methods(&map, true);
    let instantiations: Vec<&String> = other
        .union(&tier1)
        .filter(|n| n.split_once("::").is_some_and(|(o, _)| o.contains('[')))
        .collect();
    let spelled: Vec<&&String> = instantiations
        .iter()
        .filter(|n| with_code.contains(n.as_str()))
        .collect();
    println!(
        "instantiations the runtime compiled: {}, of them named by the image: {spelled:#?}",
        instantiations.len()
    );
    assert!(spelled.len() >= 5, "{} instantiations", spelled.len());
    assert!(spelled.len() * 4 >= instantiations.len() * 3);

    // Let the hot methods reach tier 1.
    let (map, _) = perf_map_of(&dotnet, &exe, &[], 3);
    let (other, tier1) = corelib_methods(&map, true);
    let from_image: Vec<&String> = tier1.iter().filter(|n| !other.contains(*n)).collect();
    let (matched, early): (Vec<&String>, Vec<&String>) = from_image
        .iter()
        .partition(|n| with_code.contains(n.as_str()));
    println!(
        "{} methods with precompiled code ({} runtime functions); moved to tier 1 with no tier 0: {}, with \
         precompiled code in the image: {}, compiled before the perf map opened: {early:#?}",
        with_code.len(),
        image.runtime_functions,
        from_image.len(),
        matched.len()
    );
    assert!(matched.len() >= 8, "{} methods", matched.len());
    assert!(early.len() <= matched.len() / 2);
}

/// A damaged image is an error (or fewer names), never a panic: CoreLib truncated at many
/// lengths and with random bytes overwritten, in its headers and anywhere.
#[test]
fn damaged_images_are_errors_not_panics() {
    let Some(dotnet) = dotnet::host("damaged_images_are_errors_not_panics") else {
        return;
    };
    let fw = dotnet
        .parent()
        .unwrap()
        .join("shared/Microsoft.NETCore.App");
    let version = std::fs::read_dir(&fw)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .max()
        .expect("a framework version");
    let good = std::fs::read(version.join("System.Private.CoreLib.dll")).unwrap();
    let whole = R2rImage::parse(&good).unwrap().methods.len();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut errors, mut fewer) = (0, 0);
    let mut check = |bytes: &[u8]| {
        match R2rImage::parse(bytes) {
            Err(_) => errors += 1,
            Ok(i) if i.methods.len() < whole => fewer += 1,
            Ok(_) => {}
        }
        let _ = method_names(bytes);
    };
    let len = good.len();
    for cut in [
        0,
        2,
        0x40,
        0x100,
        0x200,
        0x1000,
        len / 8,
        len / 4,
        len / 2,
        len - 1,
    ] {
        check(&good[..cut]);
    }
    // Where the metadata root and the ReadyToRun header are.
    let find = |magic: &[u8]| {
        good.windows(magic.len())
            .position(|w| w == magic)
            .expect("the structure is in the file")
    };
    let regions = [
        (0, 0x2000),
        (find(b"BSJB"), 0x1_0000),
        (find(b"RTR\0"), 0x1000),
        (0, len),
    ];
    for round in 0..32 {
        let mut bytes = good.clone();
        let (start, span) = regions[round % regions.len()];
        for _ in 0..64 {
            let at = (start + (next() as usize) % span).min(len - 1);
            bytes[at] = next() as u8;
        }
        check(&bytes);
    }
    println!("damaged CoreLib: {errors} errors, {fewer} with fewer names, of 42");
    assert!(errors >= 6, "the truncated headers are errors");
}
