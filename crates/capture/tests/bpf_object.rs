//! The committed BPF object of the `-p` allocation sampler (`bpf/alloc_sample.bpf.o`, embedded so
//! building needs no clang) is what its source compiles to: rebuilt with the command in the
//! source when clang and the libbpf headers are present (scripts/test.sh installs them).

use std::path::Path;
use std::process::Command;

#[test]
fn the_committed_alloc_sampler_object_matches_its_source() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("bpf");
    let source = dir.join("alloc_sample.bpf.c");
    let text = std::fs::read_to_string(&source).unwrap();
    // The rebuild command, as the source documents it.
    let command: String = text
        .lines()
        .skip_while(|l| !l.contains("clang -O2"))
        .take_while(|l| l.starts_with("//"))
        .map(|l| {
            l.trim_start_matches("//")
                .trim()
                .trim_end_matches('\\')
                .trim()
        })
        .collect::<Vec<_>>()
        .join(" ");
    assert!(command.starts_with("clang "), "{command:?}");
    let available = Command::new("clang").arg("--version").output().is_ok()
        && Path::new("/usr/include/bpf/bpf_helpers.h").exists();
    if !available {
        eprintln!("skipped: clang or libbpf-dev missing (apt-get install clang libbpf-dev)");
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let object = out.path().join("alloc_sample.bpf.o");
    let mut args: Vec<&str> = command.split_whitespace().skip(1).collect();
    let o = args.iter().position(|&a| a == "-o").unwrap();
    let object_arg = object.to_str().unwrap();
    args[o + 1] = object_arg;
    let built = Command::new("clang")
        .args(&args)
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let committed = std::fs::read(dir.join("alloc_sample.bpf.o")).unwrap();
    assert!(
        std::fs::read(&object).unwrap() == committed,
        "crates/capture/bpf/alloc_sample.bpf.o is stale: rebuild it with the command in {}",
        source.display()
    );
}
