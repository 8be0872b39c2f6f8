//! Names from JIT maps, as each runtime writes them, turned into a function name, a module and a
//! frame kind.
//!
//! - CoreCLR: `void [Rec] Rec::Main(string[])[Optimized]` → `Rec::Main(string[])` in module `Rec`
//!   (return type and code tier dropped); its stubs (`stub<1> …`) have no module.
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
        }
    }
}
/// The name of a frame in HotSpot's interpreter (the perf map's `Interpreter` blob).
pub const INTERPRETED_JAVA: &str = "[interpreted Java]";

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
    if name.ends_with(']')
        && let Some(open) = name.rfind('[')
        && name[..open].ends_with(')')
    {
        name = &name[..open];
    }
    Some(JitName {
        name: name.to_string(),
        module: Some(raw[module_start..module_end].to_string()),
        file: None,
        kind: FrameKind::Managed,
        single_function: true,
        pushed_returns: false,
        precompiled: false,
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
