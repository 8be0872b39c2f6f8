//! The hot path: records in, raw stacks out.
//!
//! Per sample it unwinds to raw addresses and interns them — one raw frame per distinct address
//! per mapping, one raw trie node per distinct (caller, frame) — then queues the sample. Frames
//! past the copied stack are read live only with a proof from [`super::outer_cache`] (which also
//! hands back the interned outer part of a deep stack that is proven unchanged), and are
//! cross-checked against the kernel's callchain ([`crate::live::callchain`]).
//!
//! Binaries are parsed on a loader thread ([`Processes::with_loader`]). A sample whose unwind
//! touched a region still waiting for its binary (or ended early in a process with such regions)
//! is set aside as its raw record and unwound again once the parse arrives, so it is never
//! unwound without its unwind tables; later samples of the same process wait behind it, so each
//! process's samples are still unwound in time order. When a mapping change, exec or exit alters a process whose
//! samples wait, its address space as it was is kept aside for them ([`Processes::retire`]), so
//! nobody waits; past [`DEFER_BUDGET`] bytes of waiting samples the reader waits for the loader
//! instead of setting more aside, and at the end it waits for what is still owed.
//! [`Pipeline::take_batch`] hands everything new to the [`super::builder::Builder`], which
//! symbolizes distinct frames and builds the profile on its own thread.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::jit::{JitMaps, JitMemory, JitName};
use foldhash::{HashMap as FastMap, HashMapExt};

use crate::live::{LiveMemory, callchain};
use crate::perf_event::{Record, Sample, parse_record};
use crate::process::{BinaryFile, FileKey, Processes, thread_name};
use crate::unwind::{
    Memory, NoCfiRule, ReadFailure, Registers, SampleStack, StackEnd, TruncateReason,
};
use rootline_image::ModuleBudget;

use super::outer_cache::{self, Observed, Outer, OuterCache, OuterCacheStats, Plan};

mod jvm_wait;
mod user_stack;

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
    pub live: crate::live::live_memory::LiveStats,
    /// Samples unwound with every register tracked (CFI that needs more than rip/rsp/rbp).
    pub full_register_unwinds: u64,
    /// Cross-checks of live frames against the kernel's frame-pointer callchain.
    pub callchain: CallchainStats,
    /// Reuse of the outer part of deep stacks.
    pub outer_cache: OuterCacheStats,
    /// Times a sample was set aside to wait for a binary's parse (a sample may count more than
    /// once if it needed several).
    pub deferred: u64,
    /// Distinct JIT frames left without a name, by why.
    pub jit_unnamed: std::collections::BTreeMap<String, u64>,
    /// Why runtimes were not asked for their JIT maps (a JVM with attach off), one line each.
    pub jit_notes: Vec<String>,
}

/// Counts of the kernel callchain cross-check (see [`crate::live::callchain`]).
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
    /// The pipeline started its tables over after this batch: the next one's ids start at 0.
    pub start_over: bool,
}

/// The parent of a root node.
pub(crate) const NO_NODE: u32 = u32::MAX;

/// How long a batch waits, at most, for JVMs to name code their perf maps missed.
const JVM_NAME_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// How long after its exit record a thread (and, once gone, its process) is forgotten.
const FORGET_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// A sample set aside until a binary it needs is parsed.
struct Deferred {
    raw: Vec<u8>,
    /// The address space it is unwound in: its process's, or that space as it was before an
    /// exec or a mapping change (kept aside under a key of its own, see [`Processes::retire`]).
    space: u32,
    /// The file it waits for; None: any file arriving in its process (its stack ended early and
    /// the region to blame is not known).
    waits_for: Option<FileKey>,
}

/// Bytes of raw sample records that may wait for their binaries' parses (about 4,000 samples with
/// 16 KiB stacks); past it the reader waits for the loader.
pub const DEFER_BUDGET: usize = 64 * 1024 * 1024;

/// Turns perf records into raw stacks.
pub struct Pipeline {
    /// Counts.
    pub stats: Stats,
    processes: Processes,
    jit: JitMaps,
    kernel: bool,
    period_nanos: Option<i64>,
    mappings: Vec<RawMapping>,
    mapping_index: FastMap<(u64, usize), u32>,
    frames: Vec<RawFrame>,
    frame_index: FastMap<RawFrame, u32>,
    nodes: Vec<(u32, u32)>,
    node_index: FastMap<(u32, u32), u32>,
    sent: (usize, usize, usize),
    pending: Vec<Pending>,
    names: Vec<(u32, u32, String)>,
    /// Live threads and their names (re-sent after the tables start over).
    threads: FastMap<(u32, u32), Option<Box<str>>>,
    /// Distinct frames plus stack nodes (plus threads seen) past which the tables start over
    /// (None: never).
    table_limit: Option<usize>,
    /// A process whose samples are dropped unread ([`Pipeline::skip_process`]).
    skip_pid: Option<u32>,
    /// Threads first seen since the tables last started over.
    new_threads: usize,
    refreshed: FastMap<u32, Instant>,
    exec_times: FastMap<u32, u64>,
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
    /// Samples waiting for binaries, in arrival order, and their total size.
    deferred: Vec<Deferred>,
    deferred_bytes: usize,
    /// Set-aside samples per address space.
    deferred_pids: FastMap<u32, usize>,
    /// Unwind without checking for pending binaries (nothing more will arrive).
    force: bool,
    /// Threads `(pid, tid)` that exited and when their exit was seen; forgotten after
    /// [`FORGET_AFTER`] (a sample of theirs may still sit in another CPU's ring), a process only
    /// once it is gone from `/proc` (its main thread may exit before the others).
    exited: std::collections::VecDeque<(u32, u32, Instant)>,
    /// Scratch: the regions of the sample's process still waiting for their binary.
    pending_ranges: Vec<(u64, u64)>,
    /// Keys of address spaces kept aside for waiting samples.
    retired: Vec<u32>,
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
            period_nanos,
            mappings: Vec::new(),
            mapping_index: FastMap::new(),
            frames: Vec::new(),
            frame_index: FastMap::new(),
            nodes: Vec::new(),
            node_index: FastMap::new(),
            sent: (0, 0, 0),
            pending: Vec::new(),
            names: Vec::new(),
            threads: FastMap::new(),
            table_limit: None,
            skip_pid: None,
            new_threads: 0,
            refreshed: FastMap::new(),
            exec_times: FastMap::new(),
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
            deferred: Vec::new(),
            deferred_bytes: 0,
            deferred_pids: FastMap::new(),
            force: false,
            exited: std::collections::VecDeque::new(),
            pending_ranges: Vec::new(),
            retired: Vec::new(),
        }
    }
    /// Called before each pass over the rings: installs finished parses, unwinds the samples
    /// that waited for them, and forgets threads and processes that exited a while ago.
    pub fn begin_round(&mut self) {
        if self.processes.poll_loaded() {
            let (files, pids) = self.processes.take_installed();
            // Only the samples that waited for what arrived: each is unwound again at most once
            // per binary it needs, not once per binary the host loads.
            self.replay_if(|d| match &d.waits_for {
                Some(key) => files.contains(key),
                None => pids.contains(&d.space),
            });
        }
        self.replay_answered_jvms();
        let now = Instant::now();
        while let Some(&(pid, tid, at)) = self.exited.front() {
            if now.duration_since(at) < FORGET_AFTER {
                break;
            }
            self.exited.pop_front();
            self.threads.remove(&(pid, tid));
            if pid == tid {
                if std::fs::metadata(format!("/proc/{pid}")).is_ok() {
                    // Still there (other threads run on, or not yet reaped): look again later.
                    self.exited.push_back((pid, tid, now));
                    break;
                }
                self.retire_space(pid);
                self.processes.remove(pid);
                self.jit.exec(pid);
                self.refreshed.remove(&pid);
                self.exec_times.remove(&pid);
            }
        }
    }

    /// Finishes every set-aside sample (waiting for the loader); call before the last batch.
    pub fn finish(&mut self) {
        while !self.deferred.is_empty() {
            self.wait_and_replay();
        }
    }

    /// Waits for the loader's next parse and unwinds the set-aside samples again; when nothing
    /// more can arrive, unwinds them with what there is.
    fn wait_and_replay(&mut self) {
        self.force = !self.processes.wait_loaded();
        self.replay();
        self.force = false;
    }

    /// Unwinds every set-aside sample again (some may be set aside again).
    fn replay(&mut self) {
        self.processes.take_installed();
        self.replay_if(|_| true);
    }

    /// Unwinds again the set-aside samples that `due` picks.
    fn replay_if(&mut self, due: impl Fn(&Deferred) -> bool) {
        if !self.deferred.iter().any(&due) {
            return;
        }
        let all = std::mem::take(&mut self.deferred);
        self.deferred_bytes = 0;
        self.deferred_pids.clear();
        for d in all {
            // A space's samples stay in time order: once one of them waits, the rest wait
            // behind it (the outer-stack cache relies on each thread's order).
            if self.deferred_pids.contains_key(&d.space) || !due(&d) {
                self.defer(d);
                continue;
            }
            if let Record::Sample(s) = parse_record(&d.raw, self.callchain) {
                self.handle(&s, Some(&d.raw), d.space);
            }
        }
        // Address spaces kept aside for samples that no longer wait.
        let deferred_pids = &self.deferred_pids;
        let processes = &mut self.processes;
        self.retired.retain(|&key| {
            let keep = deferred_pids.contains_key(&key);
            if !keep {
                processes.remove(key);
            }
            keep
        });
    }

    /// Sets a sample aside (after those already waiting).
    fn defer(&mut self, d: Deferred) {
        self.deferred_bytes += d.raw.len();
        *self.deferred_pids.entry(d.space).or_default() += 1;
        self.deferred.push(d);
    }

    /// Before `pid`'s address space changes (exec, a replacing mapping, exit): if samples of it
    /// wait for binaries, keeps the space as it is under a new key for them (no waiting).
    /// Returns that key.
    fn retire_space(&mut self, pid: u32) -> Option<u32> {
        let n = self.deferred_pids.remove(&pid)?;
        let key = self.processes.retire(pid)?;
        for d in &mut self.deferred {
            if d.space == pid {
                d.space = key;
            }
        }
        self.deferred_pids.insert(key, n);
        self.retired.push(key);
        Some(key)
    }

    /// Starts the tables over (after the batch that passes it) once they hold more than `limit`
    /// distinct frames plus stack nodes, so a recording that hands its samples over keeps bounded
    /// memory however long it runs.
    pub fn set_table_limit(&mut self, limit: usize) {
        self.table_limit = Some(limit);
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
        self.live = (budget > 0).then(|| LiveMemory::new(budget));
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
                *self.space_gen.entry(pid).or_default() += 1;
                if self.deferred_pids.contains_key(&pid)
                    && self.processes.overlaps(pid, addr, addr.saturating_add(len))
                    && let Some(kept) = self.retire_space(pid)
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
                    *self.space_gen.entry(pid).or_default() += 1;
                    self.retire_space(pid);
                    self.processes.exec(pid);
                    self.jit.exec(pid);
                    self.exec_times.insert(pid, time);
                }
                if let Some(known) = self.threads.get_mut(&(pid, tid)) {
                    *known = Some(name.into());
                    self.names.push((pid, tid, name.to_string()));
                }
            }
            Record::Fork { pid, ppid, .. } => self.processes.fork(pid, ppid),
            Record::Lost(n) => self.stats.lost += n,
            Record::Exit { pid, tid } => {
                self.outer.forget((pid, tid));
                self.exited.push_back((pid, tid, Instant::now()));
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
            self.handle(s, Some(raw), s.pid);
        }
    }

    /// Whether JVMs are asked for their perf maps (see [`crate::jit::hotspot`]); on until called.
    pub fn set_ask_jvms(&mut self, ask: bool) {
        self.jit.ask_jvms_off = !ask;
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
        self.stats.samples += 1;
        self.thread(s.pid, s.tid);
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
        let nanos = self.period_nanos.unwrap_or(s.period as i64);
        self.pending.push(Pending {
            time: s.time,
            pid: s.pid,
            tid: s.tid,
            node,
            nanos,
        });
    }

    fn user_kind(&mut self, space: u32, pid: u32, addr: u64, is_return: bool) -> RawKind {
        let lookup = if is_return {
            addr.wrapping_sub(1)
        } else {
            addr
        };
        let Some((region, binary)) = self.processes.binary_at(space, lookup) else {
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
        if let std::collections::hash_map::Entry::Vacant(e) = self.threads.entry((pid, tid)) {
            let name = thread_name(pid, tid);
            e.insert(name.as_deref().map(Into::into));
            if let Some(name) = name {
                self.names.push((pid, tid, name));
            }
            // Exited threads leave the map, so count each one as it first appears.
            self.stats.threads += 1;
            self.new_threads += 1;
        }
    }

    /// The JIT map name of a frame in code without a file image.
    fn jit_name(&mut self, frame: RawFrame, deadline: Instant) -> Option<JitName> {
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
        let jit = self.jit.process(pid);
        let name = jit.symbol_or_ask(lookup, deadline).map(|s| s.name.clone());
        if name.is_none() {
            *self
                .stats
                .jit_unnamed
                .entry(jit.unnamed_reason())
                .or_default() += 1;
        }
        name
    }

    /// Asks the JVMs being asked for their perf maps once more, waiting until `deadline`: call at
    /// the end, before the last batch names its frames.
    pub fn ask_jvms_again(&mut self, deadline: Instant) {
        self.jit.ask_jvms_again(deadline);
    }

    /// Everything new since the previous call, for the builder.
    pub(crate) fn take_batch(&mut self) -> Batch {
        let (m, f, n) = self.sent;
        let pending = self.pending.len();
        self.sent = (self.mappings.len(), self.frames.len(), self.nodes.len());
        // New JIT code of a JVM is named by asking it again; the reader waits this long at most.
        let deadline = Instant::now() + JVM_NAME_WAIT;
        let jit_names = (f..self.frames.len())
            .map(|i| self.jit_name(self.frames[i], deadline))
            .collect::<Vec<_>>();
        self.stats.jit_notes = self.jit.jvm_notes();
        let mut batch = Batch {
            mappings: self.mappings[m..].to_vec(),
            frames: self.frames[f..].to_vec(),
            jit_names,
            nodes: self.nodes[n..].to_vec(),
            // The next batch is about as large: one allocation instead of a regrowth per flush.
            samples: std::mem::replace(&mut self.pending, Vec::with_capacity(pending)),
            names: std::mem::take(&mut self.names),
            stats: Stats {
                outer_cache: self.outer.stats,
                ..self.stats.clone()
            },
            start_over: false,
        };
        // Whatever was refused for the module budget, unused binaries and images make room.
        let refused = self.processes.sweep_files(self.jit.refuses_any());
        self.jit.sweep_images(refused);
        if self.table_limit.is_some_and(|limit| {
            self.frames.len() + self.nodes.len() + self.new_threads > limit
                || self.modules_held_only_by_tables(refused)
        }) {
            batch.start_over = true;
            self.start_over();
        }
        batch
    }

    /// Whether, under pressure or with something `refused` for the module budget (the sweeps
    /// just measured the modules in use and let go of the images no process holds; JIT state is
    /// held by its live process), modules no tracked process maps any more, kept alive only by
    /// the mappings of recorded frames, hold a quarter of the module budget: starting the tables
    /// over frees them.
    fn modules_held_only_by_tables(&self, refused: bool) -> bool {
        self.processes.module_budget().is_some_and(|budget| {
            let live = self.processes.modules().live_bytes();
            let in_use = self.processes.module_bytes_in_use() + self.jit.bytes();
            (refused || live > budget / 4 * 3) && live.saturating_sub(in_use) > budget / 4
        })
    }

    /// Empties the raw tables; thread names go out again with the next batch.
    fn start_over(&mut self) {
        self.mappings.clear();
        self.mapping_index.clear();
        self.frames.clear();
        self.frame_index.clear();
        self.nodes.clear();
        self.node_index.clear();
        self.sent = (0, 0, 0);
        self.new_threads = self.threads.len();
        for (&(pid, tid), name) in &self.threads {
            if let Some(name) = name {
                self.names.push((pid, tid, name.to_string()));
            }
        }
    }
}
