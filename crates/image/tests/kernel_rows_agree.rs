//! The rows compiled for the in-kernel walk (`rootline_unwind::kernel_rows`) against the
//! unwinder's own lookup, on real binaries: wherever a row gives a rule (CFA from rsp or rbp, or
//! the thread's root), the unwinder must find the same rule at that row's first and last
//! address, and wherever the table has a gap, the unwinder must find no CFI. A disagreement
//! would make the kernel read other stack words than the unwinder then needs (or stop where
//! it goes on), and would forbid answering the unwinder's lookups from the table.

use std::fs::File;

mod common;

use rootline_image::{CodeModule, ModuleBudget};
use rootline_unwind::Binary;
use rootline_unwind::cfi::RowClass;
use rootline_unwind::frame_rule::{CfaBase, FrameRule};
use rootline_unwind::full::{Evaluator, RowAt};
use rootline_unwind::kernel_rows::{KernelRow, RowKind, kernel_rows};

/// The rule a row of the table stands for, when it has one.
fn rule_of(row: &KernelRow) -> Option<FrameRule> {
    let rbp_at = (row.rbp_offset != 0).then_some(i32::from(row.rbp_offset));
    match row.kind {
        RowKind::Root => Some(FrameRule::Root),
        RowKind::Rsp => Some(FrameRule::Cfa {
            base: CfaBase::Rsp,
            offset: row.cfa_offset,
            rbp_at,
        }),
        RowKind::Rbp => Some(FrameRule::Cfa {
            base: CfaBase::Rbp,
            offset: row.cfa_offset,
            rbp_at,
        }),
        RowKind::None | RowKind::Plt | RowKind::Stop => None,
    }
}

/// Checks every row of `path`'s table; returns how many addresses were compared.
fn check(path: &str) -> usize {
    let file = File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let module = CodeModule::open(path, file, &ModuleBudget::new(), None)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let sections = module.unwind_sections();
    let rows = kernel_rows(sections);
    assert!(rows.len() > 100, "{path}: {} rows", rows.len());
    // The table is compiled from .eh_frame when it has FDEs, else from .debug_frame.
    let debug = sections.fde_counts().0 == 0;
    let mut evaluator = Evaluator::default();
    let mut compared = 0;
    let mut wrong = Vec::new();
    for pair in rows.windows(2) {
        let (row, next) = (pair[0], pair[1]);
        for svma in [row.svma, next.svma - 1] {
            let class = sections.row_class(debug, svma);
            match (row.kind, rule_of(&row)) {
                (RowKind::None, _) => {
                    if class.is_some() {
                        wrong.push(format!(
                            "{svma:#x}: a gap in the table, CFI to the unwinder"
                        ));
                    }
                }
                (_, Some(expected)) => {
                    let found = match class {
                        Some(RowClass::FrameRegisters) => evaluator.frame_rule(RowAt {
                            sections,
                            debug,
                            svma,
                        }),
                        _ => None,
                    };
                    if found != Some(expected) {
                        wrong.push(format!(
                            "{svma:#x}: table {expected:?}, unwinder {class:?} {found:?}"
                        ));
                    }
                }
                // Rules the walk does not run: it stops there, whatever the unwinder finds.
                (_, None) => {}
            }
            compared += 1;
        }
    }
    assert!(
        wrong.is_empty(),
        "{path}: {} of {compared} addresses disagree, e.g. {:#?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    compared
}

#[test]
fn the_kernel_rows_of_libc_agree_with_the_unwinder() {
    assert!(check("/lib/x86_64-linux-gnu/libc.so.6") > 10_000);
}

#[test]
fn the_kernel_rows_of_the_dynamic_loader_agree_with_the_unwinder() {
    assert!(check("/lib64/ld-linux-x86-64.so.2") > 1_000);
}

#[test]
fn the_kernel_rows_of_a_rust_executable_agree_with_the_unwinder() {
    // This test's own executable: rustc's code, std's, and its C dependencies'.
    assert!(check("/proc/self/exe") > 10_000);
}

#[test]
fn the_kernel_rows_of_the_compilers_libraries_agree_with_the_unwinder() {
    // rustc's own code and LLVM's, as the toolchain building this test ships them.
    common::check_compiler_libraries(check);
}
