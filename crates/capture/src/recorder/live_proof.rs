//! The live-read proof: reading a thread's stack past its sample's copy
//! ([`crate::live::live_memory`]) and proving those frames with a watch on a frame inside the
//! copy, reusing the proven outer part of deep stacks ([`super::outer_cache`]).

use crate::live::LiveMemory;
use crate::live::live_memory::LiveStats;
use crate::unwind::MemoryReader;

use super::outer_cache::{self, OuterCache, OuterCacheStats, Plan, State};

/// The frames of one unwind as the proof needs them.
pub(crate) struct Walk<'a> {
    /// Each frame's stack pointer (a return address was read just below it).
    pub sps: &'a [u64],
    /// The unwinder's complete state at each frame inside the copy.
    pub states: &'a [State],
    /// End of the sample's copied stack.
    pub copy_end: u64,
}

/// A proven outer part to keep: frames `from..upto` of a [`Walk`], interned as trie `node`.
pub(crate) struct ProvenOuter {
    pub from: usize,
    pub upto: usize,
    pub node: u32,
}

/// Live stack reads and their proofs. Off until [`LiveProof::set_budget`].
#[derive(Default)]
pub(crate) struct LiveProof {
    live: Option<LiveMemory>,
    outer: OuterCache,
}

impl LiveProof {
    /// Reads at most `budget` bytes of live stack per sample (0: no live reads).
    pub fn set_budget(&mut self, budget: usize) {
        self.live = (budget > 0).then(|| LiveMemory::new(budget));
    }

    /// Whether live reads are on.
    pub fn enabled(&self) -> bool {
        self.live.is_some()
    }

    /// What a sample of thread `key` taken at `time`, whose copy ends at `copy_end`, in a
    /// process whose mappings are at generation `space_gen`, may read and reuse.
    pub fn plan(&mut self, key: (u32, u32), time: u64, copy_end: u64, space_gen: u64) -> Plan {
        if self.live.is_none() {
            return Plan::default();
        }
        self.outer.plan(key, time, copy_end, space_gen)
    }

    /// Starts the live reads of a sample of `(pid, tid)` whose copy `stack` ends at `copy_end`;
    /// None when live reads are off.
    pub fn start(
        &mut self,
        (pid, tid): (u32, u32),
        copy_end: u64,
        stack: &[u8],
    ) -> Option<&mut dyn MemoryReader> {
        let live = self.live.as_mut()?;
        live.start(pid, tid, copy_end, stack);
        Some(live as &mut dyn MemoryReader)
    }

    /// After an unwind: the live-read counters (None when off), and whether live memory was
    /// read from a thread that has exited since.
    pub fn after_reads(&self) -> (Option<LiveStats>, bool) {
        match &self.live {
            Some(live) => (Some(live.stats()), live.used() > 0 && !live.thread_alive()),
            None => (None, false),
        }
    }

    /// After a proven sample's live reads: whether the watch of thread `key` is still untouched.
    pub fn confirm(&mut self, key: (u32, u32)) -> bool {
        self.outer.confirm(key)
    }

    /// Counts a sample that reused `frames` cached outer frames.
    pub fn reused(&mut self, frames: usize) {
        self.outer.hit(frames);
    }

    /// Arms a watch for thread `key` at a frame well inside the copy of a sample taken at
    /// `time`, so that its later samples can be proven.
    pub fn arm_inside(&mut self, key: (u32, u32), time: u64, walk: &Walk<'_>, space_gen: u64) {
        let sps = walk.sps;
        let inside = |lim: u64| (1..sps.len()).rev().find(|&i| sps[i] <= lim);
        let b = inside(walk.copy_end.saturating_sub(outer_cache::SLACK_BYTES))
            .or_else(|| inside(walk.copy_end));
        if let Some(b) = b.filter(|&b| b < walk.states.len())
            && self.outer.should_arm(key, time)
        {
            self.outer.arm(key, walk.states[b], space_gen);
        }
    }

    /// Keeps the proven outer part of thread `key`'s stack, valid for copies ending between the
    /// same two frames (so that the same frames are marked live).
    pub fn keep_outer(&mut self, key: (u32, u32), walk: &Walk<'_>, part: ProvenOuter) {
        let sps = &walk.sps[part.from..part.upto];
        let lo = sps.iter().rev().find(|&&s| s <= walk.copy_end).copied();
        let hi = sps.iter().find(|&&s| s > walk.copy_end).copied();
        if let (Some(lo), Some(hi), Some(&state)) = (lo, hi, walk.states.get(part.from)) {
            self.outer.keep(
                key,
                outer_cache::Outer {
                    state,
                    lo,
                    hi,
                    node: part.node,
                    frames: part.upto - part.from,
                },
            );
        }
    }

    /// Forgets thread `key` (it exited).
    pub fn forget(&mut self, key: (u32, u32)) {
        self.outer.forget(key);
    }

    /// Lets go of the proven outer parts' trie nodes (the raw tables started over).
    pub fn forget_nodes(&mut self) {
        self.outer.forget_nodes();
    }

    /// The outer-stack cache's counters.
    pub fn stats(&self) -> OuterCacheStats {
        self.outer.stats
    }
}
