//! A small C program built at test time with the system's `cc`: `main` calls `parse_input`,
//! `compute_totals` and `write_output` in turn, each spinning on arithmetic; `compute_totals` does
//! `totals_work` times the work of the other two, so two builds make a "before and after" pair
//! where one function's work changed.

use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCE: &str = r#"
#include <stdint.h>
volatile uint64_t sink;
static uint64_t spin(uint64_t n, uint64_t seed) {
    uint64_t x = seed;
    for (uint64_t i = 0; i < n; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x;
}
__attribute__((noinline)) void parse_input(uint64_t n) { sink += spin(n, 1); }
__attribute__((noinline)) void compute_totals(uint64_t n) { sink += spin(n * TOTALS_WORK, 2); }
__attribute__((noinline)) void write_output(uint64_t n) { sink += spin(n, 3); }
int main(void) {
    for (int round = 0; round < ROUNDS; round++) {
        parse_input(1000000);
        compute_totals(1000000);
        write_output(1000000);
    }
    return 0;
}
"#;

/// Builds the program as `dir/shop` with frame pointers and symbols; `rounds` rounds of work.
pub fn build(dir: &Path, totals_work: u32, rounds: u32) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let source = dir.join("shop.c");
    std::fs::write(&source, SOURCE).unwrap();
    let binary = dir.join("shop");
    let out = Command::new("cc")
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-fno-inline"])
        .arg(format!("-DTOTALS_WORK={totals_work}"))
        .arg(format!("-DROUNDS={rounds}"))
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .output()
        .expect("cc runs (scripts/test.sh installs gcc)");
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    binary
}
