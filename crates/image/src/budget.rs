//! The memory budget for binary images: one handle per owner (a recorder, an agent), shared by
//! everything that owner loads, so two owners in one process never share a count.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Most memory the code pages and symbol names all modules keep may take together (part of the
/// module budget).
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
    /// Code pages and symbol names the modules have kept (at most [`PAGE_CACHE_BYTES`] and a
    /// page).
    pages: AtomicUsize,
    /// Tables the owner can let go of when a load needs their room ([`ModuleBudget::set_reclaimable`]).
    reclaimable: AtomicUsize,
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
    /// cache all modules share, [`PAGE_CACHE_BYTES`], has its room set aside), counting the
    /// room of reclaimable tables as free: the owner lets go of those once the load is in.
    pub fn fits(&self, needed: usize, limit: usize) -> bool {
        let room = limit.saturating_sub(PAGE_CACHE_BYTES);
        let held = self.tables().saturating_sub(self.reclaimable());
        held.saturating_add(needed) <= room
    }

    /// Says how many bytes of the live tables their owner does not need and lets go of when
    /// room is wanted (a binary mapped only by processes that exited): a load may take their
    /// room ([`ModuleBudget::fits`]), leaving the live bytes over the limit until the owner has
    /// let go of them.
    pub fn set_reclaimable(&self, bytes: usize) {
        self.counts.reclaimable.store(bytes, Ordering::Relaxed);
    }

    /// The bytes last said reclaimable ([`ModuleBudget::set_reclaimable`]).
    pub fn reclaimable(&self) -> usize {
        self.counts.reclaimable.load(Ordering::Relaxed)
    }

    /// The memory `limit` has room for next to the live tables (the code page cache's room set
    /// aside; reclaimable tables' room counted free, as in [`ModuleBudget::fits`]).
    pub fn room(&self, limit: usize) -> usize {
        limit
            .saturating_sub(PAGE_CACHE_BYTES)
            .saturating_sub(self.tables().saturating_sub(self.reclaimable()))
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
    fn a_load_may_take_the_room_of_reclaimable_tables() {
        let budget = ModuleBudget::new();
        let limit = PAGE_CACHE_BYTES + 1000;
        let _held = budget.charge(800);
        assert!(!budget.fits(300, limit));
        budget.set_reclaimable(200);
        assert!(budget.fits(400, limit), "800 held, 200 of them reclaimable");
        assert!(!budget.fits(401, limit));
        assert_eq!(budget.room(limit), 400);
        budget.set_reclaimable(5000);
        assert!(
            budget.fits(1000, limit),
            "more said reclaimable than held counts as all"
        );
        assert!(!budget.fits(1001, limit));
    }

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
