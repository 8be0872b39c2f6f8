//! The memory budget for binary images: one handle per owner (a recorder, an agent), shared by
//! everything that owner loads, so two owners in one process never share a count.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Most memory the code pages of all modules may take together (part of the module budget).
pub const PAGE_CACHE_BYTES: usize = 4 << 20;

/// Counts the memory held by the images of one owner: every [`crate::CodeModule`]'s tables,
/// the code pages they cache, and other tables charged to it ([`ModuleBudget::charge`]).
/// Cloning gives another handle to the same counts.
#[derive(Debug, Clone, Default)]
pub struct ModuleBudget {
    counts: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    /// Tables of live modules and charged tables.
    tables: AtomicUsize,
    /// Code pages the modules have cached (at most [`PAGE_CACHE_BYTES`] and a page).
    pages: AtomicUsize,
}

impl ModuleBudget {
    /// A budget with nothing counted yet.
    pub fn new() -> ModuleBudget {
        ModuleBudget::default()
    }

    /// Memory held by every image counted here, in bytes: tables and cached code pages.
    pub fn live_bytes(&self) -> usize {
        self.counts.tables.load(Ordering::Relaxed) + self.counts.pages.load(Ordering::Relaxed)
    }

    /// Whether tables of `needed` bytes fit in `limit` next to the live ones (the code page
    /// cache all modules share, [`PAGE_CACHE_BYTES`], has its room set aside).
    pub fn fits(&self, needed: usize, limit: usize) -> bool {
        let room = limit.saturating_sub(PAGE_CACHE_BYTES);
        self.tables().saturating_add(needed) <= room
    }

    /// The memory `limit` has room for next to the live tables (the code page cache's room set
    /// aside).
    pub fn room(&self, limit: usize) -> usize {
        limit
            .saturating_sub(PAGE_CACHE_BYTES)
            .saturating_sub(self.tables())
    }

    /// Counts `bytes` of tables other than a module's (a ReadyToRun image's methods, a JIT
    /// process's symbols) until the returned charge is dropped.
    pub fn charge(&self, bytes: usize) -> TableCharge {
        self.add_tables(bytes);
        TableCharge {
            bytes,
            budget: self.clone(),
        }
    }

    fn tables(&self) -> usize {
        self.counts.tables.load(Ordering::Relaxed)
    }

    pub(crate) fn add_tables(&self, bytes: usize) {
        self.counts.tables.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn sub_tables(&self, bytes: usize) {
        self.counts.tables.fetch_sub(bytes, Ordering::Relaxed);
    }

    pub(crate) fn pages(&self) -> usize {
        self.counts.pages.load(Ordering::Relaxed)
    }

    pub(crate) fn add_pages(&self, bytes: usize) {
        self.counts.pages.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn sub_pages(&self, bytes: usize) {
        self.counts.pages.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Memory held for unwinding and naming by tables other than a [`crate::CodeModule`]'s,
/// counted in its [`ModuleBudget`] from [`ModuleBudget::charge`] until dropped: every kind of
/// table shares one budget.
#[derive(Debug)]
pub struct TableCharge {
    bytes: usize,
    budget: ModuleBudget,
}

impl TableCharge {
    /// The bytes counted.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for TableCharge {
    fn drop(&mut self) {
        self.budget.sub_tables(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_budgets_count_apart_and_charges_end_when_dropped() {
        let a = ModuleBudget::new();
        let b = ModuleBudget::new();
        let charge = a.charge(1000);
        assert_eq!((a.live_bytes(), b.live_bytes()), (1000, 0));
        assert_eq!(a.clone().live_bytes(), 1000, "a clone is the same budget");
        assert!(a.fits(24, PAGE_CACHE_BYTES + 1024));
        assert!(!a.fits(25, PAGE_CACHE_BYTES + 1024));
        assert_eq!(a.room(PAGE_CACHE_BYTES + 1024), 24);
        drop(charge);
        assert_eq!(a.live_bytes(), 0);
    }
}
