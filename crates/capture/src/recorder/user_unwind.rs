//! Unwinding one sample's user stack to raw addresses: the copied stack, live memory past it
//! (through [`LiveProof`]), regions whose binary is still being parsed refused, and frames read
//! live cross-checked against the kernel's callchain ([`crate::live::callchain`]). What the
//! unwind finds is reported as [`StackFacts`]; [`super::stack_end::stack_end`] decides the end.

use std::cell::Cell;

use crate::jit::{JitMaps, JitMemory};
use crate::kernel_walk::KernelStack;
use crate::live::callchain;
use crate::process::Processes;
use crate::unwind::{
    Memory, MemoryReader, NoCfiRule, ReadFailure, Registers, SampleStack, StackEnd, TruncateReason,
};

use super::live_proof::{LiveProof, Walk};
use super::outer_cache::{Observed, Outer, Plan, ProofObserver, State};
use super::stack_end::{Ending, Passed, StackFacts};
use super::stats::Stats;
use super::walk_memo::{MemoObserver, Reusable};

/// One sample's user-mode inputs to an unwind.
#[derive(Clone, Copy)]
pub(crate) struct UserSample<'s> {
    /// The address space it is unwound in (its process's, or one kept aside for it).
    pub space: u32,
    pub pid: u32,
    pub tid: u32,
    pub regs: Registers,
    /// The copied stack, from the sampled stack pointer up.
    pub stack: &'s [u8],
    /// The kernel's user callchain (may be empty).
    pub chain: &'s [u64],
    /// The in-kernel walk made at the sample, when there is one.
    pub kernel: Option<&'s KernelStack>,
    /// With `kernel`: the thread's memos to stop for (see `walk_memo`).
    pub kernel_reuse: Reusable,
}

impl UserSample<'_> {
    /// End (exclusive) of the copied stack.
    pub fn copy_end(&self) -> u64 {
        self.regs.sp().saturating_add(self.stack.len() as u64)
    }
}

/// What an unwind reads: the processes' address spaces, their JIT state, live memory and the
/// counters it adds to.
pub(crate) struct UnwindParts<'a> {
    pub processes: &'a mut Processes,
    pub jit: &'a mut JitMaps,
    pub proof: &'a mut LiveProof,
    pub stats: &'a mut Stats,
}

/// The result of the last unwind, and scratch reused across samples.
#[derive(Default)]
pub(crate) struct UserUnwinder {
    /// Addresses, leaf first.
    pub addrs: Vec<u64>,
    /// Each frame's stack pointer.
    pub sps: Vec<u64>,
    /// Frames to symbolize as instructions, not return addresses.
    pub instruction_frames: Vec<usize>,
    /// Each frame's complete unwinder state, for frames inside the copy (see [`Observed`]).
    states: Vec<State>,
    /// The cached outer part the unwind stopped for.
    pub reused: Option<Outer>,
    /// Scratch: the regions of the sample's space still waiting for their binary.
    pending_ranges: Vec<(u64, u64)>,
    /// After an unwind with a kernel walk: its first frame past the copy (index and state), and
    /// the lowest stack address read from there on.
    pub past_copy: Option<(usize, State, u64)>,
}

/// The sample whose thread's live-read plan an unwind asks for if it reads live memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlanFor {
    /// The thread, `(pid, tid)`.
    pub key: (u32, u32),
    /// The sample's time.
    pub time: u64,
    /// Its process's mapping generation.
    pub space_gen: u64,
}

impl UserUnwinder {
    /// Unwinds `s`: with its in-kernel walk's words past the copy when it has a walk and they
    /// suffice, else reading and reusing what the live proof plans for `plan_for`'s thread
    /// (None: no reuse, no proven reads).
    pub fn unwind(
        &mut self,
        parts: &mut UnwindParts<'_>,
        s: &UserSample<'_>,
        plan_for: Option<PlanFor>,
    ) -> StackFacts {
        if let Some(walk) = s.kernel {
            let facts = self.unwind_from_kernel(parts, s, walk);
            let kw = parts.stats.kernel_walk.get_or_insert_with(Default::default);
            if facts.unwound != StackEnd::Truncated(TruncateReason::StackCopyExhausted) {
                kw.unwound += 1;
                return facts;
            }
            kw.fell_back += 1;
        }
        // Planned only here: planning reads the thread's watch (a system call), which a stack
        // the kernel walked does not need.
        let plan = plan_for.map_or_else(Plan::default, |p| {
            parts.proof.plan(p.key, p.time, s.copy_end(), p.space_gen)
        });
        self.unwind_with_plan(parts, s, plan)
    }

    /// Unwinds `s` over its copy and the words its in-kernel walk read: nothing is read live,
    /// so nothing needs a proof; a word the walk did not read ends the stack as past the copy.
    fn unwind_from_kernel(
        &mut self,
        parts: &mut UnwindParts<'_>,
        s: &UserSample<'_>,
        walk: &KernelStack,
    ) -> StackFacts {
        let state = parts.processes.get(s.space);
        self.pending_ranges.clear();
        state.pending_ranges(&mut self.pending_ranges);
        let mut words = walk.reader();
        let mut mem = JitMemory {
            stack: SampleStack {
                base: s.regs.sp(),
                bytes: s.stack,
                fallback: Some(&mut words as &mut dyn MemoryReader),
            },
            jit: parts.jit.process(s.pid),
            sample_code: walk.code(),
        };
        let (past, low) = (Cell::new(false), Cell::new(u64::MAX));
        let mut guarded = NotPending {
            inner: &mut mem,
            pending: &self.pending_ranges,
            lowest: Some((&past, &low)),
        };
        let mut observer = MemoObserver {
            copy_end: s.copy_end(),
            reuse: s.kernel_reuse,
            first_past: None,
            reused: None,
            past: &past,
            low: &low,
        };
        let before = state.space.full_register_unwinds();
        let unwound = state.space.unwind_observed(
            &s.regs,
            &mut guarded,
            &mut observer,
            &mut self.addrs,
            Some(&mut self.sps),
        );
        parts.stats.full_register_unwinds += state.space.full_register_unwinds() - before;
        self.instruction_frames.clear();
        self.instruction_frames
            .extend_from_slice(state.space.instruction_frames());
        self.states.clear();
        self.reused = observer.reused;
        self.past_copy = observer
            .first_past
            .map(|(index, state)| (index, state, low.get()));
        StackFacts {
            unwound,
            copy_frames: self.sps.len(),
            live_frames: false,
            callchain_mismatch: None,
            thread_exited: false,
            passed: None,
            provable: false,
            from_kernel: true,
        }
    }

    /// Unwinds `s` once the usual way, reading and reusing what `plan` allows.
    fn unwind_with_plan(
        &mut self,
        parts: &mut UnwindParts<'_>,
        s: &UserSample<'_>,
        plan: Plan,
    ) -> StackFacts {
        let copy_end = s.copy_end();
        self.past_copy = None;
        let state = parts.processes.get(s.space);
        self.pending_ranges.clear();
        state.pending_ranges(&mut self.pending_ranges);
        let mut mem = JitMemory {
            stack: SampleStack {
                base: s.regs.sp(),
                bytes: s.stack,
                fallback: parts.proof.start((s.pid, s.tid), copy_end, s.stack),
            },
            jit: parts.jit.process(s.pid),
            sample_code: s.kernel.map_or(&[], |k| k.code()),
        };
        self.states.clear();
        self.states.push((s.regs, false));
        let passed = Cell::new(None);
        let mut observer = ProofObserver {
            states: &mut self.states,
            copy_end,
            proof: plan.proof.map(|sp_b| (sp_b, plan.reuse)),
            passed_at: &passed,
            reused: None,
        };
        let mut observed = Observed {
            inner: &mut mem,
            copy_end,
            passed_at: &passed,
        };
        let mut guarded = NotPending {
            inner: &mut observed,
            pending: &self.pending_ranges,
            lowest: None,
        };
        let memory: &mut dyn Memory = if self.pending_ranges.is_empty() {
            guarded.inner
        } else {
            &mut guarded
        };
        let before = state.space.full_register_unwinds();
        let unwound = state.space.unwind_observed(
            &s.regs,
            memory,
            &mut observer,
            &mut self.addrs,
            Some(&mut self.sps),
        );
        parts.stats.full_register_unwinds += state.space.full_register_unwinds() - before;
        self.instruction_frames.clear();
        self.instruction_frames
            .extend_from_slice(state.space.instruction_frames());
        let passed_at = passed.get();
        self.reused = observer.reused;
        // Frames past the copy came from live memory read after the sample: where the kernel's
        // walk read the same slot at the sample's instant, the two must agree.
        let mut callchain_mismatch = None;
        if s.chain.len() > 1 && self.sps.last().is_some_and(|&sp| sp > copy_end) {
            let c = callchain::cross_check(
                s.chain,
                s.regs.bp(),
                &self.addrs,
                &self.sps,
                copy_end,
                &mut mem,
            );
            let cc = &mut parts.stats.callchain;
            cc.checked += 1;
            cc.confirmed_frames += c.joined_live as u64;
            if c.mismatch.is_some() {
                cc.mismatches += 1;
            }
            callchain_mismatch = c.mismatch;
        }
        let (live, thread_exited) = parts.proof.after_reads();
        if let Some(live) = live {
            parts.stats.live = live;
        }
        StackFacts {
            unwound,
            copy_frames: self.sps.iter().take_while(|&&sp| sp <= copy_end).count(),
            live_frames: self.sps.last().is_some_and(|&sp| sp > copy_end),
            callchain_mismatch,
            thread_exited,
            passed: passed_at.map(|index| Passed {
                index,
                by_instruction: self.instruction_frames.contains(&index),
            }),
            provable: parts.proof.enabled() && !s.stack.is_empty(),
            from_kernel: false,
        }
    }

    /// The frames the live reads leave standing (see [`StackFacts::reads_cut`]).
    pub fn addrs_after_reads(&self, facts: &StackFacts) -> &[u64] {
        let keep = facts.reads_cut().map_or(self.addrs.len(), |(_, keep)| keep);
        &self.addrs[..keep.min(self.addrs.len())]
    }

    /// Cuts the frames `ending` does not keep.
    pub fn apply(&mut self, ending: &Ending) {
        if let Some(keep) = ending.keep {
            self.addrs.truncate(keep);
            self.sps.truncate(keep);
            self.reused = None;
        }
    }

    /// The frames as the proof needs them.
    pub fn walk(&self, copy_end: u64) -> Walk<'_> {
        Walk {
            sps: &self.sps,
            states: &self.states,
            copy_end,
        }
    }
}

/// A sample's memory that refuses code reads in regions whose binary is still being parsed: the
/// unwind stops there (and the sample waits for the parse) instead of reading the target's code
/// through `/proc/PID/mem` as if it were JIT code. With `lowest`, once the first cell is set, it
/// notes the lowest stack address read in the second (for `walk_memo`).
struct NotPending<'m, M> {
    inner: &'m mut M,
    pending: &'m [(u64, u64)],
    lowest: Option<(&'m Cell<bool>, &'m Cell<u64>)>,
}

impl<M: Memory> NotPending<'_, M> {
    fn pending(&self, addr: u64) -> bool {
        self.pending.iter().any(|&(s, e)| addr >= s && addr < e)
    }
}

impl<M: Memory> Memory for NotPending<'_, M> {
    fn read_stack_u64(&mut self, addr: u64) -> Result<u64, ReadFailure> {
        if let Some((past, low)) = self.lowest
            && past.get()
        {
            low.set(low.get().min(addr));
        }
        self.inner.read_stack_u64(addr)
    }

    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> bool {
        !self.pending(addr) && self.inner.read_code(addr, buf)
    }

    fn jit_function(&mut self, addr: u64) -> Option<std::ops::Range<u64>> {
        if self.pending(addr) {
            return None;
        }
        self.inner.jit_function(addr)
    }

    fn jit_rule(&mut self, lookup: u64, leaf: bool) -> Option<Option<NoCfiRule>> {
        if self.pending(lookup) {
            return Some(None);
        }
        self.inner.jit_rule(lookup, leaf)
    }

    fn jit_interrupt_handler(&mut self, addr: u64) -> bool {
        !self.pending(addr) && self.inner.jit_interrupt_handler(addr)
    }

    fn jit_interpreter(&mut self, addr: u64) -> bool {
        !self.pending(addr) && self.inner.jit_interpreter(addr)
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
