//! The sample pipeline: records in, [`Profile`] out.
//!
//! Per sample (the hot path) it unwinds to raw addresses and interns them — one raw frame per
//! distinct address per mapping, one raw trie node per distinct (caller, frame) — then queues the
//! sample. At each flush it symbolizes only the raw frames that are new since the last flush,
//! translates new raw nodes into the profile's stack trie, and appends the queued samples.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use rootline_profile::{
    FrameId, FrameKind, Function, Mapping, MappingId, Profile, StackId, ThreadId,
};

use crate::jit::{JitMaps, JitMemory};
use crate::perf_event::{Record, Sample};
use crate::process::{BinaryFile, Processes, thread_name};
use crate::symbolize::Symbolizer;
use crate::unwind::{SampleStack, StackEnd, TruncateReason};

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
}

impl Stats {
    /// Total truncated samples.
    pub fn truncated_total(&self) -> u64 {
        self.truncated.values().sum()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum RawKind {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct RawFrame {
    kind: RawKind,
    address: u64,
}

struct RawMapping {
    /// The process it was first seen in (JIT code is named through that process's maps).
    pid: u32,
    start: u64,
    end: u64,
    file_offset: u64,
    binary: Arc<BinaryFile>,
    profile_id: Option<MappingId>,
}

struct Pending {
    time: u64,
    thread: ThreadId,
    node: u32,
    nanos: i64,
}

const NO_NODE: u32 = u32::MAX;

/// Turns perf records into a profile.
pub struct Pipeline {
    /// The profile being built (complete up to the last flush).
    pub profile: Profile,
    /// Counts.
    pub stats: Stats,
    processes: Processes,
    symbolizer: Symbolizer,
    jit: JitMaps,
    kernel: bool,
    period_nanos: Option<i64>,
    mappings: Vec<RawMapping>,
    mapping_index: HashMap<(u64, usize), u32>,
    frames: Vec<RawFrame>,
    frame_index: HashMap<RawFrame, u32>,
    nodes: Vec<(u32, u32)>,
    node_index: HashMap<(u32, u32), u32>,
    frame_map: Vec<Vec<FrameId>>,
    node_map: Vec<StackId>,
    pending: Vec<Pending>,
    threads: HashMap<(u32, u32), ThreadId>,
    refreshed: HashMap<u32, Instant>,
    exec_times: HashMap<u32, u64>,
    addrs: Vec<u64>,
}

impl Pipeline {
    /// A pipeline writing into `profile`. `period_nanos` converts one sample to CPU time when the
    /// event period is not in nanoseconds (hardware cycles); None for `cpu-clock`.
    pub fn new(profile: Profile, kernel: bool, period_nanos: Option<i64>) -> Pipeline {
        Pipeline {
            profile,
            stats: Stats::default(),
            processes: Processes::new(),
            symbolizer: Symbolizer::new(),
            jit: JitMaps::new(),
            kernel,
            period_nanos,
            mappings: Vec::new(),
            mapping_index: HashMap::new(),
            frames: Vec::new(),
            frame_index: HashMap::new(),
            nodes: Vec::new(),
            node_index: HashMap::new(),
            frame_map: Vec::new(),
            node_map: Vec::new(),
            pending: Vec::new(),
            threads: HashMap::new(),
            refreshed: HashMap::new(),
            exec_times: HashMap::new(),
            addrs: Vec::new(),
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
            } => self
                .processes
                .mmap(pid, addr, len, pgoff, file_key, filename),
            Record::Comm {
                pid,
                tid,
                name,
                exec,
            } => {
                if exec {
                    self.processes.exec(pid);
                    self.jit.exec(pid);
                    self.exec_times.insert(pid, time);
                }
                if let Some(&t) = self.threads.get(&(pid, tid)) {
                    self.profile.set_thread_name(t, name);
                }
                if pid == tid {
                    self.profile.set_process_name(pid, name);
                }
            }
            Record::Fork { pid, ppid, .. } => self.processes.fork(pid, ppid),
            Record::Lost(n) => self.stats.lost += n,
            Record::Exit { .. } | Record::Sample(_) | Record::Other => {}
        }
    }

    /// Handles one sample: unwind, intern, queue.
    pub fn sample(&mut self, s: &Sample<'_>) {
        self.stats.samples += 1;
        let thread = self.thread(s.pid, s.tid);
        let mut node = NO_NODE;
        match s.user_regs {
            Some((ip, ..)) if self.in_exec(s, ip) => node = self.node(node, RawKind::Exec, 0),
            None => {
                if s.kernel_ips.is_empty() {
                    node = self.node(node, RawKind::KernelOnly, 0);
                }
            }
            Some((ip, sp, bp)) => {
                let end = self.unwind(s.pid, ip, sp, bp, s.stack);
                if let StackEnd::Truncated(reason) = end {
                    *self.stats.truncated.entry(reason).or_default() += 1;
                    node = self.node(node, RawKind::Truncated(reason), 0);
                }
                let addrs = std::mem::take(&mut self.addrs);
                for (i, &addr) in addrs.iter().enumerate().rev() {
                    let is_return = i > 0;
                    let kind = self.user_kind(s.pid, addr, is_return);
                    node = self.node(node, kind, addr);
                }
                self.addrs = addrs;
            }
        }
        for &ip in s.kernel_ips.iter().rev() {
            node = self.node(node, RawKind::Kernel, ip);
        }
        let nanos = self.period_nanos.unwrap_or(s.period as i64);
        self.pending.push(Pending {
            time: s.time,
            thread,
            node,
            nanos,
        });
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

    fn unwind(&mut self, pid: u32, ip: u64, sp: u64, bp: u64, stack: &[u8]) -> StackEnd {
        let mut end = self.unwind_once(pid, ip, sp, bp, stack);
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
                end = self.unwind_once(pid, ip, sp, bp, stack);
            }
        }
        end
    }

    fn unwind_once(&mut self, pid: u32, ip: u64, sp: u64, bp: u64, stack: &[u8]) -> StackEnd {
        let state = self.processes.get(pid);
        let mut mem = JitMemory {
            stack: SampleStack {
                base: sp,
                bytes: stack,
                fallback: None,
            },
            jit: self.jit.process(pid),
        };
        state.space.unwind(ip, sp, bp, &mut mem, &mut self.addrs)
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
            profile_id: None,
        });
        self.mapping_index.insert(key, m);
        RawKind::User(m, is_return)
    }

    fn node(&mut self, parent: u32, kind: RawKind, address: u64) -> u32 {
        let frame = RawFrame { kind, address };
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

    fn thread(&mut self, pid: u32, tid: u32) -> ThreadId {
        if let Some(&t) = self.threads.get(&(pid, tid)) {
            return t;
        }
        let t = self.profile.intern_thread(pid, tid);
        if let Some(name) = thread_name(pid, tid) {
            self.profile.set_thread_name(t, &name);
            if pid == tid {
                self.profile.set_process_name(pid, &name);
            }
        }
        self.threads.insert((pid, tid), t);
        self.stats.threads = self.threads.len() as u64;
        t
    }

    /// Symbolizes new frames, extends the profile's stack trie and appends queued samples.
    pub fn flush(&mut self) {
        self.symbolize_new_frames();
        for i in self.node_map.len()..self.nodes.len() {
            let (parent, frame) = self.nodes[i];
            let mut stack = (parent != NO_NODE).then(|| self.node_map[parent as usize]);
            for &f in &self.frame_map[frame as usize] {
                stack = Some(self.profile.intern_stack(stack, f));
            }
            // Every raw frame yields at least one profile frame, so `stack` is set.
            self.node_map.push(stack.unwrap_or(StackId(0)));
        }
        for p in self.pending.drain(..) {
            let stack = self.node_map[p.node as usize];
            // Ids come from this profile and the value count matches its two sample types.
            let _ = self
                .profile
                .push_sample(p.time, p.thread, stack, &[1, p.nanos]);
        }
    }

    fn symbolize_new_frames(&mut self) {
        let start = self.frame_map.len();
        let mut by_mapping: HashMap<u32, Vec<usize>> = HashMap::new();
        for i in start..self.frames.len() {
            if let RawKind::User(m, _) = self.frames[i].kind {
                by_mapping.entry(m).or_default().push(i);
            }
        }
        let mut symbols: HashMap<usize, Vec<crate::symbolize::SymbolFrame>> = HashMap::new();
        for (m, idxs) in by_mapping {
            let mapping = &self.mappings[m as usize];
            let Some(path) = mapping.binary.reopen_path() else {
                continue;
            };
            let Some(module) = mapping.binary.module.clone() else {
                continue;
            };
            let svmas: Vec<u64> = idxs
                .iter()
                .map(|&i| {
                    let offset = self.file_offset(m, self.frames[i]);
                    module.svma_of_file_offset(offset).unwrap_or(u64::MAX)
                })
                .collect();
            for (i, syms) in idxs.iter().zip(self.symbolizer.symbolize_file(
                &path,
                module.build_id(),
                &svmas,
                |a| module.symbol_name(a).map(str::to_string),
            )) {
                symbols.insert(*i, syms);
            }
        }
        for i in start..self.frames.len() {
            let frame = self.frames[i];
            let ids = match frame.kind {
                RawKind::User(m, _) if self.mappings[m as usize].binary.module.is_none() => {
                    self.jit_frame(m, frame)
                }
                RawKind::User(m, _) => {
                    let mapping = self.profile_mapping(m);
                    let syms = symbols.remove(&i).unwrap_or_default();
                    if syms.is_empty() {
                        let name = format!(
                            "{}+0x{:x}",
                            basename(&self.mappings[m as usize].binary.path),
                            frame.address - self.mappings[m as usize].start
                                + self.mappings[m as usize].file_offset
                        );
                        vec![self.frame(
                            &name,
                            None,
                            Some(mapping),
                            frame.address,
                            None,
                            0,
                            FrameKind::Native,
                        )]
                    } else {
                        syms.iter()
                            .enumerate()
                            .map(|(depth, s)| {
                                self.frame(
                                    &s.name,
                                    s.file.as_deref(),
                                    Some(mapping),
                                    frame.address,
                                    s.line,
                                    depth.min(255) as u8,
                                    FrameKind::Native,
                                )
                            })
                            .collect()
                    }
                }
                RawKind::Unknown => {
                    let name = format!("[unknown]+0x{:x}", frame.address);
                    vec![self.frame(&name, None, None, frame.address, None, 0, FrameKind::Native)]
                }
                RawKind::Kernel => {
                    let name = self
                        .symbolizer
                        .kernel(frame.address)
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("[kernel]+0x{:x}", frame.address));
                    vec![self.frame(&name, None, None, frame.address, None, 0, FrameKind::Kernel)]
                }
                RawKind::KernelOnly => {
                    vec![
                        self.profile
                            .intern_named_frame("[kernel]", FrameKind::Kernel),
                    ]
                }
                RawKind::Exec => vec![
                    self.profile
                        .intern_named_frame("[kernel: exec]", FrameKind::Kernel),
                ],
                RawKind::Truncated(reason) => {
                    vec![
                        self.profile
                            .intern_named_frame(&reason.frame_name(), FrameKind::Truncated),
                    ]
                }
            };
            self.frame_map.push(ids);
        }
    }

    /// The frame of an address in code without a file image: named through the process's JIT
    /// map when it has an entry, else `path+0xOFFSET` like any unnamed address.
    fn jit_frame(&mut self, m: u32, frame: RawFrame) -> Vec<FrameId> {
        let lookup = match frame.kind {
            RawKind::User(_, true) => frame.address - 1,
            _ => frame.address,
        };
        let mapping = &self.mappings[m as usize];
        let (pid, start, end) = (mapping.pid, mapping.start, mapping.end);
        let symbol = self.jit.process(pid).symbol(lookup).cloned();
        let Some(symbol) = symbol else {
            let mapping = self.profile_mapping(m);
            let m = &self.mappings[m as usize];
            let base = match basename(&m.binary.path) {
                "" => "[anon]",
                b => b,
            };
            let name = format!("{base}+0x{:x}", frame.address - m.start + m.file_offset);
            return vec![self.frame(
                &name,
                None,
                Some(mapping),
                frame.address,
                None,
                0,
                FrameKind::Native,
            )];
        };
        let name = symbol.name;
        let module = name.module.as_deref().unwrap_or("[jit]");
        let path = self.profile.intern_string(module);
        let mapping = self.profile.intern_mapping(Mapping {
            start,
            end,
            file_offset: 0,
            path,
            build_id: None,
        });
        vec![self.frame(
            &name.name,
            name.file.as_deref(),
            Some(mapping),
            frame.address,
            None,
            0,
            name.kind,
        )]
    }

    fn file_offset(&self, m: u32, frame: RawFrame) -> u64 {
        let mapping = &self.mappings[m as usize];
        let lookup = match frame.kind {
            RawKind::User(_, true) => frame.address - 1,
            _ => frame.address,
        };
        lookup - mapping.start + mapping.file_offset
    }

    fn profile_mapping(&mut self, m: u32) -> MappingId {
        if let Some(id) = self.mappings[m as usize].profile_id {
            return id;
        }
        let mapping = &self.mappings[m as usize];
        let (start, end, file_offset) = (mapping.start, mapping.end, mapping.file_offset);
        let binary = mapping.binary.clone();
        let path = self.profile.intern_string(&binary.path);
        let build_id = binary
            .module
            .as_ref()
            .and_then(|m| m.build_id())
            .map(|b| self.profile.intern_string(b));
        let id = self.profile.intern_mapping(Mapping {
            start,
            end,
            file_offset,
            path,
            build_id,
        });
        self.mappings[m as usize].profile_id = Some(id);
        id
    }

    #[allow(clippy::too_many_arguments)]
    fn frame(
        &mut self,
        name: &str,
        file: Option<&str>,
        mapping: Option<MappingId>,
        address: u64,
        line: Option<u32>,
        inline_depth: u8,
        kind: FrameKind,
    ) -> FrameId {
        let name = self.profile.intern_string(name);
        let file = file.map(|f| self.profile.intern_string(f));
        let function = self.profile.intern_function(Function { name, file });
        self.profile.intern_frame(rootline_profile::Frame {
            function,
            mapping,
            address,
            line,
            inline_depth,
            kind,
        })
    }
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}
