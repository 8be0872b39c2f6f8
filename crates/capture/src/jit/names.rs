//! Names from JIT maps, as each runtime writes them, turned into a function name, a module and a
//! frame kind.
//!
//! - CoreCLR: `void [Rec] Rec::Main(string[])[Optimized]` → `Rec::Main(string[])` in module `Rec`
//!   at code tier `Optimized`, the whole line kept as the system name; an `async` method's
//!   state machine, `[Async] Async+<Level>d__3::MoveNext()[OptimizedTier1]`, is named as the
//!   method the user wrote, `Async::Level` (see [`rootline_dotnet::names`]). Its stubs
//!   (`stub<1> …`) have no module.
//! - Mono: `Rec:Main (string[])`, kept as written.
//! - Node/V8: `JS:*fib /tmp/x.js:3:13` (or `LazyCompile:`, `Function:`, …) → `fib` in file
//!   `/tmp/x.js:3:13` (the tier marker `*`, `~`, `^`, `+` dropped); `Builtin:`, `Stub:`,
//!   `BytecodeHandler:` and other V8 code keep their whole name.
//! - HotSpot (`jcmd PID Compiler.perfmap`): `void Rec.down(int, int)` or `Rec::down`; the
//!   return type, when present, is dropped.
//!
//! A name that is a method of the program (it has a class or a script location) makes a
//! [`FrameKind::Managed`] frame; runtime stubs, builtins and anything unrecognised make a
//! [`FrameKind::Jit`] frame.

use rootline_dotnet::image::r2r::{R2rImage, R2rMethod};
use rootline_profile::FrameKind;

/// A parsed JIT symbol name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitName {
    /// The function name to show.
    pub name: String,
    /// The module (assembly) the method belongs to, when the map says.
    pub module: Option<String>,
    /// The source file (and position) when the map says (V8).
    pub file: Option<String>,
    /// `Managed` for a program's method, `Jit` for runtime-generated code.
    pub kind: FrameKind,
    /// The symbol is one function entered at its first byte. False for code blobs that hold
    /// many routines (HotSpot's `Interpreter`, `StubRoutines (1)`, adapters; CoreCLR's precode
    /// blocks `stub<N> …`): their start says nothing about a frame.
    pub single_function: bool,
    /// Return addresses into this code need not follow a call instruction: HotSpot's
    /// interpreter pushes its return entry and jumps to the callee.
    pub pushed_returns: bool,
    /// Precompiled code in a mapped image file (.NET ReadyToRun), not JIT memory: the frame
    /// keeps the image as its mapping.
    pub precompiled: bool,
    /// The name as the runtime wrote it, when `name` differs from it.
    pub system_name: Option<String>,
    /// The code tier, when the runtime says: CoreCLR's `QuickJitted`, `OptimizedTier1`,
    /// `OptimizedTier1OSR`, `ReadyToRun`, …
    pub tier: Option<String>,
}

impl JitName {
    /// The name of `method`, precompiled code of the ReadyToRun `image`: a managed method of the
    /// image's assembly, keeping the image file as its mapping.
    pub fn precompiled(image: &R2rImage, method: &R2rMethod) -> JitName {
        JitName {
            name: method.name.clone(),
            module: Some(image.assembly.clone()),
            file: None,
            kind: FrameKind::Managed,
            single_function: !method.funclet,
            pushed_returns: false,
            precompiled: true,
            system_name: None,
            tier: Some(READY_TO_RUN.to_string()),
        }
    }
}
/// The code tier of precompiled .NET code named from its ReadyToRun image, as CoreCLR's perf
/// map spells it.
pub const READY_TO_RUN: &str = "ReadyToRun";

/// The name of a frame in HotSpot's interpreter (the perf map's `Interpreter` blob).
pub const INTERPRETED_JAVA: &str = "[interpreted Java]";

/// HotSpot's handlers for compiled code stopped at a safepoint poll, as its perf map names them.
pub const HOTSPOT_SAFEPOINT_HANDLER: &str = "SafepointBlob";

const V8_METHOD_PREFIXES: [&str; 6] = [
    "JS:",
    "LazyCompile:",
    "Function:",
    "Script:",
    "Eval:",
    "InterpretedFunction:",
];

/// Parses a perf-map or jitdump name.
pub fn parse_name(raw: &str) -> JitName {
    let raw = raw.trim();
    if let Some(n) = coreclr(raw) {
        return n;
    }
    if let Some(rest) = V8_METHOD_PREFIXES.iter().find_map(|p| raw.strip_prefix(p)) {
        return v8(rest);
    }
    // V8 code objects (`Builtin:`, `Stub:`, `BytecodeHandler:`, `RegExp:` …) are functions.
    let v8_code = raw
        .split_once(':')
        .is_some_and(|(tag, _)| !tag.is_empty() && tag.chars().all(|c| c.is_ascii_alphanumeric()));
    let jit = |name: &str| JitName {
        // HotSpot's template interpreter: its frames are Java methods run interpreted.
        name: if name == "Interpreter" {
            INTERPRETED_JAVA.to_string()
        } else {
            name.to_string()
        },
        module: None,
        file: None,
        kind: FrameKind::Jit,
        single_function: v8_code,
        pushed_returns: name == "Interpreter",
        precompiled: false,
        system_name: None,
        tier: None,
    };
    if raw.starts_with("stub<") || raw.contains(':') && !raw.contains('(') {
        // CoreCLR stubs, V8 `Builtin:`/`Stub:`/`BytecodeHandler:`, Mono trampolines.
        return jit(raw);
    }
    if let Some(name) = java_or_mono(raw) {
        return JitName {
            name,
            module: None,
            file: None,
            kind: FrameKind::Managed,
            single_function: true,
            pushed_returns: false,
            precompiled: false,
            system_name: None,
            tier: None,
        };
    }
    jit(raw)
}

/// `RET [Module] Class::Method(sig)[Tier]`.
fn coreclr(raw: &str) -> Option<JitName> {
    let mut search = 0;
    let (module_start, module_end) = loop {
        let open = search + raw[search..].find('[')?;
        let close = open + raw[open..].find(']')?;
        let at_word_start = open == 0 || raw.as_bytes()[open - 1] == b' ';
        let followed = raw.as_bytes().get(close + 1) == Some(&b' ');
        let module = &raw[open + 1..close];
        if at_word_start && followed && !module.is_empty() && !module.contains(' ') {
            break (open + 1, close);
        }
        search = close + 1;
    };
    let mut name = raw[module_end + 2..].trim();
    if !name.contains("::") {
        return None;
    }
    // The code tier: `[Optimized]`, `[QuickJitted]`, `[PreJIT]`, `[OptimizedTier1]`, …
    let mut tier = None;
    if name.ends_with(']')
        && let Some(open) = name.rfind('[')
        && name[..open].ends_with(')')
    {
        tier = Some(name[open + 1..name.len() - 1].to_string()).filter(|t| !t.is_empty());
        name = &name[..open];
    }
    let name = match name.strip_suffix("::MoveNext()") {
        Some(machine) => rootline_dotnet::names::state_machine_method(machine).map_or_else(
            || name.to_string(),
            |m| format!("{}::{}", m.declaring_type, m.method),
        ),
        None => name.to_string(),
    };
    Some(JitName {
        name,
        module: Some(raw[module_start..module_end].to_string()),
        file: None,
        kind: FrameKind::Managed,
        single_function: true,
        pushed_returns: false,
        precompiled: false,
        system_name: Some(raw.to_string()),
        tier,
    })
}

fn v8(rest: &str) -> JitName {
    let rest = rest.trim_start_matches(['*', '~', '^', '+']);
    let (name, file) = match rest.split_once(' ') {
        Some((n, f)) => (n, Some(f.trim().to_string()).filter(|f| !f.is_empty())),
        None => (rest, None),
    };
    let name = if name.is_empty() { "(anonymous)" } else { name };
    JitName {
        name: name.to_string(),
        module: None,
        file,
        kind: FrameKind::Managed,
        single_function: true,
        pushed_returns: false,
        precompiled: false,
        system_name: None,
        tier: None,
    }
}

/// Mono `Class:Method (sig)` and HotSpot `[RET ]pkg.Class::method(sig)` / `pkg.Class.method(sig)`.
fn java_or_mono(raw: &str) -> Option<String> {
    let paren = raw.find('(')?;
    let head = &raw[..paren];
    if !head.contains([':', '.']) {
        return None;
    }
    // Mono puts a space before the signature; HotSpot may put a return type before the name.
    let head_trim = head.trim_end();
    let name_start = head_trim.rfind(' ').map_or(0, |i| i + 1);
    if head_trim.ends_with(' ') || head_trim[name_start..].is_empty() {
        return None;
    }
    if head.ends_with(' ') {
        // Mono: keep as written.
        return Some(raw.to_string());
    }
    Some(raw[name_start..].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(raw: &str) -> (String, Option<String>, FrameKind) {
        let p = parse_name(raw);
        (p.name, p.module, p.kind)
    }

    #[test]
    fn coreclr_names_lose_return_type_and_tier() {
        assert_eq!(
            n("void [Rec] Rec::Main(string[])[Optimized]"),
            (
                "Rec::Main(string[])".into(),
                Some("Rec".into()),
                FrameKind::Managed
            )
        );
        assert_eq!(
            n(
                "instance void [System.Private.CoreLib] System.Collections.Generic.List`1[System.__Canon]::Add(!0)[QuickJitted]"
            ),
            (
                "System.Collections.Generic.List`1[System.__Canon]::Add(!0)".into(),
                Some("System.Private.CoreLib".into()),
                FrameKind::Managed
            )
        );
        assert_eq!(
            n("int32 [Rec] Rec::Down(int32,int32)"),
            (
                "Rec::Down(int32,int32)".into(),
                Some("Rec".into()),
                FrameKind::Managed
            )
        );
        assert_eq!(
            n("stub<1> AllocateTemporaryEntryPoints<PreJit>"),
            (
                "stub<1> AllocateTemporaryEntryPoints<PreJit>".into(),
                None,
                FrameKind::Jit
            )
        );
    }

    fn tier(raw: &str) -> Option<String> {
        parse_name(raw).tier
    }

    #[test]
    fn coreclr_names_keep_the_tier_and_the_raw_name() {
        let raw = "int32 [Calls] Calls::Spin(int32)[OptimizedTier1OSR]";
        let p = parse_name(raw);
        assert_eq!(p.name, "Calls::Spin(int32)");
        assert_eq!(p.tier.as_deref(), Some("OptimizedTier1OSR"));
        assert_eq!(p.system_name.as_deref(), Some(raw));
        for t in [
            "QuickJitted",
            "InstrumentedTier",
            "InstrumentedTierOptimized",
            "OptimizedTier1",
            "Optimized",
            "MinOptJitted",
            "PreJIT",
            "ReadyToRun",
        ] {
            let raw = format!("void [Rec] Rec::Main(string[])[{t}]");
            assert_eq!(tier(&raw).as_deref(), Some(t), "{raw}");
            assert_eq!(parse_name(&raw).name, "Rec::Main(string[])");
        }
        // No tier (CoreCLR 3.1 without tiered compilation writes none), an empty one.
        assert_eq!(tier("int32 [Rec] Rec::Down(int32,int32)"), None);
        assert_eq!(tier("int32 [Rec] Rec::Down(int32,int32)[]"), None);
        // A generic type's brackets are not a tier.
        assert_eq!(
            tier(
                "instance void [System.Private.CoreLib] System.Collections.Generic.List`1[System.__Canon]::Add(!0)"
            ),
            None
        );
        // Other runtimes' names have no tier or system name.
        for raw in [
            "JS:*fib /tmp/x.js:3:13",
            "Rec:Main (string[])",
            "void Rec.down(int, int)",
        ] {
            let p = parse_name(raw);
            assert_eq!((p.tier, p.system_name), (None, None), "{raw}");
        }
        assert_eq!(
            parse_name("stub<1> AllocateTemporaryEntryPoints<PreJit>").tier,
            None
        );
    }

    #[test]
    fn coreclr_async_methods_are_named_as_written() {
        // mcs's state machines, as the .NET 8 perf map names them.
        let raw = "instance void [Async] Rootline.Tests.Async+<Level>c__async0::MoveNext()[OptimizedTier1]";
        let p = parse_name(raw);
        assert_eq!(p.name, "Rootline.Tests.Async::Level");
        assert_eq!(p.module.as_deref(), Some("Async"));
        assert_eq!(p.system_name.as_deref(), Some(raw));
        assert_eq!(p.tier.as_deref(), Some("OptimizedTier1"));
        assert_eq!(p.kind, FrameKind::Managed);
        assert_eq!(
            n("instance void [Async] Rootline.Tests.Async+Nested`1+<Generic>c__async0`1[System.__Canon,System.Int32]::MoveNext()[QuickJitted]").0,
            "Rootline.Tests.Async+Nested`1[System.__Canon]::Generic"
        );
        // Roslyn's.
        assert_eq!(
            n("instance void [App] App.Worker+<Level>d__3::MoveNext()[OptimizedTier1]").0,
            "App.Worker::Level"
        );
        assert_eq!(
            n("instance void [App] App.Worker+<Level>d__3`1[System.Int32]::MoveNext()").0,
            "App.Worker::Level"
        );
        // Not a state machine's MoveNext, or a lambda's: left as written.
        for (raw, name) in [
            (
                "instance bool [System.Private.CoreLib] System.Collections.Generic.List`1+Enumerator[System.__Canon]::MoveNext()[OptimizedTier1]",
                "System.Collections.Generic.List`1+Enumerator[System.__Canon]::MoveNext()",
            ),
            (
                "instance void [App] App.Worker+<>c__DisplayClass0_0::<Main>b__0()[QuickJitted]",
                "App.Worker+<>c__DisplayClass0_0::<Main>b__0()",
            ),
            (
                "instance void [App] App.Worker+<>c+<<Main>b__0_0>d::MoveNext()[QuickJitted]",
                "App.Worker+<>c+<<Main>b__0_0>d::MoveNext()",
            ),
            (
                "instance void [Async] Rootline.Tests.Async+<Main>c__AnonStorey7+<Main>c__async6::MoveNext()[QuickJitted]",
                "Rootline.Tests.Async+<Main>c__AnonStorey7+<Main>c__async6::MoveNext()",
            ),
            (
                "void [System.Private.CoreLib] System.Runtime.CompilerServices.AsyncMethodBuilderCore::Start(!!0&)[OptimizedTier1]",
                "System.Runtime.CompilerServices.AsyncMethodBuilderCore::Start(!!0&)",
            ),
            (
                "instance void [System.Private.CoreLib] System.Runtime.CompilerServices.AsyncTaskMethodBuilder`1[System.Int32]::Start(!!0&)[QuickJitted]",
                "System.Runtime.CompilerServices.AsyncTaskMethodBuilder`1[System.Int32]::Start(!!0&)",
            ),
        ] {
            assert_eq!(n(raw).0, name);
        }
    }

    #[test]
    fn mono_v8_and_hotspot_names() {
        assert_eq!(
            n("Rec:Main (string[])"),
            ("Rec:Main (string[])".into(), None, FrameKind::Managed)
        );
        let js = parse_name("JS:*fib /tmp/x.js:3:13");
        assert_eq!(js.name, "fib");
        assert_eq!(js.file.as_deref(), Some("/tmp/x.js:3:13"));
        assert_eq!(js.kind, FrameKind::Managed);
        assert_eq!(
            parse_name("LazyCompile:~ /tmp/x.js:1:1").name,
            "(anonymous)"
        );
        assert_eq!(n("Builtin:ArgumentsAdaptorTrampoline").2, FrameKind::Jit);
        assert_eq!(
            n("void Rec.down(int, int)"),
            ("Rec.down(int, int)".into(), None, FrameKind::Managed)
        );
        assert_eq!(
            n("Rec::down (3 bytes)"),
            ("Rec::down (3 bytes)".into(), None, FrameKind::Managed)
        );
        assert_eq!(
            n("Interpreter"),
            ("[interpreted Java]".into(), None, FrameKind::Jit)
        );
        assert!(!parse_name("Interpreter").single_function);
        assert!(parse_name("Interpreter").pushed_returns);
        assert!(!parse_name("StubRoutines (1)").single_function);
        assert!(!parse_name("stub<1> AllocateTemporaryEntryPoints<PRECODE_FIXUP>").single_function);
        assert!(parse_name("Builtin:ArgumentsAdaptorTrampoline").single_function);
        assert!(parse_name("void Rec.down(int, int)").single_function);
        assert_eq!(n("generic_trampoline_jit").2, FrameKind::Jit);
    }
}
