//! Methods named as the user wrote them, and the runtime's code tiers.
//!
//! A C# `async` method (or iterator) compiles to a state machine: a nested type named after the
//! method, whose `MoveNext` runs the method's body. Its frames read `Async+<Level>d__3::MoveNext()`
//! (Roslyn) or `Async+<Level>c__async0::MoveNext()` (Mono's `mcs`); [`state_machine_method`]
//! turns the state machine's type into the method the user wrote: `Async` and `Level`.
//!
//! Left alone, because no single user method is meant: lambdas and their closure classes
//! (`<>c__DisplayClass0_0`, `<Main>b__0_0`, `mcs`'s `<Main>c__AnonStorey7::<>m__0`), async lambdas
//! and local functions (whose state machines sit in a closure class or are named after a
//! generated method, `<<Main>b__0_0>d`), and the runtime's async plumbing
//! (`AsyncMethodBuilderCore::Start`, `AsyncTaskMethodBuilder…`), which are real frames.

/// The method a state machine type stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateMachineMethod {
    /// The type that declares the method, with its generic arguments when the state machine's
    /// type lists them: `Rootline.Tests.Async`, ``Outer+Nested`1[System.__Canon]``.
    pub declaring_type: String,
    /// The method's name as written: `Level`.
    pub method: String,
}

/// The method whose body the state machine type `type_name` runs, when `type_name` is an `async`
/// method's or iterator's state machine (`Ns.Type+<Method>d__N`, ``…+<Method>d__N`1[args]``,
/// `…+<Method>c__asyncN`, `…+<Method>c__IteratorN`) nested in a type the user wrote. Generic
/// arguments of the method itself (after those of the declaring type) are dropped, as the
/// runtime's own names drop them.
pub fn state_machine_method(type_name: &str) -> Option<StateMachineMethod> {
    let (type_path, args) = split_instantiation(type_name)?;
    let plus = last_nested(type_path)?;
    let (outer, inner) = (&type_path[..plus], &type_path[plus + 1..]);
    let last_outer = outer.rsplit('+').next().unwrap_or(outer);
    if outer.is_empty() || last_outer.is_empty() || last_outer.starts_with('<') {
        return None;
    }
    let inner = inner.split_once('`').map_or(inner, |(base, arity)| {
        if !arity.is_empty() && arity.bytes().all(|b| b.is_ascii_digit()) {
            base
        } else {
            inner
        }
    });
    let rest = inner.strip_prefix('<')?;
    let (method, kind) = rest.split_once('>')?;
    let plain = !method.is_empty()
        && method
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '@');
    let ordinal = ["d__", "c__async", "c__Iterator"]
        .iter()
        .find_map(|p| kind.strip_prefix(p))?;
    // Roslyn may add `#generation` or `_n` for edit-and-continue; the ordinal starts with a digit.
    if !plain || !ordinal.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let class_arity: usize = outer
        .split('+')
        .filter_map(|segment| segment.rsplit_once('`'))
        .filter_map(|(_, n)| n.parse::<usize>().ok())
        .sum();
    let declaring_type = match args {
        Some(args) if class_arity > 0 => {
            let args = split_arguments(args);
            if args.len() < class_arity || args.iter().any(|a| a.is_empty()) {
                return None;
            }
            format!("{outer}[{}]", args[..class_arity].join(","))
        }
        _ => outer.to_string(),
    };
    Some(StateMachineMethod {
        declaring_type,
        method: method.to_string(),
    })
}

/// `Type[args]` → (`Type`, `Some(args)`); `Type` → (`Type`, None). None when brackets do not
/// balance.
fn split_instantiation(type_name: &str) -> Option<(&str, Option<&str>)> {
    let Some(open) = type_name.find('[') else {
        return Some((type_name, None));
    };
    let inner = type_name[open + 1..].strip_suffix(']')?;
    let mut depth = 0i32;
    for c in inner.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            _ => {}
        }
        if depth < 0 {
            return None;
        }
    }
    (depth == 0).then_some((&type_name[..open], Some(inner)))
}

/// Byte index of the `+` before the innermost nested type of `path` (no brackets in `path`).
fn last_nested(path: &str) -> Option<usize> {
    path.rfind('+')
}

/// Top-level comma-separated arguments of an instantiation list.
fn split_arguments(args: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in args.char_indices() {
        match c {
            '[' | '<' => depth += 1,
            ']' | '>' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&args[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&args[start..]);
    out
}

/// The name of a code tier the runtime writes in `MethodLoad` events' `MethodFlags` (bits 7–9,
/// .NET 5 and later), spelled as its perf map spells it; None for 0 ("unknown": older runtimes,
/// precompiled code) and values the runtime does not define.
pub fn tier_from_method_flags(flags: u32) -> Option<&'static str> {
    Some(match (flags >> 7) & 0x7 {
        1 => "MinOptJitted",
        2 => "Optimized",
        3 => "QuickJitted",
        4 => "OptimizedTier1",
        5 => "OptimizedTier1OSR",
        6 => "InstrumentedTier",
        7 => "InstrumentedTierOptimized",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(type_name: &str) -> Option<(String, String)> {
        state_machine_method(type_name).map(|m| (m.declaring_type, m.method))
    }

    fn some(t: &str, m: &str) -> Option<(String, String)> {
        Some((t.to_string(), m.to_string()))
    }

    #[test]
    fn async_and_iterator_state_machines_name_their_method() {
        // Roslyn.
        assert_eq!(user("Async+<Level>d__3"), some("Async", "Level"));
        assert_eq!(
            user("My.App.Outer+Inner+<FetchAsync>d__12"),
            some("My.App.Outer+Inner", "FetchAsync")
        );
        // A generic method of a plain class: its own argument is dropped.
        assert_eq!(
            user("Async+<Level>d__3`1[System.Int32]"),
            some("Async", "Level")
        );
        // A generic class: its arguments stay on the class.
        assert_eq!(
            user("Box`1+<Get>d__2[System.__Canon]"),
            some("Box`1[System.__Canon]", "Get")
        );
        // mcs, as the .NET 8 perf map shows its code.
        assert_eq!(
            user("Rootline.Tests.Async+<Level>c__async0"),
            some("Rootline.Tests.Async", "Level")
        );
        assert_eq!(
            user("Rootline.Tests.Async+Nested`1+<Generic>c__async0`1[System.__Canon,System.Int32]"),
            some("Rootline.Tests.Async+Nested`1[System.__Canon]", "Generic")
        );
        assert_eq!(user("Seq+<Items>c__Iterator0"), some("Seq", "Items"));
        assert_eq!(
            user(
                "Dict`2+<Pairs>d__4[System.__Canon,System.Collections.Generic.List`1[System.Int32]]"
            ),
            some(
                "Dict`2[System.__Canon,System.Collections.Generic.List`1[System.Int32]]",
                "Pairs"
            )
        );
    }

    #[test]
    fn lambdas_closures_and_plumbing_are_left_alone() {
        for name in [
            "Async+<>c__DisplayClass0_0",
            "Async+<>c",
            // Async lambda / local function state machines: named after generated methods.
            "Async+<>c+<<Main>b__0_0>d",
            "Async+<<Main>g__Local|0_0>d",
            // mcs: an async lambda's state machine inside its closure class.
            "Rootline.Tests.Async+<Main>c__AnonStorey7+<Main>c__async6",
            "Rootline.Tests.Async+<Main>c__AnonStorey7",
            "System.Runtime.CompilerServices.AsyncMethodBuilderCore",
            "System.Runtime.CompilerServices.AsyncTaskMethodBuilder`1[System.Int32]",
            "<Level>d__3",
            "Async+<Level>x__3",
            "Async+<Level>d__",
            "Async+<Level>d__3[",
            "Async+<>d__3",
            "Box`1+<Get>d__2[]",
            "Box`2+<Get>d__2[System.Int32]",
        ] {
            assert_eq!(user(name), None, "{name}");
        }
    }

    #[test]
    fn tiers_from_method_flags() {
        assert_eq!(tier_from_method_flags(0x8), None);
        assert_eq!(tier_from_method_flags(3 << 7 | 0x8), Some("QuickJitted"));
        assert_eq!(tier_from_method_flags(4 << 7), Some("OptimizedTier1"));
        assert_eq!(
            tier_from_method_flags(5 << 7 | 0x4),
            Some("OptimizedTier1OSR")
        );
        assert_eq!(tier_from_method_flags(6 << 7), Some("InstrumentedTier"));
        assert_eq!(
            tier_from_method_flags(u32::MAX),
            Some("InstrumentedTierOptimized")
        );
    }
}
