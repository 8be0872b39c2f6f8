//! The committed BPF object is what its source compiles to: rebuilt with clang (when installed)
//! and compared byte for byte.

use std::path::Path;
use std::process::Command;

#[test]
fn the_committed_stack_walk_object_matches_its_source() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("bpf");
    let have = |tool: &str| Command::new(tool).arg("--version").output().is_ok();
    if !have("clang") || !have("llvm-strip") {
        if std::env::var_os("CI").is_some() {
            panic!(
                "clang and llvm-strip are needed to check the BPF object (scripts/test.sh installs them)"
            );
        }
        eprintln!("skipped: clang or llvm-strip not installed");
        return;
    }
    let out = tempfile::tempdir().expect("temp dir");
    let object = out.path().join("stack_walk.bpf.o");
    let status = Command::new("clang")
        .current_dir(&dir)
        .args([
            "-O2",
            "-g",
            "-target",
            "bpf",
            "-I/usr/include/x86_64-linux-gnu",
            "-c",
        ])
        .arg("stack_walk.bpf.c")
        .arg("-o")
        .arg(&object)
        .status()
        .expect("runs clang");
    assert!(status.success(), "clang failed on stack_walk.bpf.c");
    let status = Command::new("llvm-strip")
        .arg("-g")
        .arg(&object)
        .status()
        .expect("runs llvm-strip");
    assert!(status.success());
    let built = std::fs::read(&object).expect("reads the built object");
    let committed =
        std::fs::read(dir.join("stack_walk.bpf.o")).expect("reads the committed object");
    assert!(
        built == committed,
        "crates/capture/bpf/stack_walk.bpf.o is stale: rebuild it with the command at the top of \
         stack_walk.bpf.c"
    );
}
