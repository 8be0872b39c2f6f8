//! Builds the LD_PRELOAD allocation sampler (`shim/alloc_shim.c`) into a shared library that the
//! recorder embeds and writes out when `record --alloc` launches a command.

use std::path::PathBuf;

fn main() {
    let src = "shim/alloc_shim.c";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let lib = out.join("librootline_alloc.so");
    let compiler = cc::Build::new().opt_level(2).pic(true).get_compiler();
    let status = compiler
        .to_command()
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-fvisibility=hidden",
            "-fasynchronous-unwind-tables",
            "-Wall",
            "-o",
        ])
        .arg(&lib)
        .arg(src)
        .args(["-ldl", "-lm"])
        .status()
        .expect("a C compiler (gcc) builds the allocation sampler");
    assert!(status.success(), "compiling {src} failed");
}
