//! What several of these tests share.

use std::path::PathBuf;

/// rustc's own code and LLVM's, as the toolchain building the tests ships them
/// (`librustc_driver-*.so`, and `libLLVM*.so` where it is a library, not a linker script).
pub fn compiler_libraries() -> Vec<PathBuf> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = std::process::Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .expect("rustc runs");
    let lib = std::path::Path::new(String::from_utf8_lossy(&sysroot.stdout).trim()).join("lib");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&lib).expect("the toolchain's lib directory") {
        let path = entry.expect("an entry").path();
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        // libLLVM-*.so is a linker script naming the library: only files of a megabyte or more.
        let big = std::fs::metadata(&path).is_ok_and(|m| m.len() >= 1 << 20);
        if (name.starts_with("librustc_driver-") || name.starts_with("libLLVM")) && big {
            found.push(path);
        }
    }
    found
}

/// Runs `check` (which returns how many addresses it compared) on each of
/// [`compiler_libraries`], saying how long each took; there must be at least one.
pub fn check_compiler_libraries(check: impl Fn(&str) -> usize) {
    let libraries = compiler_libraries();
    for path in &libraries {
        let t = std::time::Instant::now();
        let n = check(&path.to_string_lossy());
        eprintln!("{}: {n} addresses in {:?}", path.display(), t.elapsed());
    }
    assert!(!libraries.is_empty(), "no librustc_driver in the toolchain");
}
