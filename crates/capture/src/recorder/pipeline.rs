//! The hot path: records in, raw stacks out.
//!
//! Per sample it unwinds to raw addresses and interns them — one raw frame per distinct address
//! per mapping, one raw trie node per distinct (caller, frame) — then queues the sample. Frames
//! past the copied stack are read live only with a proof from [`super::outer_cache`] (which also
//! hands back the interned outer part of a deep stack that is proven unchanged), and are
//! cross-checked against the kernel's callchain ([`crate::unwind::callchain`]).
//! [`Pipeline::take_batch`] hands everything new to the [`super::builder::Builder`], which
//! symbolizes distinct frames and builds the profile on its own thread.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::jit::{JitMaps, JitMemory, JitName};
use crate::perf_event::{Record, Sample};
use crate::process::{BinaryFile, Processes, thread_name};
use crate::unwind::{LiveMemory, Registers, SampleStack, StackEnd, TruncateReason, callchain};

use super::outer_cache::{self, Observed, Outer, OuterCache, OuterCacheStats, Plan};

/// Counts kept while recording.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Samples taken.
    pub samples: u64,
    /// Samples the kernel dropped (`PERF_RECORD_LOST`).
    pub lost: u64,
    /// Samples whose stack ends in a `[truncated: …]` frame, by reason.
    pub truncated: HashMap<TruncateReason, u64>,
    /// Distinct threads seen.
    pub threads: u64,
    /// Reads of live process memory past the copied stacks.
    pub live: crate::unwind::live_memory::LiveStats,
    /// Samples unwound with every register tracked (CFI that needs more than rip/rsp/rbp).
    pub full_register_unwinds: u64,
    /// Cross-checks of live frames against the kernel's frame-pointer callchain.
    pub callchain: CallchainStats,
    /// Reuse of the outer part of deep stacks.
    pub outer_cache: OuterCacheStats,
}

/// Counts of the kernel callchain cross-check (see [`crate::unwind::callchain`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallchainStats {
    /// The most entries a callchain may hold (`sample_max_stack`); 0 when not requested.
    pub max_entries: u16,
    /// Samples with frames from live memory that were cross-checked.
    pub checked: u64,
    /// Live-memory frames confirmed by the kernel's return address at the same stack slot.
    pub confirmed_frames: u64,
    /// Samples cut as `stack-changed` because a live frame disagreed with the kernel's.
    pub mismatches: u64,
    /// Samples whose callchain was cut at `max_entries` while the stack went deeper.
    pub capped: u64,
}

impl Stats {
    /// Total truncated samples.
    pub fn truncated_total(&self) -> u64 {
        self.truncated.values().sum()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum RawKind {
    /// User code in raw mapping `u32`; `true` for a return address (symbolized at address - 1).
    User(u32, bool),
    /// An address in no known mapping.
    Unknown,
    /// Kernel code.
    Kernel,
    /// Time in the kernel without a callchain (kernel threads without `--kernel`).
    KernelOnly,
    /// Time in `execve` after recording began but before the new image: the user registers
    /// still describe the old image, which is not profiled.
    Exec,
    /// The explicit end of a stack that could not be unwound further.
    Truncated(TruncateReason),
}

/// A distinct frame of raw stacks: an address of a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RawFrame {
    pub kind: RawKind,
    pub address: u64,
    /// Unwound from live memory past the sample's copied stack.
    pub live: bool,
}

/// A mapping raw frames refer to.
#[derive(Debug, Clone)]
pub(crate) struct RawMapping {
    /// The process it was first seen in (JIT code is named through that process's maps).
    pub pid: u32,
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    pub binary: Arc<BinaryFile>,
}

/// A sample waiting for its stack to be translated.
pub(crate) struct Pending {
    pub time: u64,
    pub pid: u32,
    pub tid: u32,
    pub node: u32,
    pub nanos: i64,
}

/// Everything new since the previous batch. Indexes continue across batches.
#[derive(Default)]
pub(crate) struct Batch {
    pub mappings: Vec<RawMapping>,
    pub frames: Vec<RawFrame>,
    /// For each new frame in code without a file image: its JIT map name, looked up when the
    /// frame was first seen (maps change as code is compiled and freed).
    pub jit_names: Vec<Option<JitName>>,
    /// Trie nodes `(parent or NO_NODE, frame)`.
    pub nodes: Vec<(u32, u32)>,
    pub samples: Vec<Pending>,
    /// Thread names `(pid, tid, name)`, in order; `pid == tid` also names the process.
    pub names: Vec<(u32, u32, String)>,
    pub stats: Stats,
}

/// The parent of a root node.
pub(crate) const NO_NODE: u32 = u32::MAX;

/// Turns perf records into raw stacks.
pub struct Pipeline {
    /// Counts.
    pub stats: Stats,
    processes: Processes,
    jit: JitMaps,
    kernel: bool,
    period_nanos: Option<i64>,
    mappings: Vec<RawMapping>,
    mapping_index: HashMap<(u64, usize), u32>,
    frames: Vec<RawFrame>,
    frame_index: HashMap<RawFrame, u32>,
    nodes: Vec<(u32, u32)>,
    node_index: HashMap<(u32, u32), u32>,
    sent: (usize, usize, usize),
    pending: Vec<Pending>,
    names: Vec<(u32, u32, String)>,
    threads: std::collections::HashSet<(u32, u32)>,
    refreshed: HashMap<u32, Instant>,
    exec_times: HashMap<u32, u64>,
    addrs: Vec<u64>,
    sps: Vec<u64>,
    /// Frames of the last unwind to symbolize as instructions, not return addresses.
    instruction_frames: Vec<usize>,
    live: Option<LiveMemory>,
    callchain: bool,
    /// Each frame's complete unwinder state, for frames inside the copy (see [`Observed`]).
    states: Vec<(Registers, bool)>,
    outer: OuterCache,
    /// Frame index at which the last unwind passed through its thread's cached state.
    passed_at: Option<usize>,
    /// The cached outer part the last unwind stopped for.
    reused: Option<Outer>,
    /// Per process: bumped whenever its executable mappings change.
    space_gen: HashMap<u32, u64>,
}

impl Pipeline {
    /// A pipeline. `period_nanos` converts one sample to CPU time when the event period is not in
    /// nanoseconds (hardware cycles); None for `cpu-clock`.
    pub fn new(kernel: bool, period_nanos: Option<i64>) -> Pipeline {
        Pipeline {
            stats: Stats::default(),
            processes: Processes::new(),
            jit: JitMaps::new(),
            kernel,
            period_nanos,
            mappings: Vec::new(),
            mapping_index: HashMap::new(),
            frames: Vec::new(),
            frame_index: HashMap::new(),
            nodes: Vec::new(),
            node_index: HashMap::new(),
            sent: (0, 0, 0),
            pending: Vec::new(),
            names: Vec::new(),
            threads: std::collections::HashSet::new(),
            refreshed: HashMap::new(),
            exec_times: HashMap::new(),
            addrs: Vec::new(),
            sps: Vec::new(),
            instruction_frames: Vec::new(),
            live: None,
            callchain: kernel,
            states: Vec::new(),
            outer: OuterCache::default(),
            passed_at: None,
            reused: None,
            space_gen: HashMap::new(),
        }
    }

    /// Cross-checks frames read from live memory against the kernel's frame-pointer callchain of
    /// each sample (requested with at most `max_entries` entries; 0: not requested).
    pub fn set_user_callchain(&mut self, max_entries: u16) {
        self.stats.callchain.max_entries = max_entries;
        self.callchain = self.kernel || max_entries > 0;
    }

    /// Whether records of this event carry a callchain (kernel frames, user frames, or both).
    pub fn callchain(&self) -> bool {
        self.callchain
    }

    /// Continues unwinding past each sample's copied stack by reading the live process, at most
    /// `budget` bytes per sample (see [`crate::unwind::live_memory`]). Off until called.
    pub fn set_live_stack_budget(&mut self, budget: usize) {
        self.live = (budget > 0).then(|| LiveMemory::new(budget));
    }

    /// Whether records of this event carry a kernel callchain.
    pub fn kernel(&self) -> bool {
        self.kernel
    }

    /// Handles a side-band record (everything but samples) taken at `time`.
    pub fn side_band(&mut self, time: u64, record: &Record<'_>) {
        match *record {
            Record::Mmap2 {
                pid,
                addr,
                len,
                pgoff,
                file_key,
                filename,
            } => {
                *self.space_gen.entry(pid).or_default() += 1;
                self.processes
                    .mmap(pid, addr, len, pgoff, file_key, filename)
            }
            Record::Comm {
                pid,
                tid,
                name,
                exec,
            } => {
                if exec {
                    *self.space_gen.entry(pid).or_default() += 1;
                    self.processes.exec(pid);
                    self.jit.exec(pid);
                    self.exec_times.insert(pid, time);
                }
                if self.threads.contains(&(pid, tid)) {
                    self.names.push((pid, tid, name.to_string()));
                }
            }
            Record::Fork { pid, ppid, .. } => self.processes.fork(pid, ppid),
            Record::Lost(n) => self.stats.lost += n,
            Record::Exit { pid, tid } => self.outer.forget((pid, tid)),
            Record::Sample(_) | Record::Other => {}
        }
    }

    /// Handles one sample: unwind, intern, queue.
    pub fn sample(&mut self, s: &Sample<'_>) {
        self.stats.samples += 1;
        self.thread(s.pid, s.tid);
        let mut node = NO_NODE;
        match s.user_regs {
            Some(regs) if self.in_exec(s, regs.ip()) => node = self.node(node, RawKind::Exec, 0),
            None => {
                if s.kernel_ips.is_empty() {
                    node = self.node(node, RawKind::KernelOnly, 0);
                }
            }
            Some(regs) => node = self.user_stack(s, regs),
        }
        for &ip in s.kernel_ips.iter().rev() {
            node = self.node(node, RawKind::Kernel, ip);
        }
        let nanos = self.period_nanos.unwrap_or(s.period as i64);
        self.pending.push(Pending {
            time: s.time,
            pid: s.pid,
            tid: s.tid,
            node,
            nanos,
        });
    }

    /// Unwinds and interns a sample's user stack; returns its leaf node.
    fn user_stack(&mut self, s: &Sample<'_>, regs: Registers) -> u32 {
        let key = (s.pid, s.tid);
        let sp = regs.sp();
        let copy_end = sp.saturating_add(s.stack.len() as u64);
        let space_gen = self.space_gen.get(&s.pid).copied().unwrap_or(0);
        let plan = if self.live.is_some() {
            self.outer.plan(key, s.time, copy_end, space_gen)
        } else {
            Plan::default()
        };
        let mut end = self.unwind(s.pid, s.tid, &regs, s.stack, &s.user_ips, plan);
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
            let kind = self.user_kind(s.pid, addr, is_return);
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
        node
    }

    /// Whether the sample caught the thread inside `execve`: in kernel mode, after (or at) an exec
    /// seen in this recording, with user registers that still point into the old image.
    fn in_exec(&mut self, s: &Sample<'_>, ip: u64) -> bool {
        s.kernel_mode
            && self
                .exec_times
                .get(&s.pid)
                .is_some_and(|&t| s.time >= t.saturating_sub(1_000_000))
            && self.processes.get(s.pid).space.region(ip).is_none()
    }

    fn unwind(
        &mut self,
        pid: u32,
        tid: u32,
        regs: &Registers,
        stack: &[u8],
        chain: &[u64],
        plan: Plan,
    ) -> StackEnd {
        let mut end = self.unwind_once(pid, tid, regs, stack, chain, plan);
        // A mapping the tracker has not seen yet (a record still in another ring, or created
        // before attach): re-read /proc/PID/maps, at most every 100 ms per process, and retry.
        if end == StackEnd::Truncated(TruncateReason::UnmappedAddress) {
            let now = Instant::now();
            let due = self
                .refreshed
                .get(&pid)
                .is_none_or(|t| now.duration_since(*t).as_millis() >= 100);
            if due {
                self.refreshed.insert(pid, now);
                self.processes.refresh(pid);
                *self.space_gen.entry(pid).or_default() += 1;
                end = self.unwind_once(pid, tid, regs, stack, chain, Plan::default());
            }
        }
        end
    }

    fn unwind_once(
        &mut self,
        pid: u32,
        tid: u32,
        regs: &Registers,
        stack: &[u8],
        chain: &[u64],
        plan: Plan,
    ) -> StackEnd {
        let sp = regs.sp();
        let copy_end = sp.saturating_add(stack.len() as u64);
        let state = self.processes.get(pid);
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
        let before = state.space.full_register_unwinds();
        let mut end =
            state
                .space
                .unwind_with_sps(regs, &mut observed, &mut self.addrs, Some(&mut self.sps));
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

    fn user_kind(&mut self, pid: u32, addr: u64, is_return: bool) -> RawKind {
        let lookup = if is_return {
            addr.wrapping_sub(1)
        } else {
            addr
        };
        let Some((region, binary)) = self.processes.binary_at(pid, lookup) else {
            return RawKind::Unknown;
        };
        let key = (region.start, Arc::as_ptr(binary) as usize);
        if let Some(&m) = self.mapping_index.get(&key) {
            return RawKind::User(m, is_return);
        }
        let m = self.mappings.len() as u32;
        self.mappings.push(RawMapping {
            pid,
            start: region.start,
            end: region.end,
            file_offset: region.file_offset,
            binary: binary.clone(),
        });
        self.mapping_index.insert(key, m);
        RawKind::User(m, is_return)
    }

    fn node(&mut self, parent: u32, kind: RawKind, address: u64) -> u32 {
        self.node_live(parent, kind, address, false)
    }

    fn node_live(&mut self, parent: u32, kind: RawKind, address: u64, live: bool) -> u32 {
        let frame = RawFrame {
            kind,
            address,
            live,
        };
        let f = match self.frame_index.get(&frame) {
            Some(&f) => f,
            None => {
                let f = self.frames.len() as u32;
                self.frames.push(frame);
                self.frame_index.insert(frame, f);
                f
            }
        };
        *self.node_index.entry((parent, f)).or_insert_with(|| {
            self.nodes.push((parent, f));
            (self.nodes.len() - 1) as u32
        })
    }

    fn thread(&mut self, pid: u32, tid: u32) {
        if self.threads.insert((pid, tid)) {
            if let Some(name) = thread_name(pid, tid) {
                self.names.push((pid, tid, name));
            }
            self.stats.threads = self.threads.len() as u64;
        }
    }

    /// The JIT map name of a frame in code without a file image.
    fn jit_name(&mut self, frame: RawFrame) -> Option<JitName> {
        let RawKind::User(m, is_return) = frame.kind else {
            return None;
        };
        let mapping = &self.mappings[m as usize];
        if mapping.binary.module.is_some() {
            return None;
        }
        let lookup = if is_return {
            frame.address - 1
        } else {
            frame.address
        };
        let pid = mapping.pid;
        self.jit.process(pid).symbol(lookup).map(|s| s.name.clone())
    }

    /// Everything new since the previous call, for the builder.
    pub(crate) fn take_batch(&mut self) -> Batch {
        let (m, f, n) = self.sent;
        self.sent = (self.mappings.len(), self.frames.len(), self.nodes.len());
        let jit_names = (f..self.frames.len())
            .map(|i| self.jit_name(self.frames[i]))
            .collect::<Vec<_>>();
        Batch {
            mappings: self.mappings[m..].to_vec(),
            frames: self.frames[f..].to_vec(),
            jit_names,
            nodes: self.nodes[n..].to_vec(),
            samples: std::mem::take(&mut self.pending),
            names: std::mem::take(&mut self.names),
            stats: Stats {
                outer_cache: self.outer.stats,
                ..self.stats.clone()
            },
        }
    }
}
