//! Measures what loading a module costs the unwinder: parsing the ELF file with its CFI index
//! (every FDE walked and every row classified for the fast walk or the full-register evaluator),
//! against a bare walk of the FDEs, and the memory the module keeps.
//!
//! Usage: module_load FILE [ROUNDS] [--list]   (`--list`: print the full-register ranges)

use std::sync::Arc;
use std::time::Instant;

use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection};
use object::{Object, ObjectSection};
use rootline_image::{CodeModule, ModuleBudget};
use rootline_unwind::cfi::CfiIndex;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: module_load FILE [ROUNDS]");
        std::process::exit(2);
    };
    let rounds: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(5);
    let bytes: Arc<[u8]> = match std::fs::read(&path) {
        Ok(b) => b.into(),
        Err(e) => {
            eprintln!("cannot read {path}: {e}");
            std::process::exit(1);
        }
    };
    let best = |f: &mut dyn FnMut()| {
        (0..rounds)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e3
            })
            .fold(f64::INFINITY, f64::min)
    };
    let mut walked = 0usize;
    let walk_ms = best(&mut || walked = walk_fdes(&bytes));
    let mut indexed = 0usize;
    let index_ms = best(&mut || indexed = index_fdes(&bytes));
    let mut module = None;
    let parse_ms = best(&mut || {
        module = None; // the previous round's module is freed first
        module = std::fs::File::open(&path)
            .ok()
            .and_then(|f| CodeModule::open(&path, f, &ModuleBudget::new(), None).ok());
    });
    let Some(module) = module else {
        eprintln!("{path} is not an ELF file");
        std::process::exit(1);
    };
    let (eh, debug) = module.fde_counts();
    let full = module.full_register_ranges();
    println!(
        "{path}: {} MB, {eh} .eh_frame FDEs + {debug} .debug_frame FDEs ({walked} walked), \
         full-register ranges: {}; whole parse {parse_ms:.1} ms, of which .eh_frame index with \
         rows classified {index_ms:.1} ms ({indexed} FDEs); bare FDE walk {walk_ms:.1} ms; \
         module memory {:.1} MB",
        bytes.len() >> 20,
        full.len(),
        module.heap_bytes() as f64 / 1e6,
    );
    println!("  {module:?}");
    if args.next().as_deref() == Some("--list") {
        for (start, end) in full {
            let name = module.symbol_name(start).unwrap_or_else(|| "?".into());
            println!("  {start:#x}..{end:#x} {name}");
        }
    }
}

/// The `.eh_frame` index the unwinder builds (FDEs and row classification).
fn index_fdes(bytes: &[u8]) -> usize {
    let Ok(file) = object::File::parse(bytes) else {
        return 0;
    };
    let Some(s) = file.section_by_name(".eh_frame") else {
        return 0;
    };
    let Ok(data) = s.data() else {
        return 0;
    };
    let section = EhFrame::new(data, LittleEndian);
    let bases = BaseAddresses::default().set_eh_frame(s.address());
    CfiIndex::build(&section, &bases).len()
}

/// The FDE walk alone (no rows), as the index did before rows were classified.
fn walk_fdes(bytes: &[u8]) -> usize {
    let Ok(file) = object::File::parse(bytes) else {
        return 0;
    };
    let Some(s) = file.section_by_name(".eh_frame") else {
        return 0;
    };
    let Ok(data) = s.data() else {
        return 0;
    };
    let section = EhFrame::new(data, LittleEndian);
    let bases = BaseAddresses::default().set_eh_frame(s.address());
    let mut entries = section.entries(&bases);
    let mut n = 0;
    while let Ok(Some(entry)) = entries.next() {
        if let CieOrFde::Fde(p) = entry
            && p.parse(EhFrame::cie_from_offset).is_ok()
        {
            n += 1;
        }
    }
    n
}
