//! The memory a process's JIT state holds — the symbols of its perf map and jitdump file, the
//! precompiled methods looked up, cached code and frame rules — counted in the module memory
//! (the recorder's [`rootline_image::ModuleBudget`]) next to the binaries'.
//!
//! Under a module budget the caches go first; symbol tables that still do not fit are let go,
//! and the process's code without a file image then ends its stacks with
//! `[truncated: module-memory-limit]` (see [`JitProcess::code_refused`]) until the budget has
//! room again, when its maps are read again from the start.

use rootline_image::TableCharge;

use super::JitProcess;

/// Memory one cached frame rule takes (its key, rule and the map's slack).
const RULE_BYTES: usize = 64;

impl JitProcess {
    /// Memory of the symbol tables (perf map, jitdump, precompiled methods looked up).
    fn table_bytes(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.symbols.heap_bytes())
            + self.dump.as_ref().map_or(0, |d| d.symbols.heap_bytes())
            + self.precompiled.heap_bytes()
    }

    /// Memory of the caches (function code, frame rules).
    fn cache_bytes(&self) -> usize {
        self.code_bytes + self.rules.len() * RULE_BYTES
    }

    /// Memory the process's JIT state holds, in bytes (its ReadyToRun images are counted by the
    /// image cache they are shared through).
    pub fn heap_bytes(&self) -> usize {
        self.table_bytes() + self.cache_bytes()
    }

    /// Counts the state's memory again after it changed. Under a budget it must fit next to
    /// every other module: the caches are emptied first, then the symbol tables let go.
    pub(super) fn account(&mut self) {
        let total = self.heap_bytes();
        if self.charge.as_ref().map_or(0, TableCharge::bytes) == total {
            return;
        }
        // Our own count is not in the way of the check.
        self.charge = None;
        let Some(budget) = self.budget else {
            self.charge = Some(self.modules.charge(total));
            return;
        };
        if !self.modules.fits(total, budget) {
            self.code.clear();
            self.code_bytes = 0;
            self.rules.clear();
            let tables = self.table_bytes();
            if !self.modules.fits(tables, budget) {
                self.refuse_tables(tables);
                return;
            }
        }
        self.charge = Some(self.modules.charge(self.heap_bytes()));
    }

    /// Lets go of every table (the maps are read again from the start once there is room).
    fn refuse_tables(&mut self, needed: usize) {
        self.tables_refused = Some(needed);
        self.map = None;
        self.dump = None;
        self.info = None;
        self.images_done = 0;
        self.images.clear();
        self.refused_images.clear();
        self.precompiled = Default::default();
        self.code.clear();
        self.code_bytes = 0;
        self.rules.clear();
        self.last_open_try = None;
        self.last_read = None;
    }

    /// Whether the tables were let go for the budget and there is still no room for them: then
    /// nothing is read. Once there is room, reading starts over.
    pub(super) fn tables_still_refused(&mut self) -> bool {
        let Some(needed) = self.tables_refused else {
            return false;
        };
        if self
            .budget
            .is_some_and(|budget| !self.modules.fits(needed, budget))
        {
            return true;
        }
        self.tables_refused = None;
        false
    }

    /// Whether `addr` (code without a file image the unwinder reads) cannot be unwound exactly
    /// for the module budget: the process's JIT tables were let go, or `addr` lies in a
    /// ReadyToRun image that was refused ([`JitProcess::image_refused`]).
    pub fn code_refused(&mut self, addr: u64) -> bool {
        self.tables_refused.is_some() || self.image_refused(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ImageCache, namespace_pid};
    use super::*;
    use rootline_image::PAGE_CACHE_BYTES;

    #[test]
    fn jit_tables_past_the_budget_are_let_go_and_read_again_once_there_is_room() {
        let me = std::process::id();
        let path = format!("/tmp/perf-{}.map", namespace_pid(me));
        let map: String = (0..2000u64)
            .map(|i| {
                format!(
                    "{:x} 10 LazyCompile:*fn_{i} /app/x.js:{i}:1\n",
                    0x10000 + i * 0x10
                )
            })
            .collect();
        std::fs::write(&path, map).unwrap();
        // No room at all: the tables are read, then let go.
        let mut p = JitProcess::new(me, ImageCache::default(), Some(PAGE_CACHE_BYTES));
        let found = p.symbol(0x10015).is_some();
        let refused = p.code_refused(0x10015);
        let held = p.heap_bytes();
        // Room: read again from the start.
        p.budget = Some(usize::MAX / 2);
        let name = p.symbol(0x10015).map(|s| s.name.name.clone());
        let _ = std::fs::remove_file(&path);
        assert!(!found && refused, "JIT code past the budget is refused");
        assert_eq!(held, 0, "nothing is held for a refused process");
        assert_eq!(name.as_deref(), Some("fn_1"));
        assert!(!p.code_refused(0x10015));
        assert!(p.heap_bytes() > 2000 * 64, "{} bytes", p.heap_bytes());
        assert_eq!(
            p.charge.as_ref().map(TableCharge::bytes),
            Some(p.heap_bytes())
        );
    }
}
