//! Reusing the outer part of a deep stack walked in the kernel.
//!
//! A thread deep in a recursion is sampled again and again with the same thousands of outer
//! frames: the kernel reads them afresh at each sample (so they need no proof), but unwinding
//! and interning them again in user space for every sample costs the reader more than the
//! sampling rate allows. The unwind of the frames above a caller frame `S` depends only on the
//! unwinder's complete state at `S`, the stack words it reads from there on, and the process's
//! code. So, per thread, a [`Memo`] keeps, from a whole sample unwound with its kernel walk: the
//! state at its first frame past the stack copy, the lowest stack address the unwind read from
//! there on, the trie node of that frame with everything above it, and the walk itself; the
//! last few such memos, made at different depths (a recursion that deepens and returns passes
//! through all of them). A later sample whose walk read exactly the same words as a memo's at and
//! above that memo's lowest address (compared word for word), in the same mappings, stops its
//! unwind when it reaches that memo's state and reuses the node.
//! Nothing is taken on trust: a single differing word, a stack dump, or a frame in JIT code (whose
//! names change without the stack changing) and the sample is unwound in full.

use std::cell::Cell;
use std::sync::Arc;

use foldhash::HashMap;

use crate::kernel_walk::KernelStack;
use crate::unwind::{FrameObserver, Registers};

use super::outer_cache::{Outer, State};

/// Most threads with memos.
const MAX_THREADS: usize = 256;
/// Most memos per thread (each holds a walk).
const PER_THREAD: usize = 6;
/// Most bytes of walks the memos hold (a 10,000-deep walk is about 320 KiB); past it the least
/// recently used memos go.
const MEMO_BYTES: usize = 16 << 20;

/// A thread's reusable outer part (see the module documentation).
pub(crate) struct Memo {
    /// The outer part: the unwinder's state at its first frame, its node and frame count.
    pub outer: Outer,
    /// The lowest stack address the unwind read from that frame on.
    pub low: u64,
    /// The walk it was unwound with.
    pub walk: Arc<KernelStack>,
    /// The process's mapping generation then.
    pub space_gen: u64,
}

/// Every thread's memos, each with when it was last made or used.
#[derive(Default)]
pub(crate) struct WalkMemos {
    memos: HashMap<(u32, u32), Vec<(u64, Memo)>>,
    clock: u64,
    /// Bytes of the walks held (counted once per memo).
    bytes: usize,
}

/// Bytes a memo's walk is counted as.
fn walk_bytes(m: &Memo) -> usize {
    m.walk.len() * 16
}

/// Most memos one sample checks and may stop for (each check compares its words).
const CHECKED: usize = 2;

/// The outer parts one sample may stop for.
pub(crate) type Reusable = [Option<Outer>; CHECKED];

impl WalkMemos {
    /// The outer parts a sample of `key` may stop for: its thread's memos whose words the
    /// sample's walk read the same from the memo's lowest read on, that address lying past the
    /// sample's copy (`copy_end`), in unchanged mappings; the deepest ones (the unwind reaches
    /// them first) up to [`CHECKED`].
    pub fn usable(
        &self,
        key: (u32, u32),
        walk: &KernelStack,
        copy_end: u64,
        space_gen: u64,
    ) -> Reusable {
        let mut out = [None; CHECKED];
        let Some(memos) = self.memos.get(&key) else {
            return out;
        };
        // In place (this runs for every walked sample): a thread has at most PER_THREAD memos.
        let mut candidates = [None::<&Memo>; PER_THREAD];
        let mut n = 0;
        for (_, m) in memos.iter() {
            if n < PER_THREAD && m.space_gen == space_gen && m.low >= copy_end {
                candidates[n] = Some(m);
                n += 1;
            }
        }
        let candidates = &mut candidates[..n];
        candidates.sort_unstable_by_key(|m| m.map_or(u64::MAX, |m| m.low));
        let usable = candidates
            .iter()
            .flatten()
            .filter(|m| walk.same_from(&m.walk, m.low));
        for (slot, m) in out.iter_mut().zip(usable) {
            *slot = Some(m.outer);
        }
        out
    }

    /// The lowest stack address the memo of `key` whose outer part is `outer` depends on; marks
    /// it used.
    pub fn used(&mut self, key: (u32, u32), outer: &Outer) -> Option<u64> {
        self.clock += 1;
        let clock = self.clock;
        let (used, m) = self
            .memos
            .get_mut(&key)?
            .iter_mut()
            .find(|(_, m)| m.outer == *outer)?;
        *used = clock;
        Some(m.low)
    }

    /// Keeps `memo` for `key`, in place of the thread's memo at the same frame, or of its least
    /// recently used one past [`PER_THREAD`].
    pub fn keep(&mut self, key: (u32, u32), memo: Memo) {
        if self.memos.len() >= MAX_THREADS && !self.memos.contains_key(&key) {
            // Any thread's will do: a busy deep thread makes new ones at its next samples.
            if let Some(&old) = self.memos.keys().next()
                && let Some(gone) = self.memos.remove(&old)
            {
                self.bytes -= gone.iter().map(|(_, m)| walk_bytes(m)).sum::<usize>();
            }
        }
        self.clock += 1;
        let memos = self.memos.entry(key).or_default();
        let mut freed = 0;
        memos.retain(|(_, m)| {
            let keep = m.outer.state != memo.outer.state;
            if !keep {
                freed += walk_bytes(m);
            }
            keep
        });
        if memos.len() >= PER_THREAD
            && let Some(oldest) = (0..memos.len()).min_by_key(|&i| memos[i].0)
        {
            freed += walk_bytes(&memos.swap_remove(oldest).1);
        }
        self.bytes = self.bytes - freed + walk_bytes(&memo);
        memos.push((self.clock, memo));
        while self.bytes > MEMO_BYTES && self.drop_least_recent() {}
    }

    /// Drops the least recently used memo of all; false when there is none.
    fn drop_least_recent(&mut self) -> bool {
        let Some((key, i)) = self
            .memos
            .iter()
            .flat_map(|(k, v)| {
                v.iter()
                    .enumerate()
                    .map(move |(i, (used, _))| (*used, *k, i))
            })
            .min()
            .map(|(_, k, i)| (k, i))
        else {
            return false;
        };
        if let Some(memos) = self.memos.get_mut(&key) {
            self.bytes -= walk_bytes(&memos.swap_remove(i).1);
            if memos.is_empty() {
                self.memos.remove(&key);
            }
        }
        true
    }

    /// Forgets a thread that exited.
    pub fn forget(&mut self, key: (u32, u32)) {
        if let Some(gone) = self.memos.remove(&key) {
            self.bytes -= gone.iter().map(|(_, m)| walk_bytes(m)).sum::<usize>();
        }
    }

    /// Forgets every thread's memos: the raw tables started over, and the trie nodes the memos
    /// hold name nothing in the new ones.
    pub fn forget_all(&mut self) {
        self.memos.clear();
        self.bytes = 0;
    }
}

/// Watches an unwind with a kernel walk: notes the first frame past the copy (its index and
/// state) and, with `reuse`, stops at the frame in that state.
pub(crate) struct MemoObserver<'c> {
    pub copy_end: u64,
    pub reuse: Reusable,
    /// The first frame past the copy.
    pub first_past: Option<(usize, State)>,
    /// The outer part the unwind stopped for.
    pub reused: Option<Outer>,
    /// Set once the unwind is past the copy (read by the sample's memory, which then notes
    /// the lowest stack address read in `low`).
    pub past: &'c Cell<bool>,
    /// The lowest stack address read once past the copy.
    pub low: &'c Cell<u64>,
}

impl FrameObserver for MemoObserver<'_> {
    fn on_frame(&mut self, index: usize, regs: &Registers, full: bool) -> bool {
        if super::outer_cache::walk_begins(index) {
            self.first_past = None;
            self.reused = None;
            self.past.set(false);
            self.low.set(u64::MAX);
        }
        if index == 0 {
            return true;
        }
        let state = (*regs, full);
        if self.first_past.is_none() && regs.sp() > self.copy_end {
            self.first_past = Some((index, state));
            self.past.set(true);
            self.low.set(regs.sp());
        }
        if let Some(outer) = self.reuse.iter().flatten().find(|o| o.state == state) {
            self.reused = Some(*outer);
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk(words: &[(u64, u64)]) -> Arc<KernelStack> {
        Arc::new(KernelStack::from_words(words.to_vec()))
    }

    fn memo(sp: u64, low: u64, walk: &Arc<KernelStack>) -> Memo {
        Memo {
            outer: Outer {
                state: (Registers::new(0x4000, sp, 0), false),
                lo: 0,
                hi: u64::MAX,
                node: sp as u32,
                frames: 3,
            },
            low,
            walk: walk.clone(),
            space_gen: 1,
        }
    }

    #[test]
    fn a_memo_is_usable_only_by_a_walk_that_read_the_same_words_past_the_copy() {
        let key = (1, 1);
        let old = walk(&[(0x1000, 1), (0x2000, 2), (0x3000, 3)]);
        let mut memos = WalkMemos::default();
        memos.keep(key, memo(0x2000, 0x2000, &old));
        let usable = |memos: &WalkMemos, w: &Arc<KernelStack>, copy_end, space_gen| {
            memos
                .usable(key, w, copy_end, space_gen)
                .iter()
                .flatten()
                .count()
        };
        // Other words below the memo's lowest read do not matter; any at or above it does.
        let same_above = walk(&[(0x1000, 9), (0x2000, 2), (0x3000, 3)]);
        let other_above = walk(&[(0x1000, 1), (0x2000, 2), (0x3000, 4)]);
        let extra_above = walk(&[(0x2000, 2), (0x2800, 5), (0x3000, 3)]);
        assert_eq!(usable(&memos, &same_above, 0x1800, 1), 1);
        assert_eq!(usable(&memos, &other_above, 0x1800, 1), 0);
        assert_eq!(usable(&memos, &extra_above, 0x1800, 1), 0);
        // Not when the memo's words lie inside the sample's copy, or the mappings changed.
        assert_eq!(usable(&memos, &same_above, 0x2800, 1), 0);
        assert_eq!(usable(&memos, &same_above, 0x1800, 2), 0);
        assert_eq!(usable(&WalkMemos::default(), &same_above, 0x1800, 1), 0);
    }

    #[test]
    fn a_thread_keeps_its_most_recent_memos_within_the_byte_bound() {
        let key = (1, 1);
        let w = walk(&[(0x1000, 1)]);
        let mut memos = WalkMemos::default();
        for sp in 0..(PER_THREAD as u64 + 3) {
            memos.keep(key, memo(0x1000 + sp * 8, 0x1000, &w));
        }
        // The same frame replaces its memo.
        memos.keep(key, memo(0x1000 + 8 * (PER_THREAD as u64 + 2), 0x1000, &w));
        let kept = &memos.memos[&key];
        assert_eq!(kept.len(), PER_THREAD);
        assert!(kept.iter().all(|(_, m)| m.outer.node >= 0x1000 + 3 * 8));
        assert_eq!(
            memos.usable(key, &w, 0, 1).iter().flatten().count(),
            CHECKED
        );
        assert_eq!(memos.bytes, PER_THREAD * 16);
        memos.forget(key);
        assert_eq!(memos.bytes, 0);
        // Past the byte bound the least recently used go, across threads.
        let big = walk(&vec![(0, 0); MEMO_BYTES / 16 / 2 + 1]);
        memos.keep((2, 2), memo(8, 0, &big));
        memos.keep((3, 3), memo(8, 0, &big));
        assert!(memos.bytes <= MEMO_BYTES);
        assert!(memos.memos.contains_key(&(3, 3)) && !memos.memos.contains_key(&(2, 2)));
    }
}
