//! The frame rules the unwinder keeps per FDE (`rootline_unwind::fde_rules`, read in one pass
//! over the FDE's rows) against what it found one address at a time before: the row's class
//! (`CfiIndex::row_class`, whether the fast walk may run it) and then that row's rule
//! (`Evaluator::frame_rule`, gimli running the rows up to the address). On real binaries, at the
//! first, middle and last address of every row of every FDE, and just past each FDE, the two
//! must find the same rule.

use std::collections::HashMap;
use std::fs::File;

mod common;

use gimli::{CieOrFde, EhFrame, LittleEndian, UnwindContext, UnwindSection};
use rootline_image::{CodeModule, ModuleBudget};
use rootline_unwind::Binary;
use rootline_unwind::cfi::RowClass;
use rootline_unwind::fde_rules::FdeRules;
use rootline_unwind::full::{Evaluator, RowAt};

/// Compares the two lookups over `path`'s `.eh_frame`; returns how many addresses were compared.
fn check(path: &str) -> usize {
    let file = File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let module = CodeModule::open(path, file, &ModuleBudget::new(), None)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let sections = module.unwind_sections();
    let bytes = sections.eh_frame_bytes().expect(".eh_frame");
    let section = EhFrame::new(bytes, LittleEndian);
    let bases = sections.cfi_bases(false);
    // Every row's first, middle and last address, and the address just past each FDE.
    let mut addresses = Vec::new();
    let mut ctx = UnwindContext::new();
    let mut entries = section.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else {
            continue;
        };
        addresses.push(fde.end_address());
        let Ok(mut rows) = fde.rows(&section, &bases, &mut ctx) else {
            continue;
        };
        while let Ok(Some(row)) = rows.next_row() {
            let (start, end) = (row.start_address(), row.end_address());
            if start < end {
                addresses.extend([start, start + (end - start) / 2, end - 1]);
            }
        }
    }
    assert!(
        addresses.len() > 1_000,
        "{path}: {} addresses",
        addresses.len()
    );
    let mut evaluator = Evaluator::default();
    let mut kept: HashMap<u64, Option<FdeRules>> = HashMap::new();
    let mut wrong = Vec::new();
    for &svma in &addresses {
        let at = RowAt {
            sections,
            debug: false,
            svma,
        };
        let one = match sections.row_class(false, svma) {
            Some(RowClass::FrameRegisters) => evaluator.frame_rule(at),
            _ => None,
        };
        let start = sections.cfi(false).fde_start_at(svma);
        let from_fde = match start {
            Some(_) if sections.cfi(false).is_signal_trampoline(svma) => None,
            Some(start) => kept
                .entry(start)
                .or_insert_with(|| evaluator.fde_rules(at))
                .as_ref()
                .and_then(|rules| rules.rule_at(svma)),
            None => None,
        };
        if one != from_fde {
            wrong.push(format!(
                "{svma:#x} (FDE at {start:x?}): one row {one:?}, its FDE's rules {from_fde:?}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{path}: {} of {} addresses disagree, e.g. {:#?}",
        wrong.len(),
        addresses.len(),
        &wrong[..wrong.len().min(10)]
    );
    addresses.len()
}

#[test]
fn an_fdes_rules_agree_with_one_rows_lookup_in_libc() {
    assert!(check("/lib/x86_64-linux-gnu/libc.so.6") > 10_000);
}

#[test]
fn an_fdes_rules_agree_with_one_rows_lookup_in_the_dynamic_loader() {
    assert!(check("/lib64/ld-linux-x86-64.so.2") > 1_000);
}

#[test]
fn an_fdes_rules_agree_with_one_rows_lookup_in_a_rust_executable() {
    // This test's own executable: rustc's code, std's, and its C dependencies'.
    assert!(check("/proc/self/exe") > 10_000);
}

#[test]
fn an_fdes_rules_agree_with_one_rows_lookup_in_the_compilers_libraries() {
    // Among them librustc_driver, whose FDEs end with rows covering no address.
    common::check_compiler_libraries(check);
}
