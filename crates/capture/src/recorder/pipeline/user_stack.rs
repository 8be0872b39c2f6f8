//! A sample's user stack, in order: set aside behind its space's waiting samples, unwound (again
//! after re-reading the mappings, or after a binary's parse arrives), ended by
//! [`stack_end`], interned as raw trie nodes.

use std::sync::Arc;

use crate::kernel_walk::{KernelStack, WalkStop};
use crate::perf_event::Sample;
use crate::process::FileKey;
use crate::unwind::{Registers, StackEnd, TruncateReason};

use super::Pipeline;
use crate::recorder::deferral::{Deferred, Wait};
use crate::recorder::live_proof::ProvenOuter;
use crate::recorder::outer_cache::Outer;
use crate::recorder::raw::{NO_NODE, RawFrame, RawKind};
use crate::recorder::stack_end::{StackFacts, stack_end};
use crate::recorder::user_unwind::{PlanFor, UnwindParts, UserSample};
use crate::recorder::walk_memo::Memo;

impl Pipeline {
    /// Unwinds (in address space `space`) and interns a sample's user stack; returns its leaf
    /// node, or None when the sample was set aside to wait for a binary.
    pub(super) fn user_stack(
        &mut self,
        s: &Sample<'_>,
        regs: Registers,
        raw: Option<&[u8]>,
        space: u32,
    ) -> Option<u32> {
        // Behind a sample of the same space that waits: wait too, in order.
        if let Some(raw) = raw
            && !self.deferrals.force
            && self.deferrals.waiting(space)
            && self.deferrals.has_room(raw.len())
        {
            self.defer(raw, space, Wait::Behind);
            return None;
        }
        // Its in-kernel walk goes on as task work: wait for the rest (it comes as soon as the
        // thread is back on a CPU).
        if let Some(raw) = raw
            && !self.deferrals.force
            && self.alloc_weight.is_none()
            && self.deferrals.has_room(raw.len())
            && self
                .kernel_walk
                .as_ref()
                .is_some_and(|kw| kw.in_flight(s.tid, s.time, crate::perf_event::monotonic_ns()))
        {
            self.defer(
                raw,
                space,
                Wait::Walk {
                    tid: s.tid,
                    time: s.time,
                },
            );
            return None;
        }
        let key = (s.pid, s.tid);
        let claimed = self.kernel_walk_of(s, regs);
        // Not walked, its stack lying in its copy: unwound from that alone (`note_thread_top`).
        let in_copy = claimed.as_ref().is_some_and(|w| w.stop == WalkStop::InCopy);
        let walk = claimed.clone().filter(|_| !in_copy);
        let space_gen = self.lifetimes.space_gen(s.pid);
        let mut input = UserSample {
            space,
            pid: s.pid,
            tid: s.tid,
            regs,
            stack: s.stack,
            chain: &s.user_ips,
            kernel: walk.as_deref(),
            kernel_reuse: Default::default(),
        };
        let copy_end = input.copy_end();
        if let Some(w) = walk.as_deref() {
            input.kernel_reuse = self.walk_memos.usable(key, w, copy_end, space_gen);
        }
        let plan = Some(PlanFor {
            key,
            time: s.time,
            space_gen,
        });
        let mut facts = self.unwind(&input, plan);
        while let Some(waits_for) = self.touches_pending(space, &facts) {
            if let Some(raw) = raw
                && self.deferrals.has_room(raw.len())
            {
                self.keep_walk(s, claimed);
                self.defer(raw, space, Wait::File(waits_for));
                return None;
            }
            if !self.processes.wait_loaded() {
                break; // nothing more will arrive: this is the best unwind there is
            }
            facts = self.unwind(&input, plan);
        }
        if let Some(raw) = raw
            && self.deferrals.has_room(raw.len())
            && self.waits_for_jvm(space, s.pid, facts.unwound)
        {
            self.keep_walk(s, claimed);
            self.defer(raw, space, Wait::File(None));
            return None;
        }
        let proof = &mut self.proof;
        let ending = stack_end(&facts, || proof.confirm(key));
        self.unwinder.apply(&ending);
        // The outermost frame's stack pointer, when the stack has more than the leaf.
        let outermost = match self.unwinder.sps.as_slice() {
            [_, .., top] => Some(*top),
            _ => None,
        };
        self.note_thread_top(s.pid, s.tid, ending.end, outermost, in_copy);
        if ending.arm_watch {
            let walk = self.unwinder.walk(copy_end);
            self.proof.arm_inside(key, s.time, &walk, space_gen);
        }
        let addrs = std::mem::take(&mut self.unwinder.addrs);
        // The walk ended at a binary whose rows were not asked for (rows on demand): ask for it
        // and for those of every frame this unwind reached. (A process not read yet is read by
        // this unwind; its next walk asks.)
        if let Some(w) = walk.as_deref()
            && w.stop == crate::kernel_walk::WalkStop::Pending
            && let Some(kw) = self.kernel_walk.as_mut()
            && let Some(state) = self.processes.existing(s.pid)
        {
            kw.want_binaries_at(addrs.iter().copied().chain([w.end.0]), &state.space);
        }
        let mut node = NO_NODE;
        let mut upto = addrs.len();
        let mut depth = addrs.len();
        // Frames above the first one interned below (the trie path counts from the root).
        let mut outer_frames = 0;
        let mut reused_kernel_outer = None;
        match (ending.end, self.unwinder.reused) {
            (StackEnd::Stopped, Some(outer)) => {
                // The last frame is `B`, already in the cached node with all its callers.
                node = outer.node;
                upto -= 1;
                depth = upto + outer.frames;
                outer_frames = outer.frames;
                if facts.from_kernel {
                    reused_kernel_outer = Some(outer);
                    let use_ = self.stats.kernel_walk.get_or_insert_with(Default::default);
                    use_.outer_reused += 1;
                    use_.frames_reused += outer.frames as u64;
                } else {
                    self.proof.reused(outer.frames);
                }
            }
            (StackEnd::Truncated(reason), _) => {
                *self.stats.truncated.entry(reason).or_default() += 1;
                node = self.node(node, RawKind::Truncated(reason), 0);
                outer_frames = 1;
            }
            _ => {}
        }
        let max = usize::from(self.stats.callchain.max_entries);
        if max > 0 && s.user_ips.len() >= max && depth > s.user_ips.len() {
            self.stats.callchain.capped += 1;
        }
        // A whole, proven stack read past the copy: keep its part from `B` on.
        let keep_b = ending.cache_outer_from;
        // A whole stack unwound with its kernel walk (perhaps reusing the thread's last): keep
        // its part past the copy for the thread's next samples (see `walk_memo`). The newest is
        // kept, so the part reused stays close to the leaf as the stack deepens.
        let whole = ending.end == StackEnd::Root || reused_kernel_outer.is_some();
        let memo_from = match (facts.from_kernel && whole, self.unwinder.past_copy) {
            (true, Some((index, _, _))) if index < upto => Some(index),
            _ => None,
        };
        let mut memo_in_files = true;
        let mut node_at_memo = None;
        // An allocation's leaf frames that are the sampler's own (its library, or the probed
        // function's entry) go: the leaf is the program's caller.
        let own = match (&self.alloc, self.alloc_weight) {
            (Some(sampler), Some(_)) => (0..upto)
                .take_while(|&i| {
                    let path = self
                        .processes
                        .binary_at(space, addrs[i])
                        .map(|(_, b)| &*b.path);
                    sampler.is_own_frame(i, path)
                })
                .count(),
            _ => 0,
        };
        let mut outer_in_files = true;
        let mut node_at_b = None;
        let mut path = self.tables.take_path(s.tid);
        for (step, i) in (own..upto).rev().enumerate() {
            let addr = addrs[i];
            let is_return = i > 0 && !self.unwinder.instruction_frames.contains(&i);
            let lookup = if is_return {
                addr.wrapping_sub(1)
            } else {
                addr
            };
            let found = self.processes.binary_at(space, lookup);
            let kind = self.tables.user_kind(found, s.pid, is_return);
            // JIT code is named through maps that change without the stack changing.
            let in_files = || {
                matches!(kind, RawKind::User(m, _)
                    if self.tables.mapping(m).binary.module.is_some())
            };
            if keep_b.is_some_and(|b| i >= b) {
                outer_in_files &= in_files();
            }
            if memo_from.is_some_and(|m| i >= m) {
                memo_in_files &= in_files();
            }
            // A return address was read just below its caller's stack pointer.
            let live = is_return
                && !facts.from_kernel
                && self.unwinder.sps.get(i).is_some_and(|&csp| csp > copy_end);
            let frame = RawFrame {
                kind,
                address: addr,
                live,
            };
            node = self
                .tables
                .node_on_path(&mut path, outer_frames + step, node, frame);
            if keep_b == Some(i) {
                node_at_b = Some(node);
            }
            if memo_from == Some(i) {
                node_at_memo = Some(node);
            }
        }
        self.tables.put_path(s.tid, path);
        if let (Some(from), Some(node), true, Some(walk), Some((_, state, low))) = (
            memo_from,
            node_at_memo,
            memo_in_files,
            walk.as_ref(),
            self.unwinder.past_copy,
        ) {
            let outer = Outer {
                state,
                lo: 0,
                hi: u64::MAX,
                node,
                frames: upto - from + reused_kernel_outer.map_or(0, |o| o.frames),
            };
            // Above the frame it stopped at, the reused part read no lower than its own memo.
            let low = match &reused_kernel_outer {
                Some(o) => low.min(self.walk_memos.used(key, o).unwrap_or(0)),
                None => low,
            };
            self.walk_memos.keep(
                key,
                Memo {
                    outer,
                    low,
                    walk: walk.clone(),
                    space_gen,
                },
            );
        }
        if let (Some(from), Some(node), true) = (keep_b, node_at_b, outer_in_files) {
            let walk = self.unwinder.walk(copy_end);
            self.proof
                .keep_outer(key, &walk, ProvenOuter { from, upto, node });
        }
        self.unwinder.addrs = addrs;
        Some(node)
    }

    /// Sets the sample recorded as `raw` aside, to be unwound in `space` once what it waits for
    /// has come.
    fn defer(&mut self, raw: &[u8], space: u32, wait: Wait) {
        self.deferrals.defer(Deferred {
            raw: raw.to_vec(),
            space,
            wait,
            off_cpu: self.off_weight,
            alloc: self.alloc_weight,
        });
        self.stats.deferred += 1;
    }

    /// Whether the unwind just made may be wrong for want of a binary still being parsed, and
    /// which file it waits for: a frame the live reads leave standing lies in such a region (that
    /// region's file), or a return address failed its check in a process that has one (None: the
    /// region to blame is not among the frames; any arrival in the process will do). Every other
    /// early end happened at the last frame, so its region is checked already.
    fn touches_pending(&self, pid: u32, facts: &StackFacts) -> Option<Option<FileKey>> {
        if self.deferrals.force || !self.processes.has_pending(pid) {
            return None;
        }
        for (i, &a) in self.unwinder.addrs_after_reads(facts).iter().enumerate() {
            let lookup = if i > 0 { a.wrapping_sub(1) } else { a };
            if let Some(key) = self.processes.pending_file(pid, lookup) {
                return Some(Some(key.clone()));
            }
        }
        (facts.end_after_reads() == StackEnd::Truncated(TruncateReason::NotAfterCall))
            .then_some(None)
    }

    /// Unwinds a sample; when it reaches a mapping the tracker has not seen yet (a record still
    /// in another ring, or created before attach), re-reads `/proc/PID/maps` (at most every
    /// 100 ms per process) and unwinds again. A kept-aside space is as it was: nothing to
    /// re-read.
    /// The in-kernel walk made at sample `s`: claimed from the walk's ring the first time, or
    /// kept from when the sample was set aside.
    fn kernel_walk_of(&mut self, s: &Sample<'_>, regs: Registers) -> Option<Arc<KernelStack>> {
        if let Some(w) = self.kept_walks.remove(&(s.tid, s.time)) {
            self.kept_dump_bytes -= w.dump_bytes();
            return Some(w);
        }
        // The walk program runs at the sampling events only: an allocation uprobe's sample has
        // no walk to wait for.
        if self.alloc_weight.is_some() {
            return None;
        }
        let kw = self.kernel_walk.as_mut()?;
        let walk = kw.claim(s.tid, s.time, (regs.ip(), regs.sp(), regs.bp()));
        let use_ = self.stats.kernel_walk.get_or_insert_with(Default::default);
        match &walk {
            None if kw.tracks(s.pid) => use_.no_walk += 1,
            Some(w) if w.stop == WalkStop::InCopy => use_.in_copy += 1,
            _ => {}
        }
        walk
    }

    /// Tells the in-kernel walk where thread `tid`'s outermost frame lies after a whole stack
    /// (`outermost`: that frame's stack pointer, None for a stack of the leaf alone), so that
    /// samples whose copy reaches it are not walked; or, after a sample not walked for that
    /// reason (`in_copy`) whose stack was not whole, that it is not there. A stack of one frame
    /// says nothing (a leaf in a function that starts threads is a root wherever it is).
    fn note_thread_top(
        &mut self,
        pid: u32,
        tid: u32,
        end: StackEnd,
        outermost: Option<u64>,
        in_copy: bool,
    ) {
        // A process with JIT code (its runtime names code in a perf map or jitdump) has its
        // stacks walked at every sample, even when the copy holds them: the walk takes the code
        // bytes before return addresses into JIT code at the sample's instant (the runtime moves
        // and replaces that code: read later, they may be another function's, and the return
        // address would seem to follow no call). Its threads go in and out of JIT code too often
        // for a thread's last stack to tell.
        let has_jit = end == StackEnd::Root && self.jit.names_code(pid);
        let Some(kw) = self.kernel_walk.as_mut() else {
            return;
        };
        match (end, outermost) {
            (StackEnd::Root, Some(_)) if has_jit && in_copy => kw.thread_not_in_copy(tid),
            (StackEnd::Root, Some(top)) if !has_jit => kw.thread_whole(tid, top),
            (StackEnd::Truncated(_), _) if in_copy => kw.thread_not_in_copy(tid),
            _ => {}
        }
    }

    /// Keeps a sample's walk while the sample is set aside; its stack dumps only while those
    /// kept stay under the limit (`RecordOptions::kernel_walk_kept_dumps`; past it the sample is
    /// unwound without them).
    fn keep_walk(&mut self, s: &Sample<'_>, walk: Option<Arc<KernelStack>>) {
        let Some(mut w) = walk else {
            return;
        };
        if w.dump_bytes() > 0 && self.kept_dump_bytes + w.dump_bytes() > self.kept_dump_limit {
            w = Arc::new(w.without_dumps());
            if let Some(st) = self.stats.kernel_walk.as_mut() {
                st.dumps_dropped += 1;
            }
        }
        self.kept_dump_bytes += w.dump_bytes();
        if let Some(replaced) = self.kept_walks.insert((s.tid, s.time), w) {
            self.kept_dump_bytes -= replaced.dump_bytes();
        }
    }

    fn unwind(&mut self, s: &UserSample<'_>, plan: Option<PlanFor>) -> StackFacts {
        let facts = self.unwind_once(s, plan);
        if facts.end_after_reads() == StackEnd::Truncated(TruncateReason::UnmappedAddress)
            && s.space == s.pid
            && self.lifetimes.refresh_due(s.pid)
        {
            self.processes.refresh(s.pid);
            return self.unwind_once(s, None);
        }
        facts
    }

    fn unwind_once(&mut self, s: &UserSample<'_>, plan: Option<PlanFor>) -> StackFacts {
        let mut parts = UnwindParts {
            processes: &mut self.processes,
            jit: &mut self.jit,
            proof: &mut self.proof,
            stats: &mut self.stats,
        };
        self.unwinder.unwind(&mut parts, s, plan)
    }
}
