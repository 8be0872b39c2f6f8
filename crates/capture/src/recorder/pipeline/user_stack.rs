//! A sample's user stack: unwinding it (copied stack, live memory with proof, the kernel's
//! callchain cross-check, a retry after re-reading the mappings) and interning it as raw trie
//! nodes, or setting it aside while a binary it needs is still being parsed.

use super::*;

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
            && !self.force
            && self.deferred_pids.contains_key(&space)
            && self.deferred_bytes + raw.len() <= DEFER_BUDGET
        {
            self.defer(Deferred {
                raw: raw.to_vec(),
                space,
                waits_for: None,
            });
            self.stats.deferred += 1;
            return None;
        }
        let key = (s.pid, s.tid);
        let sp = regs.sp();
        let copy_end = sp.saturating_add(s.stack.len() as u64);
        let space_gen = self.space_gen.get(&s.pid).copied().unwrap_or(0);
        let plan = if self.live.is_some() {
            self.outer.plan(key, s.time, copy_end, space_gen)
        } else {
            Plan::default()
        };
        let mut end = self.unwind(space, s.pid, s.tid, &regs, s.stack, &s.user_ips, plan);
        while let Some(waits_for) = self.touches_pending(space, end) {
            if let Some(raw) = raw
                && self.deferred_bytes + raw.len() <= DEFER_BUDGET
            {
                self.defer(Deferred {
                    raw: raw.to_vec(),
                    space,
                    waits_for,
                });
                self.stats.deferred += 1;
                return None;
            }
            if !self.processes.wait_loaded() {
                break; // nothing more will arrive: this is the best unwind there is
            }
            end = self.unwind(space, s.pid, s.tid, &regs, s.stack, &s.user_ips, plan);
        }
        if let Some(raw) = raw
            && self.deferred_bytes + raw.len() <= DEFER_BUDGET
            && self.waits_for_jvm(space, s.pid, end)
        {
            self.defer(Deferred {
                raw: raw.to_vec(),
                space,
                waits_for: None,
            });
            self.stats.deferred += 1;
            return None;
        }
        let mut passed = self.passed_at;
        let used_live = self.sps.last().is_some_and(|&s| s > copy_end);
        let beyond_copy = used_live || end == StackEnd::Stopped;
        let copy_only = |p: &mut Pipeline, reason| {
            // Keep only what the copy proves.
            let keep = p.sps.iter().take_while(|&&s| s <= copy_end).count();
            p.addrs.truncate(keep.max(1));
            p.sps.truncate(keep.max(1));
            p.reused = None;
            StackEnd::Truncated(reason)
        };
        if passed.is_some_and(|b| self.instruction_frames.contains(&b)) && beyond_copy {
            // `B`'s stack pointer reached as a signal-interrupted instruction, not through a
            // call that wrote the watched slot: the proof does not apply.
            passed = None;
            end = copy_only(self, TruncateReason::LiveUnproven);
        } else if passed.is_some() && beyond_copy && !self.outer.confirm(key) {
            // The watch fired: the stack above `B` changed at some point since it was armed,
            // perhaps before the live reads.
            passed = None;
            end = copy_only(self, TruncateReason::StackChanged);
        }
        let needs_proof = self.live.is_some()
            && end == StackEnd::Truncated(TruncateReason::StackCopyExhausted)
            && !s.stack.is_empty();
        if needs_proof {
            end = StackEnd::Truncated(TruncateReason::LiveUnproven);
            // Watch a frame well inside the copy, so that later samples can be proven.
            let inside = |lim: u64| (1..self.sps.len()).rev().find(|&i| self.sps[i] <= lim);
            let b = inside(copy_end.saturating_sub(outer_cache::SLACK_BYTES))
                .or_else(|| inside(copy_end));
            if let Some(b) = b.filter(|&b| b < self.states.len())
                && self.outer.should_arm(key, s.time)
            {
                self.outer.arm(key, self.states[b], space_gen);
            }
        }
        let addrs = std::mem::take(&mut self.addrs);
        let mut node = NO_NODE;
        let mut upto = addrs.len();
        let mut depth = addrs.len();
        match (end, self.reused) {
            (StackEnd::Stopped, Some(outer)) => {
                // The last frame is `B`, already in the cached node with all its callers.
                node = outer.node;
                upto -= 1;
                depth = upto + outer.frames;
                self.outer.hit(outer.frames);
            }
            (StackEnd::Truncated(reason), _) => {
                *self.stats.truncated.entry(reason).or_default() += 1;
                node = self.node(node, RawKind::Truncated(reason), 0);
            }
            _ => {}
        }
        let max = usize::from(self.stats.callchain.max_entries);
        if max > 0 && s.user_ips.len() >= max && depth > s.user_ips.len() {
            self.stats.callchain.capped += 1;
        }
        // A whole, proven stack read past the copy: keep its part from `B` on.
        let keep_b = passed.filter(|_| end == StackEnd::Root && used_live);
        let mut outer_in_files = true;
        let mut node_at_b = None;
        for i in (0..upto).rev() {
            let addr = addrs[i];
            let is_return = i > 0 && !self.instruction_frames.contains(&i);
            let kind = self.user_kind(space, s.pid, addr, is_return);
            if keep_b.is_some_and(|b| i >= b) {
                // JIT code is named through maps that change without the stack changing.
                outer_in_files &= matches!(kind, RawKind::User(m, _)
                    if self.mappings[m as usize].binary.module.is_some());
            }
            // A return address was read just below its caller's stack pointer.
            let live = is_return && self.sps.get(i).is_some_and(|&csp| csp > copy_end);
            node = self.node_live(node, kind, addr, live);
            if keep_b == Some(i) {
                node_at_b = Some(node);
            }
        }
        if let (Some(b), Some(node), true) = (keep_b, node_at_b, outer_in_files) {
            // Valid for copies ending between the same two frames (same frames marked live).
            let sps = &self.sps[b..upto];
            let lo = sps.iter().rev().find(|&&s| s <= copy_end).copied();
            let hi = sps.iter().find(|&&s| s > copy_end).copied();
            if let (Some(lo), Some(hi), Some(&state)) = (lo, hi, self.states.get(b)) {
                let frames = upto - b;
                self.outer.keep(
                    key,
                    Outer {
                        state,
                        lo,
                        hi,
                        node,
                        frames,
                    },
                );
            }
        }
        self.addrs = addrs;
        Some(node)
    }

    /// Whether the unwind just made (into `addrs`) may be wrong for want of a binary still being
    /// parsed, and which file it waits for: a frame lies in such a region (that region's file),
    /// or a return address failed its check in a process that has one (None: the region to blame
    /// is not in `addrs`; any arrival in the process will do). Every other early end happened at
    /// the last frame in `addrs`, so its region is checked already.
    pub(super) fn touches_pending(&self, pid: u32, end: StackEnd) -> Option<Option<FileKey>> {
        if self.force || !self.processes.has_pending(pid) {
            return None;
        }
        for (i, &a) in self.addrs.iter().enumerate() {
            let lookup = if i > 0 { a.wrapping_sub(1) } else { a };
            if let Some(key) = self.processes.pending_file(pid, lookup) {
                return Some(Some(key.clone()));
            }
        }
        (end == StackEnd::Truncated(TruncateReason::NotAfterCall)).then_some(None)
    }

    /// Whether the sample caught the thread inside `execve`: in kernel mode, after (or at) an exec
    /// seen in this recording, with user registers that still point into the old image.
    pub(super) fn in_exec(&mut self, s: &Sample<'_>, ip: u64, space: u32) -> bool {
        s.kernel_mode
            && self
                .exec_times
                .get(&s.pid)
                .is_some_and(|&t| s.time >= t.saturating_sub(1_000_000))
            && self.processes.get(space).space.region(ip).is_none()
    }

    /// Unwinds a sample of `pid` in address space `space` (usually the same).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn unwind(
        &mut self,
        space: u32,
        pid: u32,
        tid: u32,
        regs: &Registers,
        stack: &[u8],
        chain: &[u64],
        plan: Plan,
    ) -> StackEnd {
        let mut end = self.unwind_once(space, pid, tid, regs, stack, chain, plan);
        // A mapping the tracker has not seen yet (a record still in another ring, or created
        // before attach): re-read /proc/PID/maps, at most every 100 ms per process, and retry.
        // A kept-aside space is as it was: nothing to re-read.
        if end == StackEnd::Truncated(TruncateReason::UnmappedAddress) && space == pid {
            let now = Instant::now();
            let due = self
                .refreshed
                .get(&pid)
                .is_none_or(|t| now.duration_since(*t).as_millis() >= 100);
            if due {
                self.refreshed.insert(pid, now);
                self.processes.refresh(pid);
                *self.space_gen.entry(pid).or_default() += 1;
                end = self.unwind_once(space, pid, tid, regs, stack, chain, Plan::default());
            }
        }
        end
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn unwind_once(
        &mut self,
        space: u32,
        pid: u32,
        tid: u32,
        regs: &Registers,
        stack: &[u8],
        chain: &[u64],
        plan: Plan,
    ) -> StackEnd {
        let sp = regs.sp();
        let copy_end = sp.saturating_add(stack.len() as u64);
        let state = self.processes.get(space);
        self.pending_ranges.clear();
        state.pending_ranges(&mut self.pending_ranges);
        let live = self.live.as_mut().map(|live| {
            live.start(pid, tid, sp.saturating_add(stack.len() as u64), stack);
            live as &mut dyn crate::unwind::MemoryReader
        });
        let mut mem = JitMemory {
            stack: SampleStack {
                base: sp,
                bytes: stack,
                fallback: live,
            },
            jit: self.jit.process(pid),
        };
        self.states.clear();
        self.states.push((*regs, false));
        let mut observed = Observed {
            inner: &mut mem,
            states: &mut self.states,
            copy_end,
            proof: plan.proof.map(|sp_b| (sp_b, plan.reuse)),
            passed_at: None,
            reused: None,
        };
        let mut guarded = NotPending {
            inner: &mut observed,
            pending: &self.pending_ranges,
        };
        let memory: &mut dyn Memory = if self.pending_ranges.is_empty() {
            guarded.inner
        } else {
            &mut guarded
        };
        let before = state.space.full_register_unwinds();
        let mut end =
            state
                .space
                .unwind_with_sps(regs, memory, &mut self.addrs, Some(&mut self.sps));
        self.stats.full_register_unwinds += state.space.full_register_unwinds() - before;
        self.instruction_frames.clear();
        self.instruction_frames
            .extend_from_slice(state.space.instruction_frames());
        self.passed_at = observed.passed_at;
        self.reused = observed.reused;
        // Frames past the copy came from live memory read after the sample: where the kernel's
        // walk read the same slot at the sample's instant, the two must agree.
        let bp = regs.bp();
        if chain.len() > 1 && self.sps.last().is_some_and(|&s| s > copy_end) {
            let c = callchain::cross_check(chain, bp, &self.addrs, &self.sps, copy_end, &mut mem);
            let cc = &mut self.stats.callchain;
            cc.checked += 1;
            cc.confirmed_frames += c.joined_live as u64;
            if let Some(i) = c.mismatch {
                cc.mismatches += 1;
                self.addrs.truncate(i);
                self.sps.truncate(i);
                self.passed_at = None;
                end = StackEnd::Truncated(TruncateReason::StackChanged);
            }
        }
        if let Some(live) = &self.live {
            self.stats.live = live.stats();
            if live.used() > 0 && !live.thread_alive() {
                // Keep only the frames the sample's own copy proves.
                let keep = self.sps.iter().take_while(|&&s| s <= copy_end).count();
                self.addrs.truncate(keep.max(1));
                self.passed_at = None;
                end = StackEnd::Truncated(TruncateReason::ThreadExited);
            }
        }
        end
    }
}

/// A sample's memory that refuses code reads in regions whose binary is still being parsed: the
/// unwind stops there (and the sample waits for the parse) instead of reading the target's code
/// through `/proc/PID/mem` as if it were JIT code.
struct NotPending<'m, M> {
    inner: &'m mut M,
    pending: &'m [(u64, u64)],
}

impl<M: Memory> NotPending<'_, M> {
    fn pending(&self, addr: u64) -> bool {
        self.pending.iter().any(|&(s, e)| addr >= s && addr < e)
    }
}

impl<M: Memory> Memory for NotPending<'_, M> {
    fn read_stack_u64(&mut self, addr: u64) -> Result<u64, ReadFailure> {
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

    fn jit_pushed_return(&mut self, ra: u64) -> bool {
        !self.pending(ra) && self.inner.jit_pushed_return(ra)
    }

    fn code_refused(&mut self, addr: u64) -> bool {
        self.inner.code_refused(addr)
    }

    fn copied_len(&self) -> Option<usize> {
        self.inner.copied_len()
    }

    fn on_frame(&mut self, index: usize, regs: &Registers, full: bool) -> bool {
        self.inner.on_frame(index, regs, full)
    }
}
