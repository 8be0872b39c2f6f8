//! The in-kernel user-stack walk: a BPF program on the sampling events walks each sampled
//! thread's user stack while the thread is still stopped in the sampling interrupt, and sends
//! the stack words it read past the sample's copy (each with its address) to a ring buffer.
//!
//! The caller loads it once ([`KernelWalk::load`]), attaches it to every sampling event
//! ([`KernelWalk::attach`]), keeps each process's executable mappings in its maps
//! ([`KernelWalk::sync`], which compiles a binary's CFI into rows the first time it is seen),
//! drains the ring before handling the samples it read ([`KernelWalk::drain`]), and claims each
//! sample's walk ([`KernelWalk::claim`]). The unwinder then reads the walk's words instead of
//! live memory: they were read at the sample's instant, so frames found through them need no
//! liveness proof, and the frames themselves are still decided in user space by the exact
//! analysis (prologues, epilogues, JIT code), joined to the copy by stack address.
//!
//! The program itself is C (`crates/capture/bpf/stack_walk.bpf.c`), compiled by clang into the
//! committed object embedded here, so building rootline needs no BPF toolchain;
//! `crates/capture/tests/bpf_object.rs` checks the object matches its source where clang is
//! installed.

mod btf_scan;
mod join;
mod layout;
mod page_index;
mod row_cache;
mod rows;
mod task_work;

use std::hash::{BuildHasher, Hash, Hasher};
use std::os::fd::AsFd;
use std::sync::Arc;

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuValues, RingBuf};
use aya::programs::PerfEvent as BpfPerfEvent;
use foldhash::HashMap;

use crate::perf_event::PerfEvent;
use crate::unwind::AddressSpace;

pub use join::{JoinStats, KernelStack, WalkStop, WordsReader};
use layout::{
    Config, Counters, MAPPING_CODE_MOVES, MAPPING_FRAME_POINTERS, MAPPING_NONE, MAPPING_PENDING,
    MAPPING_TABLE, MAX_MAPPINGS, Mapping, Proc, ROW_MEMO_BYTES, TaskWalkSlot,
};
use rows::{MappedRows, RowTable};

/// The compiled program.
static OBJECT: &[u8] = aya::include_bytes_aligned!("../../bpf/stack_walk.bpf.o");
/// The program a walk at its frame limit goes on in (loaded only where BPF task work exists).
const CONTINUATION: &str = "continue_walk_at_limit";

/// Why the walk cannot run here.
#[derive(Debug, thiserror::Error)]
pub enum KernelWalkError {
    /// The kernel refused the program or a map (no CAP_BPF/CAP_PERFMON, an old kernel, the
    /// verifier).
    #[error("the kernel refused the stack-walk BPF program: {0}")]
    Load(String),
    /// A map could not be set up.
    #[error("the stack-walk BPF maps could not be set up: {0}")]
    Maps(String),
    /// The program could not be attached to a sampling event.
    #[error("the stack-walk BPF program could not be attached to a sampling event: {0}")]
    Attach(#[source] std::io::Error),
}

/// Default for [`KernelWalkOptions::max_frames`]: a 1,000-deep recursion and its thread's
/// frames, about 0.5 ms of interrupt at 999 Hz sampling.
pub const DEFAULT_MAX_FRAMES: u32 = 1536;

/// Default [`KernelWalkOptions::pending_dump_bytes`] where memory is not bounded.
pub const DEFAULT_PENDING_DUMP_BYTES: u32 = 1024 * 1024;

/// Most threads whose outermost stack address the program knows (its `thread_tops` map).
const MAX_THREAD_TOPS: usize = 4096;

/// Most binaries (paths) rows on demand remembers as asked for.
const MAX_WANTED: usize = 4096;
/// The mappings' fingerprint of a process expected but not read yet
/// ([`KernelWalk::expect_process`]): no real fingerprint is 0 but by a 1 in 2^64 chance.
const EXPECTED_PROCESS: u64 = 0;

/// Default [`KernelWalkOptions::pending_dump_rate_kib`] where memory is bounded (the agent:
/// with rows on demand every binary is pending until a walk reaches it).
pub const BOUNDED_DUMP_KIB_PER_SECOND: u32 = 64 * 1024;

/// Default [`KernelWalkOptions::pending_dump_rate_kib`] otherwise (`record`): rustc's driver
/// library, its rows compiled the first time while rustc runs, stays pending for about half a
/// second, its main thread's stack 0.6–1 MiB deep; at 64 MiB a second a CPU, 206 of its 1,561
/// samples went without a dump (87.8% whole), at 256 MiB none (99.7–99.9%), no sample lost.
pub const DUMP_KIB_PER_SECOND: u32 = 256 * 1024;

/// How long after a sample (by the clock, when the reader gets to it) its sample waits for the
/// rest of its walk, going on as task work. The thread runs it as soon as it is back on a CPU, and
/// a later walk of the thread ends the wait at once (it could not start before the work ended);
/// this bound is for a thread that blocks in the kernel right after a sample there and is not
/// sampled again. Generous, as a reader that falls behind a loaded machine sees its samples late.
pub const TASK_WALK_WAIT_NS: u64 = 10_000_000_000;

/// Default [`KernelWalkOptions::ring_bytes`].
pub const DEFAULT_RING_BYTES: u32 = 32 << 20;

/// Sizes of the walk's maps.
#[derive(Debug, Clone)]
pub struct KernelWalkOptions {
    /// The user stack bytes each sample copies (words below their end are not sent).
    pub copy_bytes: u32,
    /// Rows the shared table holds (16 bytes each, kernel memory allocated at load).
    pub rows: u32,
    /// Bytes of the ring buffer (a power of two).
    pub ring_bytes: u32,
    /// Frames walked per sample at most: the walk runs in the sampling interrupt, which must end
    /// well within the sampling period (about 0.3 µs a frame here). A deeper stack's walk goes on
    /// as task work (see `continue_in_task`), or, without it, is unwound the usual way past the
    /// copy (live reads with a proof), so stacks still have no depth cap.
    pub max_frames: u32,
    /// A walk that reaches `max_frames` in a sample of user code goes on in the thread's own
    /// context before it returns to user space (Linux 6.18's BPF task work), with no bound but
    /// the stack's end; the thread pays for its own deep stack. Off, or on an older kernel, the
    /// walk ends at `max_frames`.
    pub continue_in_task: bool,
    /// Stack bytes sent whole when the walk reaches a binary that is still being read or whose
    /// rows are still being compiled (a process's first moments after it starts or maps a
    /// library), so that its samples are unwound like later ones; 0: such walks just end.
    pub pending_dump_bytes: u32,
    /// How fast each CPU may send those stacks (KiB a second), after a burst of two seconds'
    /// worth: a process's start-up is covered, while a stack that stays pending cannot keep the
    /// reader busy copying dumps and make the perf rings overflow.
    pub pending_dump_rate_kib: u32,
    /// Rows are compiled and placed only for the binaries walks have reached (each one's first
    /// walk ends there, and says so): for a whole host, which maps far more binaries than it
    /// runs hot, so that a table of bounded size holds the ones samples need.
    pub rows_on_demand: bool,
    /// Where placed rows are counted (with the binaries' other tables).
    pub modules: rootline_image::ModuleBudget,
    /// The most the tables counted in `modules` may hold; rows that would pass it are not placed
    /// (that binary's frames end the walk, counted).
    pub module_limit: Option<usize>,
    /// The process's memory is limited: large binaries' rows are read or compiled one at a
    /// time, and none with more rows than half the table is (it is refused, counted).
    pub bounded: bool,
    /// Turn the kernel's BPF run-time statistics on while the walk is loaded, so that
    /// [`KernelWalkStats::run_time`] says how long the walks took in the sampled threads. While
    /// they are on, the kernel reads the clock around every BPF program's run on the host (a
    /// few tens of nanoseconds a run).
    pub run_time_stats: bool,
}

impl Default for KernelWalkOptions {
    fn default() -> Self {
        KernelWalkOptions {
            copy_bytes: 16 * 1024,
            rows: 4 << 20,
            ring_bytes: DEFAULT_RING_BYTES,
            max_frames: DEFAULT_MAX_FRAMES,
            continue_in_task: true,
            pending_dump_bytes: DEFAULT_PENDING_DUMP_BYTES,
            pending_dump_rate_kib: DUMP_KIB_PER_SECOND,
            rows_on_demand: false,
            modules: rootline_image::ModuleBudget::new(),
            module_limit: None,
            bounded: false,
            run_time_stats: false,
        }
    }
}

/// Counts of the walk, for the summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelWalkStats {
    /// Walks the program ran (all CPUs).
    pub walks: u64,
    /// Frames it walked.
    pub frames: u64,
    /// Chunks lost because the ring was full.
    pub lost_chunks: u64,
    /// Assembly and matching.
    pub join: JoinStats,
    /// How the walks ended, by reason.
    pub stops: std::collections::BTreeMap<WalkStop, u64>,
    /// Rows in the table.
    pub rows_used: u64,
    /// Binaries whose rows did not fit the table.
    pub binaries_refused: u64,
    /// Processes whose executable mappings outnumber what the program searches (the rest end
    /// the walk).
    pub mappings_cut: u64,
    /// The walks' time in the sampling interrupts, and how many times the program ran (by the
    /// kernel's BPF run-time statistics; None when they were not asked for or could not be
    /// turned on). Walks going on as task work past the interrupt's frame limit are not in it.
    pub run_time: Option<(std::time::Duration, u64)>,
}

/// The loaded program and its maps.
pub struct KernelWalk {
    ebpf: aya::Ebpf,
    procs: BpfHashMap<MapData, u32, Proc>,
    /// Threads' walks going on as task work (None: they end at `max_frames`).
    task_walks: Option<BpfHashMap<MapData, u32, TaskWalkSlot>>,
    /// Each thread's outermost stack address, as sent to the program (`thread_tops`) and as
    /// kept here (`tops`, so that an unchanged one costs no system call).
    thread_tops: BpfHashMap<MapData, u32, u64>,
    tops: HashMap<u32, u64>,
    ring: RingBuf<MapData>,
    counters: PerCpuArray<MapData, Counters>,
    rows: RowTable,
    /// Each process's mappings as last sent, by fingerprint.
    synced: HashMap<u32, u64>,
    /// The `generation` of the last process entry written (see [`KernelWalk::write_proc`]).
    proc_generation: u32,
    /// The generations ran out and the row memos could not be emptied: entries get 0.
    memo_off: bool,
    join: Join,
    stops: std::collections::BTreeMap<WalkStop, u64>,
    mappings_cut: u64,
    /// Whether walks send the stack at a pending binary.
    dumps: bool,
    /// Holds the kernel's BPF run-time statistics on (see [`KernelWalkOptions::run_time_stats`]).
    run_time_stats: Option<std::os::fd::OwnedFd>,
    /// With rows on demand, the binaries (by path) walks have reached: kept when their
    /// processes exit, so that the next process to map one (a build's next compiler) is walked
    /// with its rows from its first sample; at most [`MAX_WANTED`].
    wanted: Option<foldhash::HashSet<Arc<str>>>,
}

use join::Join;

impl KernelWalk {
    /// Loads the program and creates its maps.
    pub fn load(opts: KernelWalkOptions) -> Result<KernelWalk, KernelWalkError> {
        let kfunc = if opts.continue_in_task {
            task_work::kfunc_id()
        } else {
            None
        };
        let object = task_work::link(OBJECT, kfunc).map_err(KernelWalkError::Load)?;
        let mut ebpf = aya::EbpfLoader::new()
            .set_max_entries("rows", opts.rows.max(1))
            .set_max_entries("chunks", opts.ring_bytes.next_power_of_two().max(4096))
            .load(bytemuck::cast_slice(&object))
            .map_err(|e| KernelWalkError::Load(e.to_string()))?;
        let prog: &mut BpfPerfEvent = ebpf
            .program_mut("walk_user_stack")
            .ok_or_else(|| KernelWalkError::Load("program missing from the object".into()))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| KernelWalkError::Load(e.to_string()))?;
        prog.load()
            .map_err(|e| KernelWalkError::Load(verifier_text(&e)))?;
        let maps = |e: aya::maps::MapError| KernelWalkError::Maps(e.to_string());
        if kfunc.is_some() {
            // Walks past the frame limit go on as task work (see `task_work`).
            let cont: &mut BpfPerfEvent = ebpf
                .program_mut(CONTINUATION)
                .ok_or_else(|| KernelWalkError::Load(format!("{CONTINUATION} missing")))?
                .try_into()
                .map_err(|e: aya::programs::ProgramError| KernelWalkError::Load(e.to_string()))?;
            cont.load()
                .map_err(|e| KernelWalkError::Load(verifier_text(&e)))?;
            let fd = cont
                .fd()
                .map_err(|e| KernelWalkError::Load(e.to_string()))?
                .try_clone()
                .map_err(|e| KernelWalkError::Load(e.to_string()))?;
            let mut slot: aya::maps::ProgramArray<&mut MapData> = ebpf
                .map_mut("continuation")
                .ok_or_else(|| KernelWalkError::Maps("map continuation missing".into()))?
                .try_into()
                .map_err(maps)?;
            slot.set(0, &fd, 0).map_err(maps)?;
        }
        let take = |ebpf: &mut aya::Ebpf, name: &str| {
            ebpf.take_map(name)
                .ok_or_else(|| KernelWalkError::Maps(format!("map {name} missing")))
        };
        let mut config: aya::maps::Array<MapData, Config> =
            take(&mut ebpf, "config")?.try_into().map_err(maps)?;
        config
            .set(
                0,
                Config {
                    copy_bytes: opts.copy_bytes,
                    max_frames: opts.max_frames,
                    dump_bytes: opts.pending_dump_bytes,
                    dump_rate: opts.pending_dump_rate_kib,
                },
                0,
            )
            .map_err(maps)?;
        let rows_map = ebpf
            .map("rows")
            .ok_or_else(|| KernelWalkError::Maps("map rows missing".into()))?;
        let aya::maps::Map::Array(rows_data) = rows_map else {
            return Err(KernelWalkError::Maps("map rows is not an array".into()));
        };
        let mapped = MappedRows::new(rows_data.fd().as_fd(), opts.rows.max(1) as usize)
            .map_err(|e| KernelWalkError::Maps(format!("mapping the rows: {e}")))?;
        Ok(KernelWalk {
            procs: take(&mut ebpf, "procs")?.try_into().map_err(maps)?,
            task_walks: match kfunc {
                Some(_) => Some(take(&mut ebpf, "task_walks")?.try_into().map_err(maps)?),
                None => None,
            },
            thread_tops: take(&mut ebpf, "thread_tops")?.try_into().map_err(maps)?,
            tops: HashMap::default(),
            ring: take(&mut ebpf, "chunks")?.try_into().map_err(maps)?,
            counters: take(&mut ebpf, "counters")?.try_into().map_err(maps)?,
            ebpf,
            rows: RowTable::new(
                mapped,
                opts.modules.clone(),
                opts.module_limit,
                opts.bounded,
            ),
            synced: HashMap::default(),
            proc_generation: 0,
            memo_off: false,
            join: Join::default(),
            stops: Default::default(),
            mappings_cut: 0,
            dumps: opts.pending_dump_bytes > 0,
            run_time_stats: opts
                .run_time_stats
                .then(|| aya::sys::enable_stats(aya::sys::Stats::RunTime).ok())
                .flatten(),
            wanted: opts.rows_on_demand.then(Default::default),
        })
    }

    /// Runs the walk at each sample of `event` (and of the events it inherits to).
    pub fn attach(&mut self, event: &PerfEvent) -> Result<(), KernelWalkError> {
        let prog: &mut BpfPerfEvent = self
            .ebpf
            .program_mut("walk_user_stack")
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| KernelWalkError::Attach(std::io::Error::other("program missing")))?;
        let fd = prog
            .fd()
            .map_err(|e| KernelWalkError::Attach(std::io::Error::other(e.to_string())))?;
        event.set_bpf(fd.as_fd()).map_err(KernelWalkError::Attach)
    }

    /// Sends `pid`'s executable mappings to the program when they changed since the last call:
    /// mappings with CFI get their binary's rows (compiled and placed the first time), others
    /// (JIT code, binaries without CFI) a frame-pointer rule.
    /// With stack dumps on, regions whose binary `pending` says is still being parsed, or whose
    /// rows are being compiled, go as pending: the walk sends the stack there (see
    /// [`KernelWalkOptions::pending_dump_bytes`]); without, the former are walked by frame
    /// pointers and the latter end the walk.
    pub fn sync(&mut self, pid: u32, space: &AddressSpace, pending: impl Fn(u64) -> bool) {
        if self.rows.take_compiled() {
            // Rows arrived: every process mapping those binaries is sent again.
            self.synced.clear();
        }
        let mut h = foldhash::fast::FixedState::with_seed(0).build_hasher();
        for r in space.regions() {
            (r.start, r.end, r.bias).hash(&mut h);
            r.module.as_ref().map(std::sync::Arc::as_ptr).hash(&mut h);
            pending(r.start).hash(&mut h);
        }
        let print = h.finish();
        if self.synced.get(&pid) == Some(&print) {
            return;
        }
        self.synced.insert(pid, print);
        let mut proc = Box::<Proc>::default();
        let mut n = 0;
        for r in space.regions() {
            if n == MAX_MAPPINGS {
                self.mappings_cut += 1;
                break;
            }
            let mut m = Mapping {
                start: r.start,
                end: r.end,
                bias: r.bias,
                kind: MAPPING_FRAME_POINTERS,
                ..Mapping::default()
            };
            if let Some(module) = &r.module {
                let sections = rootline_unwind::Binary::unwind_sections(&**module);
                let unwanted = self.wanted.as_ref().is_some_and(|w| !w.contains(&r.path));
                if !sections.has_cfi() {
                    // No rows to place: walked by frame pointers (the default above).
                } else if unwanted {
                    // Its first walk ends here, and asks for its rows (`want_binary_at`).
                    m.kind = MAPPING_PENDING;
                } else {
                    match self.rows.place(sections) {
                        Some(p) => {
                            m.kind = MAPPING_TABLE;
                            m.row_start = p.start;
                            m.row_count = p.count;
                            m.base = p.base;
                            m.page_count = p.index.count;
                            m.page_shift = p.index.shift;
                        }
                        None if self.dumps && self.rows.is_compiling(sections) => {
                            m.kind = MAPPING_PENDING;
                        }
                        None => m.kind = MAPPING_NONE,
                    }
                }
            } else if r.refused {
                m.kind = MAPPING_NONE;
            } else if self.dumps && pending(r.start) {
                m.kind = MAPPING_PENDING;
            } else {
                // Code with no file (JIT code): the runtime moves and replaces it.
                m.flags = MAPPING_CODE_MOVES;
            }
            proc.m[n] = m;
            n += 1;
        }
        proc.count = n as u32;
        // A failed update leaves the old mappings: the unwinder checks every word's use anyway.
        let _ = self.write_proc(pid, &mut proc);
    }

    /// Writes `pid`'s entry with a `generation` no entry in the row memos has: the walk's row
    /// memo keeps rows for one entry as written, so new mappings, rows placed or let go, or the
    /// pid used again, are never answered from rows found for an older entry.
    fn write_proc(&mut self, pid: u32, proc: &mut Proc) -> Result<(), aya::maps::MapError> {
        proc.generation = self.next_generation();
        self.procs.insert(pid, *proc, 0)
    }

    /// The next process entry's `generation`. When the numbers run out they start again at 1
    /// with every CPU's memo emptied; if it cannot be emptied, entries get 0 from then on,
    /// which the program never looks up in the memo.
    fn next_generation(&mut self) -> u32 {
        if self.memo_off {
            return 0;
        }
        self.proc_generation = match self.proc_generation.checked_add(1) {
            Some(g) => g,
            None if self.forget_row_memos() => 1,
            None => {
                self.memo_off = true;
                0
            }
        };
        self.proc_generation
    }

    /// Empties every CPU's row memo; false when it could not.
    fn forget_row_memos(&mut self) -> bool {
        let Some(map) = self.ebpf.map_mut("row_memos") else {
            return false;
        };
        let Ok(mut memos) = PerCpuArray::<&mut MapData, [u8; ROW_MEMO_BYTES]>::try_from(map) else {
            return false;
        };
        let Ok(cpus) = aya::util::nr_cpus() else {
            return false;
        };
        PerCpuValues::try_from(vec![[0u8; ROW_MEMO_BYTES]; cpus])
            .is_ok_and(|zeros| memos.set(0, zeros, 0).is_ok())
    }

    /// Readies the walk for a process about to start (a launched command, stopped before its
    /// `exec`): until its mappings are sent, each walk of it sends the stack as a pending walk
    /// does (with stack dumps on), so its first samples, taken before user space has read its
    /// `exec`, are unwound once it has, instead of ending with whatever the sample's copy held
    /// (nothing, when the stack had just grown onto a page not touched yet).
    pub fn expect_process(&mut self, pid: u32) {
        if !self.dumps {
            return;
        }
        let mut proc = Box::<Proc>::default();
        proc.m[0] = Mapping {
            start: 0,
            end: u64::MAX,
            kind: MAPPING_PENDING,
            ..Mapping::default()
        };
        proc.count = 1;
        if self.write_proc(pid, &mut proc).is_ok() {
            // No mappings' fingerprint: the first real ones replace these.
            self.synced.insert(pid, EXPECTED_PROCESS);
        }
    }

    /// Waits (until `deadline` at most) for the rows of every binary sent so far, then sends the
    /// processes' mappings again: call before sampling starts, so that the first samples of a
    /// process attached to are walked with its binaries' rules.
    pub fn wait_for_rows(&mut self, deadline: std::time::Instant) {
        self.rows.wait_compiled(deadline);
        self.synced.clear();
    }

    /// Stops walking `pid`'s stacks (it exited or is no longer recorded), and frees the rows no
    /// process uses any more.
    pub fn forget_process(&mut self, pid: u32) {
        if self.synced.remove(&pid).is_some() {
            let _ = self.procs.remove(&pid);
        }
        self.rows.sweep();
    }

    /// Reads every chunk the ring holds. Call after reading the perf rings' heads and before
    /// handling their samples: a sample's walk is written before the sample.
    pub fn drain(&mut self) -> usize {
        let mut n = 0;
        while let Some(item) = self.ring.next() {
            self.join.chunk(&item);
            n += 1;
        }
        n
    }

    /// The walk made at thread `tid`'s sample at `time` with user registers `(ip, sp, bp)`.
    pub fn claim(
        &mut self,
        tid: u32,
        time: u64,
        (ip, sp, bp): (u64, u64, u64),
    ) -> Option<std::sync::Arc<KernelStack>> {
        let walk = match self.join.claim(tid, time, ip, sp, bp) {
            Some(w) => w,
            None => {
                // The ring's reader stops at a record another CPU is still writing: chunks
                // after it (this walk's last ones, perhaps) wait for the next read.
                self.drain();
                self.join.claim(tid, time, ip, sp, bp)?
            }
        };
        *self.stops.entry(walk.stop).or_default() += 1;
        Some(walk)
    }

    /// With rows on demand: a walk ended at a binary whose rows were not asked for yet; asks
    /// for the rows of the binaries at `addrs` in `space` (the frames its sample's unwind
    /// reached, and where the walk ended: one sample asks for a new process's whole chain of
    /// binaries, instead of one binary per round). Every process mapping them is sent again once
    /// they are placed.
    pub fn want_binaries_at(&mut self, addrs: impl IntoIterator<Item = u64>, space: &AddressSpace) {
        let Some(wanted) = self.wanted.as_mut() else {
            return;
        };
        let mut asked = false;
        for addr in addrs {
            let region = [addr, addr.wrapping_sub(1)]
                .into_iter()
                .find_map(|a| space.region(a).filter(|r| r.module.is_some()));
            if let Some(r) = region
                && !wanted.contains(&r.path)
            {
                if wanted.len() >= MAX_WANTED {
                    // A host that ran that many distinct binaries: the ones still hot are
                    // asked for again by their next walks.
                    wanted.clear();
                }
                wanted.insert(Arc::clone(&r.path));
                asked = true;
            }
        }
        if asked {
            self.synced.clear();
        }
    }

    /// The ring buffer's descriptor, readable when walks wait in it (for `poll`).
    pub fn ring_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.ring.as_raw_fd()
    }

    /// Whether `pid`'s mappings were sent to the program.
    pub fn tracks(&self, pid: u32) -> bool {
        self.synced.contains_key(&pid)
    }

    /// A thread exited: its entry for walks going on as task work goes (a walk of it still
    /// to come will not).
    pub fn thread_exited(&mut self, tid: u32) {
        self.join.thread_exited(tid);
        if let Some(map) = self.task_walks.as_mut() {
            // Absent when the thread's walks never went on as task work.
            let _ = map.remove(&tid);
        }
        self.thread_not_in_copy(tid);
    }

    /// Thread `tid`'s sample was unwound whole, from its registers to its outermost frame,
    /// whose stack pointer is `top`: the program does not walk the thread's samples whose copy
    /// reaches `top` ([`WalkStop::InCopy`]); they are unwound from their copy. The highest `top`
    /// is kept (a thread's outermost frame stays where it is); at most [`MAX_THREAD_TOPS`]
    /// threads.
    pub fn thread_whole(&mut self, tid: u32, top: u64) {
        match self.tops.get(&tid) {
            Some(&known) if known >= top => return,
            None if self.tops.len() >= MAX_THREAD_TOPS => return,
            _ => {}
        }
        if self.thread_tops.insert(tid, top, 0).is_ok() {
            self.tops.insert(tid, top);
        }
    }

    /// A sample of `tid` that was not walked for its copy was not whole from its copy (its
    /// outermost frame was not where it had been, as after an `exec`): the thread's samples are
    /// walked again until it has another whole one.
    pub fn thread_not_in_copy(&mut self, tid: u32) {
        if self.tops.remove(&tid).is_some() {
            let _ = self.thread_tops.remove(&tid);
        }
    }

    /// Whether thread `tid`'s sample at `time` waits for its walk, still going on as task work
    /// (for at most [`TASK_WALK_WAIT_NS`] after the sample, `now` being the monotonic clock).
    pub fn in_flight(&self, tid: u32, time: u64, now: u64) -> bool {
        now < time.saturating_add(TASK_WALK_WAIT_NS) && self.join.in_flight(tid, time)
    }

    /// The counts so far.
    pub fn stats(&self) -> KernelWalkStats {
        let mut s = KernelWalkStats {
            join: self.join.stats.clone(),
            stops: self.stops.clone(),
            rows_used: self.rows.used,
            binaries_refused: self.rows.refused,
            mappings_cut: self.mappings_cut,
            ..KernelWalkStats::default()
        };
        if let Ok(per_cpu) = self.counters.get(&0, 0) {
            for c in per_cpu.iter() {
                s.walks += c.walks;
                s.frames += c.frames;
                s.lost_chunks += c.lost_chunks;
            }
        }
        if self.run_time_stats.is_some()
            && let Some(info) = self
                .ebpf
                .program("walk_user_stack")
                .and_then(|p| p.info().ok())
        {
            s.run_time = Some((info.run_time(), info.run_count()));
        }
        s
    }
}

/// The verifier's log when it refused the program, else the error.
fn verifier_text(e: &aya::programs::ProgramError) -> String {
    match e {
        aya::programs::ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            let tail: Vec<&str> = log.lines().rev().take(12).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!("{io_error}: {}", tail.join(" | "))
        }
        e => e.to_string(),
    }
}

#[cfg(test)]
mod tests;
