//! The committed BPF objects (embedded, so building needs no clang) are what their sources compile
//! to: each rebuilt with the one command every object in `bpf/` is built with (written at the top
//! of each source) when clang, llvm-strip and the libbpf headers are installed (scripts/test.sh
//! installs them), and compared byte for byte.

use std::path::Path;
use std::process::Command;

/// The clang flags of every object, before `-c SOURCE -o OBJECT`; the object is then stripped of
/// its DWARF with `llvm-strip -g` (its BTF stays). `-fdebug-compilation-dir=.` keeps the
/// checkout's path out of the BTF line info, so any clone builds the same bytes.
const CLANG_FLAGS: [&str; 7] = [
    "-O2",
    "-g",
    "-target",
    "bpf",
    "-D__TARGET_ARCH_x86",
    "-fdebug-compilation-dir=.",
    "-I/usr/include/x86_64-linux-gnu",
];

/// Rebuilds `bpf/NAME.bpf.c` and compares it with the committed `bpf/NAME.bpf.o`.
fn check(name: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("bpf");
    let source = format!("{name}.bpf.c");
    let text = std::fs::read_to_string(dir.join(&source)).expect("reads the source");
    // The source documents the same command.
    let documented: String = text
        .lines()
        .take_while(|l| l.starts_with("//"))
        .map(|l| l.trim_start_matches("//").trim().trim_end_matches('\\'))
        .collect::<Vec<_>>()
        .join(" ");
    let documented = documented.split_whitespace().collect::<Vec<_>>().join(" ");
    let expected = format!(
        "clang {} -c {source} -o {name}.bpf.o && llvm-strip -g {name}.bpf.o",
        CLANG_FLAGS.join(" ")
    );
    assert!(
        documented.contains(&expected),
        "{source} should document its build as `{expected}`"
    );
    let have = |tool: &str| Command::new(tool).arg("--version").output().is_ok();
    if !have("clang")
        || !have("llvm-strip")
        || !Path::new("/usr/include/bpf/bpf_helpers.h").exists()
    {
        if std::env::var_os("CI").is_some() {
            panic!(
                "clang, llvm-strip and libbpf-dev are needed to check the BPF objects \
                 (scripts/test.sh installs them)"
            );
        }
        eprintln!("skipped: clang, llvm-strip or libbpf-dev not installed");
        return;
    }
    let out = tempfile::tempdir().expect("temp dir");
    let object = out.path().join(format!("{name}.bpf.o"));
    let built = Command::new("clang")
        .current_dir(&dir)
        .args(CLANG_FLAGS)
        .arg("-c")
        .arg(&source)
        .arg("-o")
        .arg(&object)
        .output()
        .expect("runs clang");
    assert!(
        built.status.success(),
        "clang failed on {source}: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let status = Command::new("llvm-strip")
        .arg("-g")
        .arg(&object)
        .status()
        .expect("runs llvm-strip");
    assert!(status.success(), "llvm-strip failed on {name}.bpf.o");
    let built = std::fs::read(&object).expect("reads the built object");
    let committed =
        std::fs::read(dir.join(format!("{name}.bpf.o"))).expect("reads the committed object");
    assert!(
        built == committed,
        "crates/capture/bpf/{name}.bpf.o is stale: rebuild it with the command at the top of \
         {source}"
    );
}

#[test]
fn the_committed_stack_walk_object_matches_its_source() {
    check("stack_walk");
}

#[test]
fn the_committed_alloc_sampler_object_matches_its_source() {
    check("alloc_sample");
}
