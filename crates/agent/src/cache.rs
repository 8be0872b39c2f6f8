//! The bounded stack cache, in the style of Windows ETW's stack cache.
//!
//! Stacks are hashed into a fixed number of buckets. A bucket holds at most `bucket_limit` stacks
//! in most-recently-used order. A stack is named by its source's [`StackTable`] and its node
//! there; tables intern every frame and node by full value, so two stacks of one table are the
//! same exactly when their ids are, and a lookup compares ids, not frames. A hit moves the entry to
//! the front and returns its key. A miss inserts the stack under a fresh key (keys are never
//! reused), evicting the bucket's tail when the bucket is full and, while the byte budget is
//! exceeded, the tails of other buckets in round-robin order. The caller writes a *definition* for
//! every inserted stack and an *eviction* for every evicted key into its sample stream, so a
//! consumer can resolve keys with memory bounded by the cache itself; an eviction only costs a
//! re-definition the next time the stack is seen. [`StackCache::rundown`] lists what is left at the
//! end.

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};

use rootline_profile::StackId;

use crate::stacks::{FrameDesc, StackRef, StackTable};

/// Key naming a cached stack in the sample stream. Keys are never reused.
pub type StackKey = u64;

/// Fixed bytes an entry costs besides its frames (key, hash, size, table handle and id).
pub const ENTRY_OVERHEAD: usize = 64;

/// Bytes a stack of `frames` frames is charged in the cache: its frames are held once in the
/// source's table (shared with other stacks), so this is a bound, not a copy.
pub fn stack_cost(frames: usize) -> usize {
    ENTRY_OVERHEAD + frames * FrameDesc::COST
}

/// Shape and budget of a [`StackCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLimits {
    /// Number of hash buckets (at least 1).
    pub buckets: usize,
    /// Most stacks one bucket holds (at least 1); ETW uses 4.
    pub bucket_limit: usize,
    /// Most bytes all cached stacks together may cost (see `stack_cost`).
    pub byte_budget: usize,
}

/// Counters of a [`StackCache`], cumulative since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found the stack.
    pub hits: u64,
    /// Lookups that did not find it (each one led to a definition, or to a dropped sample).
    pub misses: u64,
    /// Stacks evicted to make room.
    pub evictions: u64,
    /// Stacks listed by the final rundown.
    pub rundown: u64,
    /// Stacks cached now.
    pub entries: u64,
    /// Bytes cached now.
    pub bytes: u64,
}

#[derive(Debug)]
struct Entry {
    key: StackKey,
    hash: u64,
    bytes: usize,
    stack: StackRef,
}

/// Result of [`StackCache::lookup`].
#[derive(Debug)]
pub enum Lookup {
    /// The stack is cached under this key (now the most recently used of its bucket).
    Hit(StackKey),
    /// The stack is not cached; pass this to [`StackCache::plan_insert`] / [`StackCache::insert`].
    Miss(Miss),
}

/// Where a missed stack would go.
#[derive(Debug, Clone, Copy)]
pub struct Miss {
    bucket: usize,
    hash: u64,
    bytes: usize,
    depth: u32,
}

impl Miss {
    /// Bytes the stack will cost once cached.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// What inserting a missed stack will do, computed before doing it so the caller can check that
/// its buffer has room for the definition and the evictions first.
#[derive(Debug, Default)]
pub struct InsertPlan {
    victims: Vec<(usize, StackKey)>,
    hand_after: usize,
    cacheable: bool,
}

impl InsertPlan {
    /// Number of stacks the insert evicts (not counting an uncacheable stack's own eviction).
    pub fn evictions(&self) -> usize {
        self.victims.len()
    }

    /// False when the stack alone is larger than the byte budget: it gets a key and a definition,
    /// and the caller evicts it again right after its sample.
    pub fn cacheable(&self) -> bool {
        self.cacheable
    }
}

/// A stack inserted by [`StackCache::insert`].
#[derive(Debug)]
pub struct Inserted {
    /// Its new key.
    pub key: StackKey,
    /// The stack, to put in the definition.
    pub stack: StackRef,
}

/// The bounded, bucketed stack cache. See the module documentation.
#[derive(Debug)]
pub struct StackCache {
    limits: CacheLimits,
    buckets: Vec<Vec<Entry>>,
    hasher: BuildHasherDefault<DefaultHasher>,
    bytes: usize,
    entries: usize,
    hand: usize,
    next_key: StackKey,
    stats: CacheStats,
}

impl StackCache {
    /// An empty cache. Zero buckets or a zero bucket limit are raised to 1.
    pub fn new(limits: CacheLimits) -> StackCache {
        let limits = CacheLimits {
            buckets: limits.buckets.max(1),
            bucket_limit: limits.bucket_limit.max(1),
            byte_budget: limits.byte_budget,
        };
        StackCache {
            buckets: (0..limits.buckets).map(|_| Vec::new()).collect(),
            limits,
            hasher: BuildHasherDefault::default(),
            bytes: 0,
            entries: 0,
            hand: 0,
            next_key: 1,
            stats: CacheStats::default(),
        }
    }

    /// The cache's limits.
    pub fn limits(&self) -> CacheLimits {
        self.limits
    }

    /// The counters, with `entries` and `bytes` as of now.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            entries: self.entries as u64,
            bytes: self.bytes as u64,
            ..self.stats
        }
    }

    /// Looks up stack `id` of `table`, which has `depth` frames; a hit becomes its bucket's
    /// most recently used entry.
    pub fn lookup(&mut self, table: &StackTable, id: StackId, depth: u32) -> Lookup {
        let hash = self.hasher.hash_one((table.id(), id));
        let bucket = (hash % self.buckets.len() as u64) as usize;
        let entries = &mut self.buckets[bucket];
        if let Some(pos) = entries
            .iter()
            .position(|e| e.hash == hash && e.stack.id == id && e.stack.table.id() == table.id())
        {
            let entry = entries.remove(pos);
            let key = entry.key;
            entries.insert(0, entry);
            self.stats.hits += 1;
            return Lookup::Hit(key);
        }
        self.stats.misses += 1;
        Lookup::Miss(Miss {
            bucket,
            hash,
            bytes: stack_cost(depth as usize),
            depth,
        })
    }

    /// Computes which stacks inserting the missed stack would evict, without changing anything.
    pub fn plan_insert(&self, miss: &Miss, plan: &mut InsertPlan) {
        plan.victims.clear();
        plan.hand_after = self.hand;
        plan.cacheable = miss.bytes <= self.limits.byte_budget;
        if !plan.cacheable {
            return;
        }
        let mut freed = 0usize;
        let home = &self.buckets[miss.bucket];
        if home.len() >= self.limits.bucket_limit {
            let tail = &home[home.len() - 1];
            plan.victims.push((miss.bucket, tail.key));
            freed += tail.bytes;
        }
        let need = (self.bytes + miss.bytes).saturating_sub(self.limits.byte_budget);
        let n = self.buckets.len();
        let mut hand = self.hand;
        let mut idle_turns = 0;
        while freed < need && idle_turns < n {
            let taken = plan.victims.iter().filter(|(b, _)| *b == hand).count();
            let bucket = &self.buckets[hand];
            if bucket.len() > taken {
                let victim = &bucket[bucket.len() - 1 - taken];
                plan.victims.push((hand, victim.key));
                freed += victim.bytes;
                idle_turns = 0;
            } else {
                idle_turns += 1;
            }
            hand = (hand + 1) % n;
        }
        plan.hand_after = hand;
    }

    /// Inserts the missed stack as planned by [`StackCache::plan_insert`] (which must have been
    /// called with the same miss and no change in between), appending the evicted keys to
    /// `evicted`.
    pub fn insert(
        &mut self,
        miss: &Miss,
        (table, id): (&StackTable, StackId),
        plan: &InsertPlan,
        evicted: &mut Vec<StackKey>,
    ) -> Inserted {
        let key = self.next_key;
        self.next_key += 1;
        let stack = StackRef {
            table: table.clone(),
            id,
            depth: miss.depth,
        };
        for &(bucket, victim) in &plan.victims {
            let entries = &mut self.buckets[bucket];
            if let Some(pos) = entries.iter().position(|e| e.key == victim) {
                let entry = entries.remove(pos);
                self.bytes -= entry.bytes;
                self.entries -= 1;
                self.stats.evictions += 1;
                evicted.push(victim);
            }
        }
        self.hand = plan.hand_after;
        if plan.cacheable {
            self.buckets[miss.bucket].insert(
                0,
                Entry {
                    key,
                    hash: miss.hash,
                    bytes: miss.bytes,
                    stack: stack.clone(),
                },
            );
            self.bytes += miss.bytes;
            self.entries += 1;
        } else {
            // Counted as an eviction: the caller retires the key right after its one sample.
            self.stats.evictions += 1;
        }
        Inserted { key, stack }
    }

    /// Stacks cached from tables other than `table` (which a source replaced).
    pub fn stale(&self, table: &StackTable) -> usize {
        self.buckets
            .iter()
            .flatten()
            .filter(|e| e.stack.table.id() != table.id())
            .count()
    }

    /// Evicts every stack of a table other than `table`, appending their keys to `evicted`, so
    /// that replaced tables are let go of.
    pub fn evict_stale(&mut self, table: &StackTable, evicted: &mut Vec<StackKey>) {
        for bucket in &mut self.buckets {
            bucket.retain(|e| {
                let keep = e.stack.table.id() == table.id();
                if !keep {
                    self.bytes -= e.bytes;
                    self.entries -= 1;
                    self.stats.evictions += 1;
                    evicted.push(e.key);
                }
                keep
            });
        }
    }

    /// Empties the cache, returning every cached key (the final rundown) and counting them.
    pub fn rundown(&mut self) -> Vec<StackKey> {
        let mut keys = Vec::with_capacity(self.entries);
        for bucket in &mut self.buckets {
            keys.extend(bucket.drain(..).map(|e| e.key));
        }
        self.stats.rundown += keys.len() as u64;
        self.entries = 0;
        self.bytes = 0;
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static TABLE: StackTable = StackTable::new();
    }

    /// A stack of the test's table: frames `f{i}` for each of `ids`.
    fn stack(ids: &[u64]) -> (StackTable, StackId, u32) {
        let frames: Vec<FrameDesc> = ids
            .iter()
            .map(|&i| FrameDesc::native(&format!("f{i}"), 0x1000 + i))
            .collect();
        let table = TABLE.with(Clone::clone);
        let id = table.intern(&frames);
        (table, id, ids.len() as u32)
    }

    fn touch(
        cache: &mut StackCache,
        (table, id, depth): (StackTable, StackId, u32),
        evicted: &mut Vec<StackKey>,
    ) -> StackKey {
        match cache.lookup(&table, id, depth) {
            Lookup::Hit(key) => key,
            Lookup::Miss(miss) => {
                let mut plan = InsertPlan::default();
                cache.plan_insert(&miss, &mut plan);
                let before = evicted.len();
                let inserted = cache.insert(&miss, (&table, id), &plan, evicted);
                assert_eq!(evicted.len() - before, plan.evictions());
                inserted.key
            }
        }
    }

    #[test]
    fn hit_returns_same_key_and_full_compare_separates_stacks() {
        let mut cache = StackCache::new(CacheLimits {
            buckets: 1,
            bucket_limit: 4,
            byte_budget: 1 << 20,
        });
        let mut ev = Vec::new();
        let a = touch(&mut cache, stack(&[1, 2, 3]), &mut ev);
        let b = touch(&mut cache, stack(&[1, 2, 4]), &mut ev);
        assert_ne!(a, b);
        assert_eq!(touch(&mut cache, stack(&[1, 2, 3]), &mut ev), a);
        let s = cache.stats();
        assert_eq!((s.hits, s.misses, s.evictions, s.entries), (1, 2, 0, 2));
    }

    #[test]
    fn full_bucket_evicts_least_recently_used() {
        let mut cache = StackCache::new(CacheLimits {
            buckets: 1,
            bucket_limit: 2,
            byte_budget: 1 << 20,
        });
        let mut ev = Vec::new();
        let a = touch(&mut cache, stack(&[1]), &mut ev);
        let b = touch(&mut cache, stack(&[2]), &mut ev);
        assert_eq!(touch(&mut cache, stack(&[1]), &mut ev), a); // a is now MRU
        let _c = touch(&mut cache, stack(&[3]), &mut ev);
        assert_eq!(ev, vec![b]);
        let b2 = touch(&mut cache, stack(&[2]), &mut ev);
        assert_ne!(b2, b, "an evicted stack is re-defined under a new key");
        assert_eq!(cache.stats().evictions, 2);
    }

    #[test]
    fn byte_budget_is_never_exceeded() {
        let budget = stack_cost(3) * 5;
        let mut cache = StackCache::new(CacheLimits {
            buckets: 8,
            bucket_limit: 4,
            byte_budget: budget,
        });
        let mut ev = Vec::new();
        for i in 0..200u64 {
            touch(&mut cache, stack(&[i, i + 1, i + 2]), &mut ev);
            assert!(cache.stats().bytes as usize <= budget);
        }
        let s = cache.stats();
        assert_eq!(s.misses, 200);
        assert_eq!(s.evictions, 200 - s.entries);
        assert_eq!(ev.len() as u64, s.evictions);
        let keys = cache.rundown();
        assert_eq!(keys.len() as u64, s.entries);
        assert_eq!(cache.stats().rundown, s.entries);
    }

    #[test]
    fn stack_larger_than_budget_is_defined_but_not_kept() {
        let mut cache = StackCache::new(CacheLimits {
            buckets: 4,
            bucket_limit: 4,
            byte_budget: stack_cost(2),
        });
        let mut ev = Vec::new();
        touch(&mut cache, stack(&[1]), &mut ev);
        let (table, big, depth) = stack(&[1, 2, 3, 4, 5]);
        let Lookup::Miss(miss) = cache.lookup(&table, big, depth) else {
            panic!("expected a miss")
        };
        let mut plan = InsertPlan::default();
        cache.plan_insert(&miss, &mut plan);
        assert!(!plan.cacheable());
        cache.insert(&miss, (&table, big), &plan, &mut ev);
        assert_eq!(cache.stats().entries, 1);
        assert!(matches!(cache.lookup(&table, big, depth), Lookup::Miss(_)));
    }

    #[test]
    fn the_same_id_in_another_table_is_another_stack_and_stale_tables_are_evicted() {
        let mut cache = StackCache::new(CacheLimits {
            buckets: 4,
            bucket_limit: 4,
            byte_budget: 1 << 20,
        });
        let mut ev = Vec::new();
        let (old, id, depth) = stack(&[1, 2]);
        let a = touch(&mut cache, (old.clone(), id, depth), &mut ev);
        let new = StackTable::new();
        let same_id = new.intern(&[FrameDesc::native("other", 1), FrameDesc::native("x", 2)]);
        assert_eq!(
            same_id, id,
            "both tables give their first stack the same id"
        );
        let b = touch(&mut cache, (new.clone(), same_id, 2), &mut ev);
        assert_ne!(a, b);
        assert_eq!(cache.stale(&new), 1);
        cache.evict_stale(&new, &mut ev);
        assert_eq!(ev, vec![a]);
        assert_eq!((cache.stats().entries, cache.stale(&new)), (1, 0));
        assert_eq!(touch(&mut cache, (new, same_id, 2), &mut ev), b);
    }
}
