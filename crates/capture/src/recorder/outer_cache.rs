//! Proof for live stack reads, and a per-thread cache of the outer part of a deep stack.
//!
//! Frames past a sample's copied stack are read from the live process after the sample, so they
//! are only trustworthy if the stack above the splice did not change in between. The frames
//! above a caller frame `B` depend only on the unwinder's state at `B` (instruction, stack and
//! frame pointers) and the words it reads at or above `B`'s stack pointer; a [`StackWatch`] on
//! the return-address slot just below `B` proves those words unchanged (see
//! [`crate::live::stack_watch`] for the argument). So, per thread:
//! 1. A sample that needs live memory and has no proof ends `[truncated: live-unproven]` at its
//!    copy, and arms a watchpoint at a frame `B` well inside its copy ([`Phase::Armed`]).
//! 2. A later sample, taken after arming, whose copy holds `B`'s slot and whose unwind passes
//!    through a caller frame at `B`'s stack pointer may read live memory past it (that frame was
//!    entered by a call writing the watched slot, so it is the same activation as at arming);
//!    if the watch is still untouched after those reads, its frames are proven (else they are
//!    cut as `stack-changed`).
//! 3. The trie node of `B` and everything above it, from such a proven sample, is kept with
//!    the unwinder's complete state at `B` ([`Phase::Ready`]); later proven samples that reach
//!    `B` in exactly that state stop there and reuse it, so a sample of a 10,000-deep recursion
//!    costs about what its changed inner part costs.
//!
//! Anything else (mappings changed, thread exited, watch fired) drops the entry; the next
//! sample that needs live memory arms a new one. Each arming costs the target at most one
//! debug trap.

use std::cell::Cell;
use std::collections::HashMap;
use std::ops::Range;

use crate::jit::JitMemory;
use crate::live::stack_watch::StackWatch;
use crate::unwind::{FrameObserver, Memory, NoCfiRule, ReadFailure, Registers};

/// Most threads with a watch (each holds one debug register of its thread).
const MAX_ENTRIES: usize = 64;
/// `B` lies at least this far inside the copy, so that later samples whose leaf sits a little
/// deeper still copy `B`'s slot.
pub(crate) const SLACK_BYTES: u64 = 4 * 1024;

/// Counts of the outer-stack cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OuterCacheStats {
    /// Samples whose live frames were proven by a watch.
    pub proven: u64,
    /// Samples whose outer frames came from the cache.
    pub hits: u64,
    /// Frames taken from the cache instead of being unwound.
    pub frames_reused: u64,
    /// Watchpoints armed.
    pub armed: u64,
    /// Watchpoints the kernel refused (no free debug register, permission).
    pub refused: u64,
    /// Entries dropped because the watched slot was written, the thread exited or the
    /// process's mappings changed.
    pub invalidated: u64,
}

/// A cached outer stack, valid for samples whose copy ends in `lo..hi` (so that the same frames
/// are marked as read from live memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outer {
    /// The unwinder's complete state at `B` when this part was unwound.
    pub state: State,
    pub lo: u64,
    pub hi: u64,
    /// The trie node of `B` with everything above it.
    pub node: u32,
    /// Frames from `B` to the root.
    pub frames: usize,
}

/// Most [`Outer`] variants kept per thread.
pub(crate) const MAX_VARIANTS: usize = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Watching; no outer part proven yet.
    Armed,
    /// Proven outer parts.
    Ready(Vec<Outer>),
}

/// The unwinder's complete state at a frame, as [`Memory::on_frame`] reports it: the frame's
/// registers and whether the walk tracks every register.
pub(crate) type State = (Registers, bool);

struct Entry {
    /// The unwinder's state at `B`.
    state: State,
    watch: StackWatch,
    phase: Phase,
    space_gen: u64,
    last_used: u64,
}

/// The watches and caches of all threads.
#[derive(Default)]
pub(crate) struct OuterCache {
    entries: HashMap<(u32, u32), Entry>,
    clock: u64,
    pub stats: OuterCacheStats,
}

/// What a sample may do, decided before unwinding.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Plan {
    /// `B`'s stack pointer: live reads are allowed once the unwind has passed a caller frame
    /// there.
    pub proof: Option<u64>,
    /// Cached outer parts valid for this sample's copy: stop at `B` and use the one whose state
    /// the unwind reaches there.
    pub reuse: [Option<Outer>; MAX_VARIANTS],
}

impl OuterCache {
    /// Decides for a sample of `(pid, tid)` taken at `time`, whose copy ends at `copy_end`, in a
    /// process whose mappings are at generation `space_gen`.
    pub fn plan(&mut self, key: (u32, u32), time: u64, copy_end: u64, space_gen: u64) -> Plan {
        self.clock += 1;
        let Some(e) = self.entries.get_mut(&key) else {
            return Plan::default();
        };
        if e.space_gen != space_gen || !e.watch.untouched() {
            self.drop_entry(key);
            return Plan::default();
        }
        e.last_used = self.clock;
        // The sample must postdate the watch, and its own copy must hold `B`'s slot (so that
        // every live read lies above `B`).
        if time <= e.watch.armed_at() || copy_end < e.state.0.sp() {
            return Plan::default();
        }
        let mut reuse = [None; MAX_VARIANTS];
        if let Phase::Ready(outers) = &e.phase {
            for (slot, o) in reuse
                .iter_mut()
                .zip(outers.iter().filter(|o| (o.lo..o.hi).contains(&copy_end)))
            {
                *slot = Some(*o);
            }
        }
        Plan {
            proof: Some(e.state.0.sp()),
            reuse,
        }
    }

    /// After a proven sample's live reads: whether the watch is still untouched (else the
    /// entry is dropped and the live frames must go).
    pub fn confirm(&mut self, key: (u32, u32)) -> bool {
        let ok = self.entries.get(&key).is_some_and(|e| e.watch.untouched());
        if ok {
            self.stats.proven += 1;
        } else {
            self.drop_entry(key);
        }
        ok
    }

    /// Keeps a proven outer part.
    pub fn keep(&mut self, key: (u32, u32), outer: Outer) {
        let Some(e) = self.entries.get_mut(&key) else {
            return;
        };
        match &mut e.phase {
            Phase::Ready(outers) => {
                if outers.len() >= MAX_VARIANTS {
                    outers.remove(0);
                }
                outers.push(outer);
            }
            phase => *phase = Phase::Ready(vec![outer]),
        }
    }

    /// Counts a sample that reused `frames` cached frames.
    pub fn hit(&mut self, frames: usize) {
        self.stats.hits += 1;
        self.stats.frames_reused += frames as u64;
    }

    /// Whether a sample taken at `time` that needed an unavailable proof should arm a new watch:
    /// not when the thread's current watch was armed after the sample (a sample still queued
    /// from before arming), only when none exists or the sample postdates it and still could
    /// not use it (the thread's stack moved away from `B`).
    pub fn should_arm(&self, key: (u32, u32), time: u64) -> bool {
        self.entries
            .get(&key)
            .is_none_or(|e| time > e.watch.armed_at())
    }

    /// Arms a watch at `B` = `state` for thread `key`, replacing its entry.
    pub fn arm(&mut self, key: (u32, u32), state: State, space_gen: u64) {
        self.entries.remove(&key);
        let Some(slot) = state.0.sp().checked_sub(8) else {
            return;
        };
        match StackWatch::arm(key.1, slot) {
            Ok(watch) => {
                if self.entries.len() >= MAX_ENTRIES
                    && let Some(&old) = self
                        .entries
                        .iter()
                        .min_by_key(|(_, e)| e.last_used)
                        .map(|(k, _)| k)
                {
                    self.entries.remove(&old);
                }
                self.stats.armed += 1;
                self.entries.insert(
                    key,
                    Entry {
                        state,
                        watch,
                        phase: Phase::Armed,
                        space_gen,
                        last_used: self.clock,
                    },
                );
            }
            Err(_) => self.stats.refused += 1,
        }
    }

    fn drop_entry(&mut self, key: (u32, u32)) {
        if self.entries.remove(&key).is_some() {
            self.stats.invalidated += 1;
        }
    }

    /// Forgets a thread that exited.
    pub fn forget(&mut self, key: (u32, u32)) {
        self.entries.remove(&key);
    }

    /// Lets go of every proven outer part, keeping the watches: the raw tables started over, and
    /// the trie nodes the parts hold name nothing in the new ones. The next sample a watch
    /// proves keeps its part again.
    pub fn forget_nodes(&mut self) {
        for entry in self.entries.values_mut() {
            if matches!(entry.phase, Phase::Ready(_)) {
                entry.phase = Phase::Armed;
            }
        }
    }
}

/// The sample's memory during an observed unwind: refuses reads past the copy until the unwind
/// has passed `B` (only those are proven), as its [`ProofObserver`] records in `passed_at`.
pub(crate) struct Observed<'m, 'a> {
    pub inner: &'m mut JitMemory<'a>,
    /// End of the sample's copied stack.
    pub copy_end: u64,
    /// Index of the frame at which the unwind passed `B`, set by the observer.
    pub passed_at: &'m Cell<Option<usize>>,
}

impl Memory for Observed<'_, '_> {
    fn read_stack_u64(&mut self, addr: u64) -> Result<u64, ReadFailure> {
        if addr >= self.copy_end && self.passed_at.get().is_none() {
            return Err(ReadFailure::BeyondCopy);
        }
        self.inner.read_stack_u64(addr)
    }
    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> bool {
        self.inner.read_code(addr, buf)
    }
    fn jit_function(&mut self, addr: u64) -> Option<Range<u64>> {
        self.inner.jit_function(addr)
    }
    fn jit_rule(&mut self, lookup: u64, leaf: bool) -> Option<Option<NoCfiRule>> {
        self.inner.jit_rule(lookup, leaf)
    }
    fn jit_interrupt_handler(&mut self, addr: u64) -> bool {
        self.inner.jit_interrupt_handler(addr)
    }
    fn jit_interpreter(&mut self, addr: u64) -> bool {
        self.inner.jit_interpreter(addr)
    }
    fn code_refused(&mut self, addr: u64) -> bool {
        self.inner.code_refused(addr)
    }
    fn jit_code_unnamed(&mut self, addr: u64) -> bool {
        self.inner.jit_code_unnamed(addr)
    }
    fn copied_len(&self) -> Option<usize> {
        self.inner.copied_len()
    }
}

/// Observes each caller frame the unwinder recovers: records the state of frames inside the copy
/// (candidates for `B`), notes where the unwind passes through `B`'s state, and stops there when
/// a cached outer part continues from that state.
pub(crate) struct ProofObserver<'m> {
    /// State of each frame inside the copy (index 0: the leaf's registers).
    pub states: &'m mut Vec<State>,
    /// End of the sample's copied stack.
    pub copy_end: u64,
    /// `B`'s stack pointer, and the cached outer parts to stop for there.
    pub proof: Option<(u64, [Option<Outer>; MAX_VARIANTS])>,
    /// Index of the frame at which the unwind passed `B` (read by [`Observed`]).
    pub passed_at: &'m Cell<Option<usize>>,
    /// The cached outer part the unwind stopped for.
    pub reused: Option<Outer>,
}

/// Whether an observer's call at frame `index` begins a walk: the unwinder calls it at the
/// leaf's caller (index 1, or 0 where the leaf itself is reported), and a walk that restarts
/// from the leaf calls it again from index 1. Observers forget what the walk before noted.
pub(crate) fn walk_begins(index: usize) -> bool {
    index <= 1
}

impl FrameObserver for ProofObserver<'_> {
    fn on_frame(&mut self, index: usize, regs: &Registers, full: bool) -> bool {
        if walk_begins(index) {
            self.states.truncate(1);
            self.passed_at.set(None);
            self.reused = None;
        }
        let state = (*regs, full);
        if regs.sp() <= self.copy_end && self.states.len() == index {
            self.states.push(state);
        }
        if let Some((sp_b, reuse)) = &self.proof
            && regs.sp() == *sp_b
            && self.passed_at.get().is_none()
        {
            self.passed_at.set(Some(index));
            self.reused = reuse.iter().flatten().find(|o| o.state == state).copied();
            return self.reused.is_none();
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn me() -> (u32, u32) {
        // SAFETY: gettid has no preconditions.
        (std::process::id(), unsafe { libc::gettid() } as u32)
    }

    #[test]
    fn a_proof_covers_only_later_samples_whose_copy_holds_b_until_the_slot_is_written() {
        // `B`'s return-address slot is this word; `B`'s stack pointer is just above it.
        let slot = Box::new([AtomicU64::new(1), AtomicU64::new(2)]);
        let sp_b = &slot[1] as *const AtomicU64 as u64;
        let key = me();
        let state = (Registers::new(0x40_1000, sp_b, sp_b + 64), false);
        let mut cache = OuterCache::default();
        cache.arm(key, state, 7);
        assert_eq!(cache.stats.armed, 1, "breakpoint events work here");
        let armed_at = cache.entries[&key].watch.armed_at();

        // Taken before the watch was in place: nothing proves it.
        let early = cache.plan(key, armed_at - 1, sp_b + 4096, 7);
        assert!(early.proof.is_none());
        assert!(
            !cache.should_arm(key, armed_at - 1),
            "no re-arming for queued samples"
        );
        // A later sample whose copy ends below `B`: its live reads would start below `B`.
        assert!(cache.plan(key, armed_at + 1, sp_b - 8, 7).proof.is_none());
        // A later sample whose copy holds `B`'s slot: proven, not yet cached.
        let plan = cache.plan(key, armed_at + 1, sp_b + 4096, 7);
        assert_eq!(plan.proof, Some(sp_b));
        assert!(plan.reuse.iter().all(Option::is_none));
        assert!(cache.confirm(key));
        let outer = Outer {
            state,
            lo: sp_b + 4000,
            hi: sp_b + 5000,
            node: 42,
            frames: 9_000,
        };
        cache.keep(key, outer);
        assert_eq!(
            cache.plan(key, armed_at + 2, sp_b + 4096, 7).reuse[0],
            Some(outer)
        );
        // A copy ending elsewhere would mark other frames as live: proven but not reused.
        let other = cache.plan(key, armed_at + 2, sp_b + 6000, 7);
        assert!(other.proof.is_some() && other.reuse.iter().all(Option::is_none));
        // Changed mappings drop the entry.
        assert!(
            cache
                .plan(key, armed_at + 3, sp_b + 4096, 8)
                .proof
                .is_none()
        );
        assert_eq!(cache.stats.invalidated, 1);

        // A write to the slot (even of the same value) drops it too.
        cache.arm(key, state, 7);
        let armed_at = cache.entries[&key].watch.armed_at();
        assert!(
            cache
                .plan(key, armed_at + 1, sp_b + 4096, 7)
                .proof
                .is_some()
        );
        slot[0].store(1, Ordering::SeqCst);
        assert!(
            cache
                .plan(key, armed_at + 2, sp_b + 4096, 7)
                .proof
                .is_none()
        );
        assert!(!cache.confirm(key));
        assert_eq!(cache.stats.invalidated, 2);
        assert!(cache.should_arm(key, armed_at + 2));
    }
}
