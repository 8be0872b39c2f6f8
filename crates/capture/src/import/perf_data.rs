//! `perf.data` (perf record's own file) read natively with the `linux-perf-data` crate.
//!
//! Records are replayed in file order: MMAP/MMAP2 records build each process's executable regions
//! (the binaries they name are opened from this machine and used only when their build id matches
//! the one perf recorded), COMM records name threads, FORK gives a new process its parent's
//! regions, and each SAMPLE becomes a stack:
//!
//! - frame-pointer call graphs (`--call-graph fp`, or `-g`): the kernel's call chain as recorded,
//!   kernel and user parts, context markers dropped; a chain the kernel stopped at its depth
//!   limit ends in `[truncated: depth cap N]`, and one that ends anywhere but a thread's entry
//!   (perf's walk stops where frame pointers do) in `[truncated: bad-frame-pointer]`;
//! - DWARF call graphs (`--call-graph dwarf`): the kernel part of the chain, then the user stack
//!   unwound by rootline's unwinder from the sample's registers and stack copy (see
//!   [`unwind_user`]). A stack whose walk needed bytes past perf's copy ends in
//!   `[truncated: stack-copy-exhausted]`; any other early end in its own `[truncated: …]` frame.
//!
//! Addresses are symbolized with the binaries' symbol tables and DWARF (inlined frames included);
//! kernel addresses through this machine's `/proc/kallsyms`.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use linux_perf_data::linux_perf_event_reader::{
    CpuMode, EventRecord, Mmap2FileId, Regs, SampleRecord,
};
use linux_perf_data::{PerfFileReader, PerfFileRecord};
use rootline_profile::{FrameKind, Profile, SampleType, StackId};

use crate::symbolize::Symbolizer;
use crate::unwind::regs::PERF_MASK;
use crate::unwind::{
    AddressSpace, CodeModule, Region, Registers, SampleStack, StackEnd, TruncateReason,
};

/// Why a `perf.data` file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PerfDataError {
    /// The file could not be opened.
    #[error("can't open {path}: {source}")]
    Open {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a perf.data file, or is damaged.
    #[error("not a readable perf.data file: {0}")]
    Parse(#[from] linux_perf_data::Error),
}

/// The kernel's default depth limit of call chains (`kernel.perf_event_max_stack`).
const DEFAULT_MAX_STACK: u16 = 127;
/// Call-chain entries at or above this are context markers (`PERF_CONTEXT_*`), not addresses.
const PERF_CONTEXT_MAX: u64 = -4095i64 as u64;
/// The marker that starts the kernel part of a call chain.
const PERF_CONTEXT_KERNEL: u64 = -128i64 as u64;

/// One frame of a sample before symbolization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Raw {
    /// A kernel address.
    Kernel(u64),
    /// A user address in region `region` of the file's region table (`lookup`: the address to
    /// symbolize, a return address minus one).
    User { region: u32, lookup: u64 },
    /// A user address in no known region.
    Unknown(u64),
    /// The stack ends early.
    Truncated(crate::unwind::TruncateReason),
    /// The kernel's call chain stopped at its depth limit (`perf_event_max_stack`, or perf's
    /// `--call-graph fp,N`): `[truncated: depth cap N]`, as `rootline repair` names it.
    Cap(u16),
}

/// One process: its regions (indexes into the file's table) and the unwinder's view of them.
#[derive(Default)]
struct Process {
    regions: Vec<u32>,
    space: Option<AddressSpace>,
}

/// The state of a replay (see the module documentation).
struct Replay {
    /// Every region seen, with the binary's build id when perf recorded one.
    regions: Vec<Region>,
    processes: HashMap<u32, Process>,
    /// Opened binaries by path: None when unreadable or not the binary perf saw.
    modules: HashMap<String, Option<Arc<CodeModule>>>,
    /// Build ids perf recorded, by path (hex).
    build_ids: HashMap<String, String>,
    mismatched: Vec<String>,
    /// Most entries the kernel puts in a call chain.
    max_stack: u16,
    /// Where the opened binaries are counted.
    budget: rootline_image::ModuleBudget,
}

/// Reads the `perf.data` file at `path` into a profile.
pub fn read(path: &Path) -> Result<Profile, PerfDataError> {
    let file = File::open(path).map_err(|source| PerfDataError::Open {
        path: path.display().to_string(),
        source,
    })?;
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(BufReader::new(file))?;
    let build_ids = perf_file
        .build_ids()
        .unwrap_or_default()
        .into_values()
        .map(|d| {
            (
                String::from_utf8_lossy(&d.path).into_owned(),
                hex(&d.build_id),
            )
        })
        .collect();
    let clock = perf_file
        .event_attributes()
        .iter()
        .filter_map(|a| a.name())
        .all(|n| n == "cpu-clock" || n == "task-clock");
    let mut profile = Profile::new(vec![
        SampleType::samples(),
        if clock {
            SampleType::new("cpu", "nanoseconds")
        } else {
            SampleType::new("events", "count")
        },
    ]);
    profile.metadata.producer = "perf record (perf.data)".into();
    let mut replay = Replay {
        budget: rootline_image::ModuleBudget::new(),
        regions: Vec::new(),
        processes: HashMap::new(),
        modules: HashMap::new(),
        build_ids,
        mismatched: Vec::new(),
        max_stack: perf_file
            .event_attributes()
            .first()
            .map(|a| a.attributes().sample_max_stack)
            .filter(|&n| n > 0)
            .unwrap_or(DEFAULT_MAX_STACK),
    };
    // pid, tid, time, period, frames leaf first, and whether the user part is perf's own
    // frame-pointer chain.
    let mut samples: Vec<(u32, u32, u64, i64, Vec<Raw>, bool)> = Vec::new();
    let mut names: HashMap<(u32, u32), String> = HashMap::new();
    let mut truncated: HashMap<String, u64> = HashMap::new();
    while let Some(record) = record_iter.next_record(&mut perf_file)? {
        let PerfFileRecord::EventRecord { record, .. } = record else {
            continue;
        };
        let Ok(parsed) = record.parse() else {
            continue;
        };
        match parsed {
            EventRecord::Mmap(m) if m.is_executable && m.cpu_mode == CpuMode::User => {
                let path = String::from_utf8_lossy(&m.path.as_slice()).into_owned();
                replay.map(m.pid, m.address, m.length, m.page_offset, path, None);
            }
            EventRecord::Mmap2(m) if m.protection & 4 != 0 && m.cpu_mode == CpuMode::User => {
                let path = String::from_utf8_lossy(&m.path.as_slice()).into_owned();
                let id = match &m.file_id {
                    Mmap2FileId::BuildId(id) => Some(hex(id)),
                    Mmap2FileId::InodeAndVersion(_) => None,
                };
                replay.map(m.pid, m.address, m.length, m.page_offset, path, id);
            }
            EventRecord::Comm(c) => {
                let (pid, tid) = (c.pid as u32, c.tid as u32);
                if c.is_execve {
                    replay.processes.remove(&pid);
                }
                let name = String::from_utf8_lossy(&c.name.as_slice()).into_owned();
                names.insert((pid, tid), name);
            }
            EventRecord::Fork(f) if f.pid != f.ppid => {
                let parent = replay
                    .processes
                    .get(&(f.ppid as u32))
                    .map(|p| p.regions.clone())
                    .unwrap_or_default();
                replay.processes.insert(
                    f.pid as u32,
                    Process {
                        regions: parent,
                        space: None,
                    },
                );
            }
            EventRecord::Sample(s) => {
                let (Some(pid), Some(tid)) = (s.pid, s.tid) else {
                    continue;
                };
                let (pid, tid) = (pid as u32, tid as u32);
                let (frames, fp_chain) = replay.sample_frames(pid, &s);
                match frames.last() {
                    Some(Raw::Truncated(reason)) => {
                        *truncated.entry(reason.to_string()).or_default() += 1;
                    }
                    Some(Raw::Cap(_)) => *truncated.entry("depth-cap".into()).or_default() += 1,
                    _ => {}
                }
                let period = i64::try_from(s.period.unwrap_or(1)).unwrap_or(i64::MAX);
                samples.push((pid, tid, s.timestamp.unwrap_or(0), period, frames, fp_chain));
            }
            _ => {}
        }
    }

    let names_of = replay.symbolize(samples.iter().flat_map(|s| s.4.iter().copied()));
    let (mut start, mut end) = (u64::MAX, 0);
    for (pid, tid, time, period, frames, fp_chain) in samples {
        let thread = profile.intern_thread(pid, tid);
        let mut stack: Option<StackId> = None;
        if fp_chain && !ends_at_entry(&frames, &names_of) {
            *truncated
                .entry(TruncateReason::BadFramePointer.to_string())
                .or_default() += 1;
            let frame = profile.intern_truncated(TruncateReason::BadFramePointer);
            stack = Some(profile.intern_stack(None, frame));
        }
        for raw in frames.iter().rev() {
            for (name, kind) in names_of.get(raw).into_iter().flatten().rev() {
                let frame = profile.intern_named_frame(name, *kind);
                stack = Some(profile.intern_stack(stack, frame));
            }
        }
        let Some(stack) = stack else { continue };
        if profile
            .push_sample(time, thread, stack, &[1, period])
            .is_ok()
        {
            start = start.min(time);
            end = end.max(time);
        }
    }
    for ((pid, tid), name) in names {
        let thread = profile.intern_thread(pid, tid);
        profile.set_thread_name(thread, &name);
        if pid == tid {
            profile.set_process_name(pid, &name);
        }
    }
    if start <= end {
        profile.metadata.start_time_ns = start;
        profile.metadata.end_time_ns = end;
    }
    if truncated.contains_key("depth-cap") {
        profile.metadata.depth_cap = Some(u32::from(replay.max_stack));
    }
    for (reason, count) in truncated {
        profile.metadata.truncated_samples += count;
        profile
            .metadata
            .extra
            .insert(format!("truncated.{reason}"), count.to_string());
    }
    if !replay.mismatched.is_empty() {
        replay.mismatched.sort();
        replay.mismatched.dedup();
        profile.metadata.extra.insert(
            "warning.perf-data-build-id".into(),
            format!(
                "not symbolized, the file on this machine is not the one perf recorded (build id \
                 differs): {}",
                replay.mismatched.join(", ")
            ),
        );
    }
    Ok(profile)
}

impl Replay {
    /// Adds an executable mapping of `path` to process `pid`.
    fn map(
        &mut self,
        pid: i32,
        start: u64,
        len: u64,
        offset: u64,
        path: String,
        id: Option<String>,
    ) {
        if pid < 0 {
            return;
        }
        let module = self.module(&path, id);
        let region = Region::new(
            start,
            start.saturating_add(len),
            offset,
            path.into(),
            module,
        );
        let process = self.processes.entry(pid as u32).or_default();
        if let Some(space) = process.space.as_mut() {
            space.add_region(region.clone());
        }
        process.regions.push(self.regions.len() as u32);
        self.regions.push(region);
    }

    /// The binary at `path`, when it can be read and is the one perf saw (`id`, or the build id
    /// of perf's build-id table).
    fn module(&mut self, path: &str, id: Option<String>) -> Option<Arc<CodeModule>> {
        if let Some(m) = self.modules.get(path) {
            return m.clone();
        }
        let module = (path.starts_with('/'))
            .then(|| File::open(path).ok())
            .flatten()
            .and_then(|f| CodeModule::open(path, f, &self.budget, None).ok());
        let expected = id.or_else(|| self.build_ids.get(path).cloned());
        let module = match (module, expected) {
            (Some(m), Some(want)) => {
                let same = m.build_id().is_some_and(|have| want.starts_with(have));
                if !same {
                    self.mismatched.push(path.to_string());
                }
                same.then(|| Arc::new(m))
            }
            (m, None) => m.map(Arc::new),
            (None, Some(_)) => None,
        };
        self.modules.insert(path.to_string(), module.clone());
        module
    }

    /// The region of process `pid` holding `addr`, latest mapping first.
    fn region_of(&self, pid: u32, addr: u64) -> Option<u32> {
        let process = self.processes.get(&pid)?;
        process.regions.iter().rev().copied().find(|&r| {
            let region = &self.regions[r as usize];
            (region.start..region.end).contains(&addr)
        })
    }

    /// A user address of process `pid` (`ret`: a return address).
    fn user(&self, pid: u32, addr: u64, ret: bool) -> Raw {
        match self.region_of(pid, addr) {
            Some(region) => Raw::User {
                region,
                lookup: if ret { addr.wrapping_sub(1) } else { addr },
            },
            None => Raw::Unknown(addr),
        }
    }

    /// The frames of one sample, leaf first, and whether its user part is perf's frame-pointer
    /// chain (not unwound here).
    fn sample_frames(&mut self, pid: u32, s: &SampleRecord<'_>) -> (Vec<Raw>, bool) {
        let mut frames = Vec::new();
        let mut user_chain = false;
        let mut kernel = s.cpu_mode == CpuMode::Kernel;
        let mut first_in_context = true;
        let mut entries = 0usize;
        if let Some(chain) = &s.callchain {
            for i in 0..chain.len() {
                let Some(addr) = chain.get(i) else { break };
                if addr >= PERF_CONTEXT_MAX {
                    // A user marker without addresses after it (perf's dwarf mode excludes the
                    // user chain) leaves the user stack to the unwinder.
                    kernel = addr == PERF_CONTEXT_KERNEL;
                    first_in_context = true;
                    continue;
                }
                entries += 1;
                if kernel {
                    frames.push(Raw::Kernel(addr));
                } else if addr == 0 && !first_in_context {
                    // A zero return address is no caller: the kernel's frame-pointer walk read
                    // a broken chain (one pointing at itself repeats the zero to the depth
                    // limit). The stack ends there, marked (so not as an unmarked chain).
                    frames.push(Raw::Truncated(
                        crate::unwind::TruncateReason::BadFramePointer,
                    ));
                    return (frames, false);
                } else {
                    user_chain = true;
                    frames.push(self.user(pid, addr, !first_in_context));
                }
                first_in_context = false;
            }
        } else if let Some(ip) = s.ip {
            frames.push(if s.cpu_mode == CpuMode::Kernel {
                Raw::Kernel(ip)
            } else {
                self.user(pid, ip, false)
            });
        }
        if let (Some(regs), Some((stack, size)), false) = (&s.user_regs, &s.user_stack, user_chain)
        {
            let bytes = stack.as_slice();
            let copied = &bytes[..(*size as usize).min(bytes.len())];
            self.unwind_sample(pid, regs, copied, &mut frames);
        } else if entries >= usize::from(self.max_stack) {
            frames.push(Raw::Cap(self.max_stack));
            return (frames, false);
        }
        (frames, user_chain)
    }

    /// Appends the user frames unwound from a DWARF sample's registers and stack copy.
    fn unwind_sample(&mut self, pid: u32, regs: &Regs<'_>, stack: &[u8], frames: &mut Vec<Raw>) {
        let Some(registers) = registers(regs) else {
            frames.push(Raw::Truncated(
                crate::unwind::TruncateReason::NoUserRegisters,
            ));
            return;
        };
        let process = self.processes.entry(pid).or_default();
        let space = process.space.get_or_insert_with(|| {
            let mut space = AddressSpace::new();
            for &r in &process.regions {
                space.add_region(self.regions[r as usize].clone());
            }
            space
        });
        let mut addrs = Vec::new();
        let end = unwind_user(space, &registers, stack, &mut addrs);
        for (i, &addr) in addrs.iter().enumerate() {
            let raw = self.user(pid, addr, i > 0);
            frames.push(raw);
        }
        if let StackEnd::Truncated(reason) = end {
            frames.push(Raw::Truncated(reason));
        }
    }

    /// Names every distinct frame: user addresses through their binaries (inlined frames
    /// included, physical first), kernel ones through `/proc/kallsyms`.
    fn symbolize(
        &self,
        frames: impl Iterator<Item = Raw>,
    ) -> HashMap<Raw, Vec<(String, FrameKind)>> {
        let mut symbolizer = Symbolizer::new();
        let mut by_region: HashMap<u32, Vec<(Raw, u64)>> = HashMap::new();
        let mut names: HashMap<Raw, Vec<(String, FrameKind)>> = HashMap::new();
        for raw in frames {
            if names.contains_key(&raw) {
                continue;
            }
            let named = match raw {
                Raw::Kernel(addr) => symbolizer
                    .kernel(addr)
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("[kernel]+0x{addr:x}")),
                Raw::Unknown(addr) => format!("[unknown]+0x{addr:x}"),
                Raw::Truncated(reason) => reason.frame_name(),
                Raw::Cap(n) => TruncateReason::DepthCap(u32::from(n)).frame_name(),
                Raw::User { region, lookup } => {
                    by_region.entry(region).or_default().push((raw, lookup));
                    names.insert(raw, Vec::new());
                    continue;
                }
            };
            let kind = match raw {
                Raw::Kernel(_) => FrameKind::Kernel,
                Raw::Truncated(_) | Raw::Cap(_) => FrameKind::Truncated,
                _ => FrameKind::Native,
            };
            names.insert(raw, vec![(named, kind)]);
        }
        // One symbolizer call per binary: regions of the same file share it.
        let mut by_file: HashMap<&str, Vec<(Raw, &Region, u64)>> = HashMap::new();
        for (region, raws) in by_region {
            let region = &self.regions[region as usize];
            by_file
                .entry(&region.path)
                .or_default()
                .extend(raws.into_iter().map(|(raw, lookup)| (raw, region, lookup)));
        }
        for (path, raws) in by_file {
            let module = raws.first().and_then(|r| r.1.module.clone());
            let found = match &module {
                Some(m) => {
                    let svmas: Vec<u64> = raws
                        .iter()
                        .map(|(_, region, lookup)| region.svma(*lookup))
                        .collect();
                    symbolizer.symbolize_file(
                        Path::new(path),
                        m.build_id(),
                        m.has_debug_info(),
                        &svmas,
                        |a| m.symbol_start(a),
                        |a| m.symbol_name(a),
                    )
                }
                None => Vec::new(),
            };
            for (i, (raw, region, lookup)) in raws.iter().enumerate() {
                let frames: Vec<(String, FrameKind)> = match found.get(i) {
                    Some(syms) if !syms.is_empty() => syms
                        .iter()
                        .map(|s| (s.name.clone(), FrameKind::Native))
                        .collect(),
                    _ => {
                        let base = path.rsplit('/').next().unwrap_or(path);
                        let offset = lookup - region.start + region.file_offset;
                        vec![(format!("{base}+0x{offset:x}"), FrameKind::Native)]
                    }
                };
                names.insert(*raw, frames);
            }
        }
        names
    }
}

/// Whether a frame-pointer chain's outermost user frame is a thread's entry (`_start`, `clone`,
/// `clone3`): perf's walk ends wherever a frame pointer stops making sense (code built without
/// them), and a chain that stops elsewhere did not reach the root.
fn ends_at_entry(frames: &[Raw], names: &HashMap<Raw, Vec<(String, FrameKind)>>) -> bool {
    let Some(root) = frames
        .iter()
        .rev()
        .find(|r| matches!(r, Raw::User { .. } | Raw::Unknown(_)))
    else {
        return true; // kernel only: no user stack to reach
    };
    names
        .get(root)
        .and_then(|n| n.first())
        .is_some_and(|(name, _)| {
            let name = name.trim_start_matches("__GI_");
            name == "_start" || name.ends_with("clone") || name.ends_with("clone3")
        })
}

/// The unwinder's registers from a sample's user registers, None when some are missing.
fn registers(regs: &Regs<'_>) -> Option<Registers> {
    let values: Option<Vec<u64>> = (0..64u64)
        .filter(|bit| PERF_MASK & (1 << bit) != 0)
        .map(|bit| regs.get(bit))
        .collect();
    Registers::from_perf(&values?)
}

/// Unwinds one DWARF sample's user stack: `registers` at the sample and `stack`, perf's copy of
/// the stack from the stack pointer up, through the process's `space`. `out` receives the
/// instruction pointer and each return address, leaf first. This is the importer's one call into
/// the unwinder.
fn unwind_user(
    space: &mut AddressSpace,
    registers: &Registers,
    stack: &[u8],
    out: &mut Vec<u64>,
) -> StackEnd {
    let mut memory = SampleStack {
        base: registers.sp(),
        bytes: stack,
        fallback: None,
    };
    space.unwind_with_sps(registers, &mut memory, out, None)
}

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
