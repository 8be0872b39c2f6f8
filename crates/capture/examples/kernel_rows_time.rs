//! Times loading a binary and compiling its rows for the in-kernel walk:
//! `cargo run --release -p rootline-capture --example kernel_rows_time -- FILE`.
use std::time::Instant;

use rootline_image::{CodeModule, ModuleBudget};
use rootline_unwind::Binary;

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: kernel_rows_time FILE");
    let start = Instant::now();
    let file = std::fs::File::open(&path).expect("opens the file");
    let module = CodeModule::open(&path, file, &ModuleBudget::new(), None).expect("parses");
    let parsed = start.elapsed();
    let start = Instant::now();
    let rows = rootline_unwind::kernel_rows::kernel_rows(module.unwind_sections());
    println!(
        "{path}: parsed in {parsed:?}; {} rows compiled in {:?}",
        rows.len(),
        start.elapsed()
    );
}
