//! The hot path: records in, raw stacks out.
//!
//! [`Pipeline`] dispatches each record to the parts that own one job each:
//! - [`Lifetimes`]: threads and processes, their names, execs and exits;
//! - [`Deferrals`]: samples set aside until a binary they need is parsed on the loader thread
//!   ([`Processes::with_loader`]), replayed in each address space's time order;
//! - [`UserUnwinder`] and [`LiveProof`]: unwinding a user stack, past its copy only with a proof;
//!   [`stack_end`] decides how each stack ends;
//! - [`RawTables`]: interning — one raw frame per distinct address per mapping, one raw trie node
//!   per distinct (caller, frame);
//! - [`jit_names`] and [`TableLimit`]: naming new JIT frames, and when the tables start over;
//! - [`Stats`]: the counts.
//!
//! [`Pipeline::take_batch`] hands everything new to the [`super::builder::Builder`], which
//! symbolizes distinct frames and builds the profile on its own thread.

use crate::jit::JitMaps;
use crate::kernel_walk::KernelWalk;
use crate::perf_event::{Record, Sample, SwitchState, parse_record};
use crate::process::Processes;
use rootline_image::ModuleBudget;
use std::time::Instant;

use super::alloc::{AllocSampler, AllocSource, AllocWeight};
use super::budget::TableLimit;
use super::deferral::{Deferrals, Deferred, Wait};
use super::lifetime::Lifetimes;
use super::live_proof::LiveProof;
use super::naming::jit_names;
use super::off_cpu::{OffCpu, OffWeight, Ready};
use super::raw::{Batch, NO_NODE, Pending, RawFrame, RawKind, RawTables};
#[cfg(doc)]
use super::stack_end::stack_end;
use super::stats::Stats;
use super::user_unwind::UserUnwinder;
use super::walk_memo::WalkMemos;

/// How long attaching waits, at most, for the rows of the targets' binaries.
const PRIME_ROWS_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a batch waits, at most, for JVMs to name code their perf maps missed.
const JVM_NAME_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

mod jvm_wait;
mod user_stack;

/// Turns perf records into raw stacks.
pub struct Pipeline {
    /// Counts.
    pub stats: Stats,
    processes: Processes,
    jit: JitMaps,
    kernel: bool,
    /// Records carry a callchain (kernel frames, user frames for the cross-check, or both).
    callchain: bool,
    period_nanos: Option<i64>,
    /// A process whose samples are dropped unread ([`Pipeline::skip_process`]).
    skip_pid: Option<u32>,
    tables: RawTables,
    pending: Vec<Pending>,
    lifetimes: Lifetimes,
    deferrals: Deferrals,
    /// The execs read in this round, in time order: process, the exec's time, and the key of
    /// the address space it left (see [`Pipeline::space_of`]).
    execs: Vec<(u32, u64, u32)>,
    proof: LiveProof,
    unwinder: UserUnwinder,
    limit: TableLimit,
    /// Off-CPU pairing, when switch-outs are recorded.
    off_cpu: Option<OffCpu>,
    /// The weight of the off-CPU sample being handled (None while handling a CPU sample).
    off_weight: Option<OffWeight>,
    /// Off-CPU samples ready to unwind (reused between passes).
    ready: Vec<Ready>,
    /// The in-kernel stack walk, when it runs.
    kernel_walk: Option<KernelWalk>,
    /// Walks of samples set aside, by (tid, time).
    kept_walks: foldhash::HashMap<(u32, u64), std::sync::Arc<crate::kernel_walk::KernelStack>>,
    /// Bytes of the stack dumps `kept_walks` hold.
    kept_dump_bytes: usize,
    /// Most bytes of dumps `kept_walks` may hold (see `RecordOptions::kernel_walk_kept_dumps`).
    kept_dump_limit: usize,
    /// Per thread, the outer part of its last whole kernel-walked stack, for reuse.
    walk_memos: WalkMemos,
    /// Allocation sampling, when allocations are recorded.
    alloc: Option<AllocSampler>,
    /// The weight of the allocation sample being handled.
    alloc_weight: Option<AllocWeight>,
}

impl Pipeline {
    /// A pipeline. `period_nanos` converts one sample to CPU time when the event period is not in
    /// nanoseconds (hardware cycles); None for `cpu-clock`.
    /// Binaries, images and JIT tables are counted in `modules`.
    pub fn new(kernel: bool, period_nanos: Option<i64>, modules: ModuleBudget) -> Pipeline {
        Pipeline {
            stats: Stats::default(),
            processes: Processes::with_loader(modules.clone()),
            jit: JitMaps::new(modules),
            kernel,
            callchain: kernel,
            period_nanos,
            skip_pid: None,
            tables: RawTables::new(),
            pending: Vec::new(),
            lifetimes: Lifetimes::new(),
            deferrals: Deferrals::new(),
            execs: Vec::new(),
            proof: LiveProof::default(),
            unwinder: UserUnwinder::default(),
            limit: TableLimit::default(),
            off_cpu: None,
            off_weight: None,
            ready: Vec::new(),
            kernel_walk: None,
            kept_walks: Default::default(),
            kept_dump_bytes: 0,
            // No walk, no dumps: `set_kernel_walk` gives the limit.
            kept_dump_limit: 0,
            walk_memos: WalkMemos::default(),
            alloc: None,
            alloc_weight: None,
        }
    }

    /// Unwinds with the words of `walk`'s in-kernel walks where they suffice (see
    /// [`crate::kernel_walk`]); the program must already be attached to the sampling events.
    pub fn set_kernel_walk(&mut self, walk: KernelWalk, kept_dumps: usize) {
        self.kernel_walk = Some(walk);
        self.kept_dump_limit = kept_dumps;
        self.stats.kernel_walk = Some(Default::default());
    }

    /// Whether the in-kernel walk runs.
    pub fn walks_in_kernel(&self) -> bool {
        self.kernel_walk.is_some()
    }

    /// Reads the walks written so far: call after reading the perf rings' heads, before
    /// handling their samples.
    pub fn drain_kernel_walk(&mut self) {
        let Some(kw) = self.kernel_walk.as_mut() else {
            return;
        };
        kw.drain();
        // Samples whose walks went on as task work, now whole (or waited for long enough).
        let now = crate::perf_event::monotonic_ns();
        let whole: foldhash::HashSet<(u32, u64)> = self
            .deferrals
            .walks_awaited()
            .filter(|&(tid, time)| !kw.in_flight(tid, time, now))
            .collect();
        if !whole.is_empty() {
            self.replay_if(
                |d| matches!(d.wait, Wait::Walk { tid, time } if whole.contains(&(tid, time))),
            );
        }
    }

    /// Reads the mappings of `pids` (parsing their binaries) and sends them to the in-kernel
    /// walk: call before their events are enabled.
    pub fn prime_kernel_walk(&mut self, pids: &[u32]) {
        for &pid in pids {
            self.processes.get(pid);
        }
        // Every binary they map, so that each one's rows are compiled now.
        while self.processes.wait_loaded() {}
        self.processes.take_installed();
        self.sync_kernel_walk();
        if let Some(kw) = self.kernel_walk.as_mut() {
            // The target runs meanwhile; only its sampling starts a little later.
            kw.wait_for_rows(Instant::now() + PRIME_ROWS_WAIT);
        }
        self.sync_kernel_walk();
    }

    /// Sends every tracked process's mappings to the in-kernel walk where they changed.
    pub(crate) fn sync_kernel_walk(&mut self) {
        let Some(kw) = self.kernel_walk.as_mut() else {
            return;
        };
        for (pid, state) in self.processes.tracked() {
            kw.sync(pid, &state.space, |start| state.is_pending(start));
        }
    }

    /// Copies the in-kernel walk's counts into the stats (reading the BPF counters is a system
    /// call per CPU: once per batch, not per round).
    fn refresh_kernel_walk_stats(&mut self) {
        if let (Some(kw), Some(s)) = (&self.kernel_walk, self.stats.kernel_walk.as_mut()) {
            s.walk = kw.stats();
        }
    }

    /// Records allocation samples from `source` ([`Pipeline::alloc_record`]), sampled at a mean
    /// of `rate` bytes.
    pub(crate) fn set_alloc(&mut self, source: AllocSource, rate: u64) {
        self.alloc = Some(AllocSampler::new(source, rate));
    }

    /// An allocation uprobe's sample parsed from `raw`: weighed, and unwound when sampled.
    pub(crate) fn alloc_record(&mut self, raw: &[u8], s: &Sample<'_>) {
        if Some(s.pid) == self.skip_pid {
            return;
        }
        let Some(sampler) = self.alloc.as_mut() else {
            return;
        };
        if let Some(w) = sampler.weigh(s, &self.processes) {
            self.alloc_weight = Some(w);
            self.handle(s, Some(raw), s.pid);
            self.alloc_weight = None;
        }
    }

    /// Records off-CPU intervals from switch-out samples ([`Pipeline::switch_record`]) and
    /// switch records; intervals under `min_ns` are counted but not unwound.
    pub fn set_off_cpu(&mut self, min_ns: u64) {
        self.off_cpu = Some(OffCpu::new(min_ns));
    }

    /// Switch-out samples received so far.
    pub(crate) fn off_cpu_sampled(&self) -> u64 {
        self.off_cpu.as_ref().map_or(0, |off| off.stats.sampled)
    }

    /// A switch-out sample parsed from `raw`, with the state the thread left in when the kernel
    /// said: kept until the switch-in that ends its interval.
    pub(crate) fn switch_record(&mut self, raw: &[u8], s: &Sample<'_>, state: Option<SwitchState>) {
        // Whole-host recording also sees the idle task (0) leave the CPU: not a thread's wait.
        if Some(s.pid) != self.skip_pid
            && s.tid != 0
            && let Some(off) = self.off_cpu.as_mut()
        {
            off.sample(s.pid, s.tid, s.time, raw, state);
        }
    }

    /// Unwinds the switch-out samples whose intervals are known; with `end`, those still open
    /// are weighed until `end`.
    pub(crate) fn settle_off_cpu(&mut self, end: Option<u64>) {
        let Some(off) = self.off_cpu.as_mut() else {
            return;
        };
        let mut ready = std::mem::take(&mut self.ready);
        off.settle(end, &mut ready);
        for r in ready.drain(..) {
            if let Record::Sample(s) = parse_record(&r.raw, self.callchain) {
                self.off_weight = Some(r.weight);
                self.handle(&s, Some(&r.raw), s.pid);
                self.off_weight = None;
            }
        }
        self.ready = ready;
    }

    /// Called before each pass over the rings: installs finished parses, unwinds the samples
    /// that waited for them, and forgets threads and processes that exited a while ago.
    pub fn begin_round(&mut self) {
        // The images execs left were for the last round's samples (those still waiting keep
        // theirs).
        if !self.execs.is_empty() {
            self.execs.clear();
            self.deferrals.release_retired(&mut self.processes);
        }
        if self.processes.poll_loaded() {
            let (files, pids) = self.processes.take_installed();
            // Only the samples that waited for what arrived: each is unwound again at most once
            // per binary it needs, not once per binary the host loads.
            self.replay_if(|d| match &d.wait {
                Wait::File(Some(key)) => files.contains(key),
                Wait::File(None) => pids.contains(&d.space),
                Wait::Walk { .. } | Wait::Behind => false,
            });
        }
        self.replay_answered_jvms();
        self.sync_kernel_walk();
        // A binary a running process maps took the room of ones only exited processes map:
        // those processes go now, not after their usual grace.
        let urgent = self.processes.over_budget();
        for pid in self.lifetimes.forget_exited(urgent) {
            if let Some(kw) = self.kernel_walk.as_mut() {
                kw.forget_process(pid);
            }
            self.deferrals.retire_space(&mut self.processes, pid);
            self.processes.remove(pid);
            self.jit.exec(pid);
        }
        self.processes.settle_reclaimable();
    }

    /// Finishes every set-aside sample (waiting for the loader); call before the last batch.
    pub fn finish(&mut self) {
        self.settle_off_cpu(Some(crate::perf_event::monotonic_ns()));
        while !self.deferrals.is_empty() {
            // When nothing more can arrive, unwinds them with what there is.
            self.deferrals.force = !self.processes.wait_loaded();
            self.processes.take_installed();
            self.replay_if(|_| true);
            self.deferrals.force = false;
        }
        self.refresh_kernel_walk_stats();
    }

    /// Unwinds again the set-aside samples that `due` picks.
    fn replay_if(&mut self, due: impl Fn(&Deferred) -> bool) {
        if !self.deferrals.any(&due) {
            return;
        }
        for d in self.deferrals.take_all() {
            // A space's samples stay in time order: once one of them waits, the rest wait
            // behind it (the outer-stack cache relies on each thread's order), and go when it
            // goes.
            if self.deferrals.waiting(d.space) || !(matches!(d.wait, Wait::Behind) || due(&d)) {
                self.deferrals.defer(d);
                continue;
            }
            // Allocation samples carry no callchain (see `alloc_attach::open_alloc_events`).
            let callchain = self.callchain && d.alloc.is_none();
            if let Record::Sample(s) = parse_record(&d.raw, callchain) {
                self.off_weight = d.off_cpu;
                self.alloc_weight = d.alloc;
                self.handle(&s, Some(&d.raw), d.space);
                self.off_weight = None;
                self.alloc_weight = None;
            }
        }
        self.deferrals.release_retired(&mut self.processes);
        self.processes.settle_reclaimable();
    }

    /// Starts the tables over (after the batch that passes it) once they hold more than `limit`
    /// distinct frames plus stack nodes, so a recording that hands its samples over keeps bounded
    /// memory however long it runs.
    pub fn set_table_limit(&mut self, limit: usize) {
        self.limit.entries = Some(limit);
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

    /// Limits the memory of loaded binaries and .NET images (see
    /// [`Processes::set_module_budget`], [`crate::jit::ImageCache`]).
    pub fn set_module_budget(&mut self, bytes: usize) {
        self.processes.set_module_budget(bytes);
        self.jit.set_module_budget(bytes);
    }

    /// Continues unwinding past each sample's copied stack by reading the live process, at most
    /// `budget` bytes per sample (see [`crate::live::live_memory`]). Off until called.
    pub fn set_live_stack_budget(&mut self, budget: usize) {
        self.proof.set_budget(budget);
    }

    /// Parses binaries on the reader thread as they are first mapped (the reader may stall on a
    /// large one) instead of on the loader thread; call before the first record.
    ///
    /// For recordings of a few processes with live stack reads: those reads are proven by
    /// watches the reader arms as it handles samples, and a sample taken before its thread's
    /// watch cannot use it; samples set aside for a binary's parse would all predate it.
    pub fn parse_binaries_inline(&mut self) {
        let budget = self.processes.module_budget();
        self.processes = Processes::new(self.processes.modules().clone());
        if let Some(bytes) = budget {
            self.processes.set_module_budget(bytes);
        }
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
                self.lifetimes.mapped(pid);
                if self.deferrals.waiting(pid)
                    && self.processes.overlaps(pid, addr, addr.saturating_add(len))
                    && let Some(kept) = self.deferrals.retire_space(&mut self.processes, pid)
                {
                    // The process goes on with a copy of the space, then the new mapping.
                    self.processes.fork(pid, kept);
                }
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
                    self.lifetimes.exec(pid, time);
                    // The image it leaves is kept for this round's samples taken before it.
                    let left = self
                        .deferrals
                        .retire_space(&mut self.processes, pid)
                        .or_else(|| self.deferrals.keep_aside(&mut self.processes, pid));
                    if let Some(key) = left {
                        self.execs.push((pid, time, key));
                    }
                    self.processes.exec(pid);
                    self.jit.exec(pid);
                }
                self.lifetimes.renamed(pid, tid, name);
            }
            Record::Fork { pid, ppid, .. } => self.processes.fork(pid, ppid),
            Record::Lost(n) => self.stats.lost += n,
            Record::Exit { pid, tid } => {
                if let Some(off) = self.off_cpu.as_mut() {
                    off.exited(tid, time);
                }
                if let Some(alloc) = self.alloc.as_mut() {
                    alloc.exited(tid);
                }
                self.proof.forget((pid, tid));
                if let Some(kw) = self.kernel_walk.as_mut() {
                    kw.thread_exited(tid);
                }
                self.walk_memos.forget((pid, tid));
                self.tables.forget_path(tid);
                self.lifetimes.exited(pid, tid);
                if pid == tid {
                    self.processes.exited(pid);
                }
            }
            Record::Switch {
                pid,
                tid,
                out,
                preempt,
            } => {
                if Some(pid) != self.skip_pid
                    && tid != 0
                    && let Some(off) = self.off_cpu.as_mut()
                {
                    off.switch(pid, tid, time, out, preempt);
                }
            }
            Record::Sample(_) | Record::Other => {}
        }
    }

    /// Handles one sample: unwind, intern, queue.
    pub fn sample(&mut self, s: &Sample<'_>) {
        if Some(s.pid) != self.skip_pid {
            self.handle(s, None, s.pid);
        }
    }

    /// [`Pipeline::sample`] for a sample parsed from `raw`, which is kept (and the sample unwound
    /// later) if the sample's binaries are still being parsed.
    pub(crate) fn sample_record(&mut self, raw: &[u8], s: &Sample<'_>) {
        if Some(s.pid) != self.skip_pid {
            self.handle(s, Some(raw), self.space_of(s));
        }
    }

    /// The address space a sample of this round ran in: its process's, or, for a sample taken
    /// before an exec read in the same round (a round applies every mapping record before its
    /// samples), the image that exec left (a launched `rustc` is rustup's proxy until it execs
    /// the toolchain's compiler a few milliseconds in).
    ///
    /// A sample in the kernel just before the exec's record may be inside `execve` itself, its
    /// old image gone: it stays with its process, where [`Pipeline::in_exec`] knows it.
    fn space_of(&self, s: &Sample<'_>) -> u32 {
        let Some(&(_, _, left)) = self
            .execs
            .iter()
            .find(|&&(pid, time, _)| pid == s.pid && s.time < time)
        else {
            return s.pid;
        };
        if s.kernel_mode && self.lifetimes.may_be_in_exec(s.pid, s.time) {
            return s.pid;
        }
        left
    }

    /// Whether JVMs are asked for their perf maps (see [`crate::jit::hotspot`]); on until called.
    pub fn set_ask_jvms(&mut self, ask: bool) {
        self.jit.ask_jvms_off = !ask;
    }

    /// Asks the JVMs being asked for their perf maps once more, waiting until `deadline`: call at
    /// the end, before the last batch names its frames.
    pub fn ask_jvms_again(&mut self, deadline: Instant) {
        self.jit.ask_jvms_again(deadline);
    }

    /// Drops the samples of process `pid` unread (the profiler's own, when it samples the host).
    pub fn skip_process(&mut self, pid: u32) {
        self.skip_pid = Some(pid);
    }

    /// Handles a sample, unwinding it in address space `space` (its process's, unless the
    /// sample waited while that space changed).
    fn handle(&mut self, s: &Sample<'_>, raw: Option<&[u8]>, space: u32) {
        let user = match s.user_regs {
            Some(regs) if !self.in_exec(s, regs.ip(), space) => {
                match self.user_stack(s, regs, raw, space) {
                    Some(node) => Some(node),
                    None => return, // set aside until its binaries are parsed
                }
            }
            _ => None,
        };
        if self.off_weight.is_none() && self.alloc_weight.is_none() {
            self.stats.samples += 1;
        }
        if self.lifetimes.sampled(s.pid, s.tid) {
            // Exited threads leave the map, so count each one as it first appears.
            self.stats.threads += 1;
        }
        let mut node = NO_NODE;
        match (s.user_regs, user) {
            (Some(_), Some(n)) => node = n,
            (Some(_), None) => node = self.node(node, RawKind::Exec, 0),
            (None, _) => {
                if s.kernel_ips.is_empty() {
                    node = self.node(node, RawKind::KernelOnly, 0);
                }
            }
        }
        for &ip in s.kernel_ips.iter().rev() {
            node = self.node(node, RawKind::Kernel, ip);
        }
        let nanos = match (self.off_weight, self.alloc_weight) {
            (Some(w), _) => {
                node = self.node(node, RawKind::OffCpu(w.reason), 0);
                w.nanos
            }
            (None, Some(a)) => {
                node = self.node(node, RawKind::Alloc(a.kind), 0);
                0
            }
            (None, None) => self.period_nanos.unwrap_or(s.period as i64),
        };
        self.pending.push(Pending {
            time: s.time,
            pid: s.pid,
            tid: s.tid,
            node,
            nanos,
            off_cpu: self.off_weight,
            alloc: self.alloc_weight,
        });
    }

    /// Whether the sample caught the thread inside `execve`: in kernel mode, after (or at) an exec
    /// seen in this recording, with user registers that still point into the old image.
    fn in_exec(&mut self, s: &Sample<'_>, ip: u64, space: u32) -> bool {
        s.kernel_mode
            && self.lifetimes.may_be_in_exec(s.pid, s.time)
            && self.processes.get(space).space.region(ip).is_none()
    }

    /// The raw trie node of a frame not read from live memory.
    fn node(&mut self, parent: u32, kind: RawKind, address: u64) -> u32 {
        self.tables.node(
            parent,
            RawFrame {
                kind,
                address,
                live: false,
            },
        )
    }

    /// Everything new since the previous call, for the builder.
    pub(crate) fn take_batch(&mut self) -> Batch {
        if let Some(off) = self.off_cpu.as_mut() {
            self.stats.off_cpu = off.stats;
            for (pid, tid, time, nanos, reason) in off.take_unstacked() {
                let node = self.tables.node(
                    NO_NODE,
                    RawFrame {
                        kind: RawKind::OffCpu(reason),
                        address: 0,
                        live: false,
                    },
                );
                let weight = OffWeight { nanos, reason };
                self.pending.push(Pending {
                    time,
                    pid,
                    tid,
                    node,
                    nanos,
                    off_cpu: Some(weight),
                    alloc: None,
                });
            }
        }
        if let Some(alloc) = self.alloc.as_ref() {
            self.stats.alloc = alloc.stats;
        }
        self.refresh_kernel_walk_stats();
        let pending = self.pending.len();
        let new = self.tables.take_new();
        // New JIT code of a JVM is named by asking it again; the reader waits this long at most.
        let deadline = Instant::now() + JVM_NAME_WAIT;
        let jit_names = jit_names(
            &mut self.jit,
            &self.tables,
            &new.frames,
            deadline,
            &mut self.stats.jit_unnamed,
        );
        self.stats.jit_notes = self.jit.jvm_notes();
        let mut batch = Batch {
            mappings: new.mappings,
            frames: new.frames,
            jit_names,
            nodes: new.nodes,
            // The next batch is about as large: one allocation instead of a regrowth per flush.
            samples: std::mem::replace(&mut self.pending, Vec::with_capacity(pending)),
            names: self.lifetimes.take_names(),
            stats: Stats {
                outer_cache: self.proof.stats(),
                ..self.stats.clone()
            },
            start_over: false,
        };
        // Whatever was refused for the module budget, unused binaries and images make room.
        let refused = self.processes.sweep_files(self.jit.refuses_any());
        self.jit.sweep_images(refused);
        let (entries, threads) = (self.tables.entries(), self.lifetimes.new_threads());
        if self
            .limit
            .start_over(entries, threads, (&self.processes, &self.jit), refused)
        {
            batch.start_over = true;
            // Thread names go out again with the next batch. What holds trie nodes of the old
            // tables (a thread's last outer part, walked or proven) lets go of them.
            self.tables.clear();
            self.lifetimes.start_over();
            self.walk_memos.forget_all();
            self.proof.forget_nodes();
        }
        batch
    }
}
