//! Names of inlined frames, from real compiled programs: a Rust program whose two functions each
//! inline two closures (rustc, full debug info, opt-level 2), and a C++ program inlining methods
//! of the same name from two namespaces (g++ -O2 -g). Every address of the out-of-line functions
//! is symbolized; the inlined frames must carry qualified names, and distinct functions distinct
//! names.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use rootline_capture::symbolize::Symbolizer;

const RUST: &str = r#"
#[inline(never)]
fn alpha(v: &[u64]) -> u64 {
    v.iter().map(|x| x.wrapping_mul(3) ^ 7).fold(0, |a, b| a.wrapping_add(b))
}
#[inline(never)]
fn beta(v: &[u64]) -> u64 {
    v.iter().map(|x| x.wrapping_mul(5) >> 1).fold(1, |a, b| a ^ b)
}
fn main() {
    let v: Vec<u64> = (0..std::env::args().count() as u64 * 1000).collect();
    println!("{}", alpha(&v) + beta(&v));
}
"#;

const CPP: &str = r#"
#include <cstdio>
namespace red { struct Acc { long v; long step(long x) { return v = v * 31 + x; } }; }
namespace blue { struct Acc { long v; long step(long x) { return v = (v ^ x) * 17; } }; }
__attribute__((noinline)) long work(long n) {
    red::Acc r{1}; blue::Acc b{2};
    for (long i = 0; i < n; i++) { r.step(i); b.step(i); }
    return r.v + b.v;
}
int main(int argc, char **) { std::printf("%ld\n", work(argc * 1000)); }
"#;

/// Compiles `source` with `compiler` and `args` into the test target directory as `name`.
fn build(compiler: &str, source: &str, ext: &str, name: &str, args: &[&str]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let src = dir.join(format!("{name}.{ext}"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(name);
    let status = Command::new(compiler)
        .args(args)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("{compiler} runs: {e}"));
    assert!(status.success(), "{compiler} failed on {name}");
    out
}

/// Start and size of the defined function symbols whose demangled name ends with `suffix`.
fn function(exe: &Path, suffix: &str) -> (u64, u64) {
    let out = Command::new("nm")
        .args(["-S", "-C", "--defined-only"])
        .arg(exe)
        .output()
        .expect("nm runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let found: Vec<(u64, u64)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(4, ' ');
            let (addr, size, kind, name) = (f.next()?, f.next()?, f.next()?, f.next()?);
            let name = name.rsplit_once("::h").map_or(name, |(n, _)| n);
            (kind.eq_ignore_ascii_case("t") && name.ends_with(suffix)).then(|| {
                (
                    u64::from_str_radix(addr, 16).unwrap(),
                    u64::from_str_radix(size, 16).unwrap(),
                )
            })
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one function {suffix} in {exe:?}: {found:?}"
    );
    found[0]
}

/// The names of the inlined frames (all but the physical) at every address of the function.
fn inlined_names(exe: &Path, (start, size): (u64, u64)) -> BTreeSet<String> {
    let mut s = Symbolizer::new();
    let addrs: Vec<u64> = (start..start + size).collect();
    s.symbolize_file(exe, None, true, &addrs, |_| None, |_| None)
        .into_iter()
        .flat_map(|frames| frames.into_iter().skip(1).map(|f| f.name))
        .collect()
}

#[test]
fn rust_closures_inlined_into_two_functions_have_distinct_qualified_names() {
    let exe = build(
        "rustc",
        RUST,
        "rs",
        "closures",
        &[
            "-C",
            "debuginfo=2",
            "-C",
            "opt-level=2",
            "--crate-name",
            "closures",
        ],
    );
    let alpha = inlined_names(&exe, function(&exe, "closures::alpha"));
    let beta = inlined_names(&exe, function(&exe, "closures::beta"));
    for (f, names) in [("alpha", &alpha), ("beta", &beta)] {
        for n in 0..2 {
            let closure = format!("closures::{f}::{{closure#{n}}}");
            assert!(names.contains(&closure), "{closure} in {names:#?}");
        }
        for name in names {
            assert!(
                name.contains("::"),
                "an inlined frame of {f} has a bare name: {name}"
            );
            assert!(
                !name.contains("{{closure}}"),
                "an unnumbered closure: {name}"
            );
            let other = if f == "alpha" { "beta" } else { "alpha" };
            assert!(
                !name.contains(&format!("closures::{other}::")),
                "{f} inlines {name}"
            );
        }
    }
    // Library helpers are qualified: the integer methods carry their type.
    assert!(
        alpha.iter().any(|n| n.ends_with("u64>::wrapping_mul")),
        "{alpha:#?}"
    );
}

#[test]
fn cpp_methods_of_the_same_name_in_two_namespaces_stay_apart() {
    let exe = build("g++", CPP, "cpp", "namespaces", &["-O2", "-g"]);
    let names = inlined_names(&exe, function(&exe, "work(long)"));
    assert!(names.contains("red::Acc::step(long)"), "{names:#?}");
    assert!(names.contains("blue::Acc::step(long)"), "{names:#?}");
    assert!(
        names.iter().all(|n| n.contains("::")),
        "bare names among {names:#?}"
    );
}
