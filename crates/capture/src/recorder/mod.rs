//! A recording session: open the events for the target, drain the rings on a reader thread
//! into a [`Pipeline`], flush the profile periodically to a [`ChunkSink`], stop on request.

mod alloc;
mod alloc_attach;
mod alloc_bpf;
mod budget;
mod builder;
mod deferral;
mod launch;
mod lifetime;
mod live_proof;
mod naming;
mod off_cpu;
mod options;
mod outer_cache;
mod pipeline;
mod raw;
mod stack_end;
mod stats;
mod switch_cap;
mod user_unwind;
mod walk_memo;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rootline_profile::{Profile, SampleType};

pub use crate::perf_event::monotonic_ns;
pub use alloc::{AllocStats, DEFAULT_ALLOC_MMAP_MIN, DEFAULT_ALLOC_RATE, unbiased_bytes};
pub use off_cpu::OffCpuStats;
pub use options::{
    ChunkSink, DEFAULT_LIVE_STACK_BUDGET, DEFAULT_OFF_CPU_MAX_RATE, KernelWalkMode,
    KernelWalkTable, MAX_USER_CALLCHAIN, RecordError, RecordOptions, Recording, Retention,
    SampleInjector, Target,
};
pub use outer_cache::OuterCacheStats;
pub use pipeline::Pipeline;
pub use stats::{CallchainStats, KernelWalkUse, Stats};

use std::os::fd::AsRawFd;

use crate::kernel_walk::{KernelWalk, KernelWalkOptions};
use crate::perf_event::{
    EventConfig, EventKind, EventTarget, OpenError, PerfEvent, Poller, Record, SchedSwitch, Waker,
    is_sample, parse_record, pidfd, side_band_time, strip_raw,
};
use crate::process::thread_ids;
use crate::symbolize::SymbolizerBudgets;
use launch::{process_alive, send_signal};
use switch_cap::SwitchCap;

/// How often the supervisor looks at the caller's stop flag (its only timed wake-up).
const STOP_CHECK: Duration = Duration::from_millis(100);
/// How long the JVMs being asked get to write their perf maps once more at the end.
const JVM_LAST_ASK: Duration = Duration::from_secs(3);

fn online_cpus() -> Vec<u32> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
            cpus.extend(a..=b);
        }
    }
    if cpus.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        cpus.extend(0..n);
    }
    cpus
}

/// Ring size: room for about a quarter second of samples at full rate from `cpus` CPUs.
fn ring_pages(cfg: &EventConfig, cpus: usize) -> usize {
    let callchain = usize::from(cfg.user_callchain);
    ring_pages_for(cfg.frequency_hz, cfg.stack_bytes, callchain, cpus)
}

/// `callchain`: most callchain entries a sample carries.
fn ring_pages_for(frequency_hz: u32, stack_bytes: u32, callchain: usize, cpus: usize) -> usize {
    let per_sample = stack_bytes as usize + 256 + 8 * callchain;
    let bytes = frequency_hz as usize * per_sample * cpus / 4;
    (bytes / 4096).clamp(64, 8192).next_power_of_two()
}

/// Bytes of the ring buffer each CPU (or thread) gets when sampling at `frequency_hz` with
/// `stack_bytes` of user stack copied per sample (no callchain): room for about a quarter second
/// of samples.
pub fn ring_bytes(frequency_hz: u32, stack_bytes: u32) -> usize {
    ring_pages_for(frequency_hz, stack_bytes, 0, 1) * 4096
}

fn classify(e: OpenError) -> RecordError {
    match e {
        OpenError::Permission { .. } => RecordError::Permission(e),
        OpenError::NoSuchThread(t) => RecordError::TargetGone(t),
        e => RecordError::Open(e),
    }
}

/// Called with a thread's id and its sampling events just opened (see [`attach`]).
type ThreadOpened<'a> = dyn FnMut(u32, &[PerfEvent]) -> Result<(), RecordError> + 'a;

/// Opens per-thread events for every thread of `pid`, repeating the scan until no new thread
/// appears (threads created after their creator's event opened are inherited by it). Each
/// thread's new sampling events go to `opened` at once, with its id (the in-kernel walk attaches
/// to them there): a child the thread forks inherits its events as they are at the fork, so a
/// program attached any later would miss the children forked meanwhile, for their whole life.
fn attach(
    pid: u32,
    cfg: &EventConfig,
    cpus: &[u32],
    events: &mut Vec<PerfEvent>,
    mut switches: Option<(&mut Vec<PerfEvent>, Option<SchedSwitch>)>,
    opened: &mut ThreadOpened<'_>,
) -> Result<(), RecordError> {
    if !process_alive(pid) {
        return Err(RecordError::TargetGone(pid));
    }
    let mut seen = std::collections::HashSet::new();
    for _ in 0..5 {
        let tids = thread_ids(pid).map_err(|_| RecordError::TargetGone(pid))?;
        let new: Vec<u32> = tids.into_iter().filter(|t| !seen.contains(t)).collect();
        if new.is_empty() {
            break;
        }
        for tid in new {
            seen.insert(tid);
            let before = events.len();
            let result = open_thread(tid, false, cfg, cpus, events, None);
            if result.is_ok() {
                opened(tid, &events[before..])?;
            }
            let result = result.and_then(|()| match switches.as_mut() {
                Some((s, tp)) => open_thread(tid, false, cfg, cpus, s, Some(*tp)),
                None => Ok(()),
            });
            match result {
                Ok(()) => {}
                // The thread exited between the scan and the open.
                Err(OpenError::NoSuchThread(_)) => {}
                Err(e) => return Err(classify(e)),
            }
        }
    }
    if events.is_empty() {
        return Err(RecordError::TargetGone(pid));
    }
    Ok(())
}

/// Opens one event per CPU for thread `tid` (inheriting), each writing into the ring of the first
/// event opened on that CPU (`events[i]` for CPU `cpus[i]`), creating those rings first. With
/// `switches`, the events are context-switch events ([`PerfEvent::open_switches`]), through the
/// tracepoint when it is given.
fn open_thread(
    tid: u32,
    enable_on_exec: bool,
    cfg: &EventConfig,
    cpus: &[u32],
    events: &mut Vec<PerfEvent>,
    switches: Option<Option<SchedSwitch>>,
) -> Result<(), OpenError> {
    let mut opened = Vec::with_capacity(cpus.len());
    for (i, &cpu) in cpus.iter().enumerate() {
        let target = EventTarget::Thread {
            tid,
            cpu,
            inherit: true,
            enable_on_exec,
        };
        let output = events.get(i).or(opened.get(i));
        let e = match switches {
            Some(tp) => PerfEvent::open_switches(target, cfg, tp, output)?,
            None => PerfEvent::open(target, cfg, output)?,
        };
        opened.push(e);
    }
    // The switch records, into the same rings, from events the rate cap leaves enabled.
    let mut records = Vec::new();
    if switches.is_some() {
        for (i, &cpu) in cpus.iter().enumerate() {
            let target = EventTarget::Thread {
                tid,
                cpu,
                inherit: true,
                enable_on_exec,
            };
            let Some(output) = events.get(i).or(opened.get(i)) else {
                continue;
            };
            records.push(PerfEvent::open_switch_records(target, cfg, output)?);
        }
    }
    events.extend(opened);
    events.extend(records);
    Ok(())
}

/// The default [`RecordOptions::kernel_walk_kept_dumps`]: most bytes of stack dumps (see
/// [`KernelWalkOptions::pending_dump_bytes`]) held by the walks of samples set aside until their
/// binaries are read; past it, further samples set aside keep their walks without the dumps
/// (and end where the copy and proven reads end), counted.
pub const KEPT_DUMP_BYTES: usize = 128 << 20;

/// Longest pause between rounds while the in-kernel walk runs.
const KERNEL_WALK_ROUND: Duration = Duration::from_millis(10);

/// Loads the in-kernel stack walk as `opts` asks; with [`KernelWalkMode::Auto`], a failure is
/// one line in `notes` and the recording goes on without it.
fn load_kernel_walk(
    opts: &RecordOptions,
    stack_bytes: u32,
    notes: &mut Vec<String>,
) -> Result<Option<KernelWalk>, RecordError> {
    if opts.kernel_walk == KernelWalkMode::Off {
        return Ok(None);
    }
    let mut walk_opts = KernelWalkOptions {
        copy_bytes: stack_bytes,
        modules: opts.modules.clone(),
        module_limit: opts.module_budget,
        ring_bytes: opts.kernel_walk_ring_bytes,
        bounded: matches!(opts.kernel_walk_table, KernelWalkTable::Counted(_))
            || opts.module_budget.is_some(),
        run_time_stats: opts.kernel_walk_run_time,
        ..KernelWalkOptions::default()
    };
    if walk_opts.bounded {
        // A bounded table is kept for the binaries samples reach. Stack dumps stay on: the
        // program sends one only while the ring is mostly empty and within each CPU's
        // allowance, and the samples set aside keep at most `kernel_walk_kept_dumps` of them.
        walk_opts.rows_on_demand = true;
        walk_opts.pending_dump_rate_kib = crate::kernel_walk::BOUNDED_DUMP_KIB_PER_SECOND;
    }
    match (opts.kernel_walk_table, opts.module_budget) {
        (KernelWalkTable::Counted(rows), _) => {
            // The caller counts the whole table: rows are placed while they fit it.
            walk_opts.rows = rows;
            walk_opts.modules = rootline_image::ModuleBudget::new();
            walk_opts.module_limit = None;
        }
        (_, Some(limit)) => {
            // The table is allocated whole at load: no larger than the budget it is counted in.
            walk_opts.rows = walk_opts
                .rows
                .min((limit / 16).clamp(1 << 16, u32::MAX as usize) as u32);
        }
        (KernelWalkTable::Rows(rows), None) => walk_opts.rows = rows.max(1 << 16),
        (KernelWalkTable::Default, None) => {}
    }
    match KernelWalk::load(walk_opts) {
        Ok(kw) => Ok(Some(kw)),
        Err(e) if opts.kernel_walk == KernelWalkMode::Auto => {
            notes.push(kernel_walk_note(&e));
            Ok(None)
        }
        Err(e) => Err(RecordError::KernelWalk(e)),
    }
}

/// How the line that says the in-kernel walk could not run starts.
const KERNEL_WALK_NOTE: &str = "in-kernel stack walk off";

/// The one line that says the in-kernel walk is off, and how to get it.
fn kernel_walk_note(e: &crate::kernel_walk::KernelWalkError) -> String {
    format!(
        "{KERNEL_WALK_NOTE}: {e}; deep stacks past the stack copy need live reads with a \
         proof (run as root or with CAP_BPF and CAP_PERFMON on Linux 5.17 or later)"
    )
}

/// Attaches the in-kernel walk to the sampling events; with [`KernelWalkMode::Auto`], a
/// failure drops the walk with one line in `notes`.
fn attach_kernel_walk(
    walk: &mut Option<KernelWalk>,
    events: &[PerfEvent],
    opts: &RecordOptions,
    notes: &mut Vec<String>,
) -> Result<(), RecordError> {
    let Some(kw) = walk.as_mut() else {
        return Ok(());
    };
    for e in events.iter().filter(|e| e.switches().is_none()) {
        if let Err(err) = kw.attach(e) {
            if opts.kernel_walk == KernelWalkMode::On {
                return Err(RecordError::KernelWalk(err));
            }
            notes.push(kernel_walk_note(&err));
            *walk = None;
            return Ok(());
        }
    }
    Ok(())
}

/// With the in-kernel walk, keeps thread `tid`'s children from cloning its event context
/// ([`crate::perf_event::open_clone_guard`]): the events the program is attached to then stay
/// with the thread. Recording a parent forking short-lived children beside busy loops, about 1
/// run in 5 had a child none of whose samples ran the program (9–17 of ~1,000); with the guard,
/// none of 48 runs did. Without the guard (it could not be opened) such samples are counted as
/// having no walk.
fn guard_clones(walk: &Option<KernelWalk>, tid: u32, guards: &mut Vec<std::os::fd::OwnedFd>) {
    if walk.is_some()
        && let Ok(fd) = crate::perf_event::open_clone_guard(tid)
    {
        guards.push(fd);
    }
}

/// Records until `stop` is set, the duration passes, or the target ends.
pub fn record(
    opts: &RecordOptions,
    stop: &AtomicBool,
    mut sink: Option<Box<dyn ChunkSink>>,
) -> Result<Recording, RecordError> {
    let targeted_live = opts.live_stack_budget > 0 && opts.target != Target::System;
    let mut attach_notes_early = Vec::new();
    let mut cfg = EventConfig {
        frequency_hz: opts.frequency_hz.max(1),
        stack_bytes: (opts.stack_bytes.clamp(8, 60 * 1024) + 7) & !7,
        kernel: opts.kernel,
        user_callchain: if opts.user_callchain {
            crate::perf_event::max_callchain_entries()
                .unwrap_or(127)
                .min(MAX_USER_CALLCHAIN)
        } else {
            0
        },
        ring_pages: 0,
        // Set below, once it is known whether the kernel walks stacks.
        prompt: false,
    };
    let mut kernel_walk = load_kernel_walk(opts, cfg.stack_bytes, &mut attach_notes_early)?;
    // Proofs for live stack reads are armed by the reader: the sooner it sees a sample, the
    // fewer samples predate the proof. With the in-kernel walk, samples rarely read live
    // memory, and its rounds (`KERNEL_WALK_ROUND`) bound how late a sample is seen: a wake-up
    // every few samples cost the reader more than all its unwinding of some runs' samples.
    // The whole host (-a, the agent) keeps large batches and few wake-ups.
    cfg.prompt = targeted_live && kernel_walk.is_none();
    let cpus = online_cpus();
    let mut events = Vec::new();
    // Context-switch events (off-CPU), in rings of their own; appended to `events` once open.
    let mut switch_events = Vec::new();
    let mut child = None;
    let start_ns = monotonic_ns();
    // Off-CPU: switch-outs sampled through sched:sched_switch when tracefs has it (the state a
    // thread left in), else the context-switches software event.
    let switches = opts.off_cpu_min_ns.map(|_| SchedSwitch::find());
    let mut attach_notes = Vec::new();
    // Allocation uprobe events, in rings of their own; appended to `events` once open.
    let mut alloc_events = Vec::new();
    let mut alloc = alloc_attach::Attach::new(opts)?;
    // Held while recording (see `guard_clones`).
    let mut clone_guards = Vec::new();
    match &opts.target {
        Target::Command(argv) => {
            cfg.ring_pages = ring_pages(&cfg, 1);
            let c = launch::launch(argv, &alloc.launch_env(&opts.launch_env))?;
            let opened = open_thread(c.id(), true, &cfg, &cpus, &mut events, None).and_then(|()| {
                match switches {
                    Some(_) => open_thread(c.id(), true, &cfg, &cpus, &mut switch_events, switches),
                    None => Ok(()),
                }
            });
            let opened = opened
                .and_then(|()| alloc.open_command(c.id(), &cfg, &cpus, &mut alloc_events))
                .map_err(classify)
                .and_then(|()| {
                    attach_kernel_walk(&mut kernel_walk, &events, opts, &mut attach_notes_early)
                });
            if let Err(e) = opened {
                send_signal(c.id(), libc::SIGKILL);
                return Err(e);
            }
            guard_clones(&kernel_walk, c.id(), &mut clone_guards);
            if let Some(kw) = kernel_walk.as_mut() {
                kw.expect_process(c.id());
            }
            if let Some(pid) = &opts.launched_pid {
                pid.store(c.id(), Ordering::Release);
            }
            send_signal(c.id(), libc::SIGCONT);
            child = Some(c);
        }
        Target::Pids(pids) => {
            cfg.ring_pages = ring_pages(&cfg, 1);
            // JVMs write their perf maps before the first sample.
            if opts.ask_jvms {
                attach_notes = crate::jit::hotspot::ask_at_attach(pids);
            }
            for &pid in pids {
                let with = switches.map(|tp| (&mut switch_events, tp));
                let mut walk_them = |tid: u32, new: &[PerfEvent]| {
                    attach_kernel_walk(&mut kernel_walk, new, opts, &mut attach_notes_early)?;
                    guard_clones(&kernel_walk, tid, &mut clone_guards);
                    Ok(())
                };
                attach(pid, &cfg, &cpus, &mut events, with, &mut walk_them)?;
                if !opts.alloc_skip_pids.contains(&pid) {
                    alloc.open_pid(pid, &cfg, &cpus, &mut alloc_events)?;
                }
            }
            // With the in-kernel walk, the reader enables the events once it has sent the
            // targets' mappings to the walk, so that no early sample goes without one.
            if kernel_walk.is_none() {
                for e in events.iter().chain(&switch_events).chain(&alloc_events) {
                    e.enable()
                        .map_err(|e| RecordError::Open(OpenError::Other(e)))?;
                }
            }
        }
        Target::System => {
            if opts.alloc_rate.is_some() {
                return Err(RecordError::Open(OpenError::Other(std::io::Error::other(
                    "allocation recording follows given threads (a command or -p), not the whole host",
                ))));
            }
            cfg.ring_pages = ring_pages(&cfg, 1);
            for &cpu in &cpus {
                events.push(PerfEvent::open(EventTarget::Cpu(cpu), &cfg, None).map_err(classify)?);
            }
            attach_kernel_walk(&mut kernel_walk, &events, opts, &mut attach_notes_early)?;
            // Off-CPU on the whole host: every task's switch-outs on each CPU, and each CPU's
            // switch records (`PERF_RECORD_SWITCH_CPU_WIDE`) into the same ring.
            if let Some(tp) = switches {
                let mut records = Vec::new();
                for &cpu in &cpus {
                    let target = EventTarget::Cpu(cpu);
                    let e = PerfEvent::open_switches(target, &cfg, tp, None).map_err(classify)?;
                    records
                        .push(PerfEvent::open_switch_records(target, &cfg, &e).map_err(classify)?);
                    switch_events.push(e);
                }
                switch_events.append(&mut records);
            }
            for e in events.iter().chain(&switch_events) {
                e.enable()
                    .map_err(|e| RecordError::Open(OpenError::Other(e)))?;
            }
        }
    }
    let event_kind = events[0].kind();
    let switch_event = switch_events.first().map(|e| match e.switches() {
        Some(Some(_)) => "sched:sched_switch",
        _ => "context-switches",
    });
    events.append(&mut switch_events);
    events.append(&mut alloc_events);
    attach_notes.append(&mut alloc.notes);
    let mut sample_types = vec![SampleType::samples(), SampleType::cpu_nanoseconds()];
    if opts.off_cpu_min_ns.is_some() {
        sample_types.push(SampleType::off_cpu_nanoseconds());
        sample_types.push(SampleType::wall_nanoseconds());
    }
    if opts.alloc_rate.is_some() {
        sample_types.push(SampleType::alloc_bytes());
        sample_types.push(SampleType::alloc_count());
    }
    // Columns of other sources (e.g. .NET allocation ticks), where not already the recorder's.
    for t in &opts.extra_columns {
        if !sample_types.contains(t) {
            sample_types.push(t.clone());
        }
    }
    let mut profile = Profile::new(sample_types);
    profile.metadata.producer = "rootline record".into();
    profile.metadata.start_time_ns = start_ns;
    profile.metadata.sample_rate_hz = Some(cfg.frequency_hz);
    profile.metadata.host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string());
    profile.metadata.command_line = match &opts.target {
        Target::Command(argv) => Some(
            argv.iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
        ),
        Target::Pids(pids) => pids.first().and_then(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).ok().map(|b| {
                b.split(|&c| c == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
        }),
        Target::System => None,
    };
    let extra = &mut profile.metadata.extra;
    extra.insert("event".into(), event_kind.as_str().into());
    extra.insert("stack_bytes".into(), cfg.stack_bytes.to_string());
    extra.insert(
        "live_stack_budget".into(),
        opts.live_stack_budget.to_string(),
    );
    extra.insert("user_callchain".into(), cfg.user_callchain.to_string());
    if let Some(min_ns) = opts.off_cpu_min_ns {
        extra.insert("off_cpu.min_ns".into(), min_ns.to_string());
    }
    let walk_state = match (&kernel_walk, opts.kernel_walk) {
        (Some(_), _) => "on",
        (None, KernelWalkMode::Off) => "off",
        (None, _) => "unavailable",
    };
    extra.insert("kernel_walk".into(), walk_state.into());
    if let Some(note) = attach_notes_early
        .iter()
        .rfind(|n| n.starts_with(KERNEL_WALK_NOTE))
    {
        extra.insert("kernel_walk.note".into(), note.clone());
    }
    alloc.describe(extra);
    let alloc_source = alloc.take_source();
    if let Some(name) = switch_event {
        extra.insert("off_cpu.event".into(), name.into());
        extra.insert("off_cpu.max_rate".into(), opts.off_cpu_max_rate.to_string());
    }
    let off_cpu_min_ns = opts.off_cpu_min_ns;
    let off_cpu_max_rate = opts.off_cpu_max_rate;
    let live_stack_budget = opts.live_stack_budget;
    let module_budget = opts.module_budget;
    let skip_own_process = opts.skip_own_process;
    let modules = opts.modules.clone();
    let symbolizer_budgets = SymbolizerBudgets {
        dwarf: opts.dwarf_budget,
        modules: opts.modules.clone(),
        module_limit: opts.module_budget,
    };
    let names_dir = opts
        .keep_symbol_names
        .then(crate::symbolize::kept_names_dir)
        .flatten();
    let ask_jvms = opts.ask_jvms;
    let user_callchain = cfg.user_callchain;
    let period_nanos = match event_kind {
        EventKind::CpuClock => None,
        EventKind::Cycles => Some(1_000_000_000 / i64::from(cfg.frequency_hz)),
    };
    let kernel = cfg.kernel;
    let prime = match &opts.target {
        Target::Pids(pids) if kernel_walk.is_some() => Some(pids.clone()),
        _ => None,
    };

    let done = Arc::new(AtomicBool::new(false));
    let (batches, batch_rx) = std::sync::mpsc::channel::<raw::Batch>();
    // Symbolization and profile building run on their own thread so the reader never stalls.
    let retention = sink.as_ref().map_or(Retention::KeepAll, |s| s.retention());
    let injector = opts.injector.clone();
    let builder = {
        let mut sink = sink.take();
        std::thread::Builder::new()
            .name("rootline-builder".into())
            .spawn(move || {
                let mut builder = builder::Builder::new(profile, symbolizer_budgets, names_dir);
                let mut stats = Stats::default();
                let mut sink_error = None;
                for batch in batch_rx {
                    stats = batch.stats.clone();
                    let start_over = batch.start_over;
                    builder.apply(batch);
                    if let Some(i) = &injector {
                        i.inject(&mut builder.profile);
                    }
                    finish_metadata(&mut builder.profile, &stats);
                    if let Some(s) = sink.as_mut()
                        && sink_error.is_none()
                        && let Err(e) = s.write_chunk(&builder.profile)
                    {
                        sink_error = Some(e);
                    }
                    if retention != Retention::KeepAll {
                        builder.profile.take_samples();
                    }
                    if start_over {
                        builder.start_over();
                        if let Some(s) = sink.as_mut() {
                            s.started_over();
                        }
                    }
                }
                builder.finish();
                if let Some(i) = &injector {
                    i.finish(&mut builder.profile);
                    if let Some(s) = sink.as_mut()
                        && sink_error.is_none()
                        && let Err(e) = s.write_chunk(&builder.profile)
                    {
                        sink_error = Some(e);
                    }
                }
                (builder.profile, stats, sink_error)
            })
            .map_err(|e| RecordError::Open(OpenError::Other(e)))?
    };
    let waker = Waker::new().map_err(|e| RecordError::Open(OpenError::Other(e)))?;
    let mut poller =
        Poller::new(waker.clone()).map_err(|e| RecordError::Open(OpenError::Other(e)))?;
    for e in &events {
        poller
            .add(e.raw_fd())
            .map_err(|e| RecordError::Open(OpenError::Other(e)))?;
    }
    if let Some(kw) = &kernel_walk {
        // Deep walks fill their ring long before the perf rings reach their watermark.
        poller
            .add(kw.ring_fd())
            .map_err(|e| RecordError::Open(OpenError::Other(e)))?;
    }
    // Allocation events of `-p` threads started while recording, opened by the supervisor.
    let (new_events, new_events_rx) = std::sync::mpsc::channel::<PerfEvent>();
    let reader = {
        let done = done.clone();
        let interval = opts.flush_interval;
        let kept_dumps = opts.kernel_walk_kept_dumps;
        std::thread::Builder::new()
            .name("rootline-reader".into())
            .spawn(move || {
                let mut pipeline = Pipeline::new(kernel, period_nanos, modules);
                pipeline.set_live_stack_budget(live_stack_budget);
                if let Some(bytes) = module_budget {
                    pipeline.set_module_budget(bytes);
                }
                pipeline.set_ask_jvms(ask_jvms);
                if skip_own_process {
                    pipeline.skip_process(std::process::id());
                }
                if targeted_live && kernel_walk.is_none() {
                    // A few processes: their binaries are few, and parsing them as they are
                    // mapped lets every sample arm or use a live-read proof at once. (With the
                    // in-kernel walk, samples rarely need live reads, and a large binary's parse
                    // would keep the reader from sending new mappings to the kernel meanwhile.)
                    pipeline.parse_binaries_inline();
                }
                pipeline.set_user_callchain(user_callchain);
                if let Some(min_ns) = off_cpu_min_ns {
                    pipeline.set_off_cpu(min_ns);
                }
                if let Some((source, rate)) = alloc_source {
                    pipeline.set_alloc(source, rate);
                }
                let mut cap = off_cpu_min_ns.and_then(|_| SwitchCap::new(off_cpu_max_rate));
                if let Retention::HandOver { max_entries } = retention {
                    pipeline.set_table_limit(max_entries);
                }
                if let Some(kw) = kernel_walk {
                    pipeline.set_kernel_walk(kw, kept_dumps);
                    if let Some(pids) = &prime {
                        pipeline.prime_kernel_walk(pids);
                        for e in &events {
                            // Opened without error, so enabling cannot fail but for a thread
                            // that exited since.
                            let _ = e.enable();
                        }
                    }
                }
                let mut drain = Drain::default();
                let mut last_flush = Instant::now();
                loop {
                    for e in new_events_rx.try_iter() {
                        let _ = poller.add(e.raw_fd());
                        events.push(e);
                    }
                    let finishing = done.load(Ordering::Acquire);
                    if finishing {
                        for e in &events {
                            let _ = e.disable();
                        }
                    }
                    let live_cap = cap.as_mut().filter(|_| !finishing);
                    let paused = drain.round(&mut events, &mut pipeline, live_cap).1;
                    if finishing {
                        pipeline.ask_jvms_again(Instant::now() + JVM_LAST_ASK);
                        pipeline.finish();
                    }
                    if finishing || last_flush.elapsed() >= interval {
                        // The builder outlives this thread; a send can only fail if it panicked.
                        let _ = batches.send(pipeline.take_batch());
                        last_flush = Instant::now();
                    }
                    if finishing {
                        break;
                    }
                    // Sleep until a ring passes its wake-up watermark (half the ring: a large
                    // batch, with the other half as slack), the next flush, or the end.
                    let mut timeout = interval.saturating_sub(last_flush.elapsed());
                    if pipeline.walks_in_kernel() {
                        // The walk knows a process's new mappings only from the next round:
                        // keep rounds short so few samples of a new binary go without.
                        timeout = timeout.min(KERNEL_WALK_ROUND);
                    }
                    if let Some(until) = paused {
                        timeout = timeout.min(until);
                    }
                    if poller.wait(timeout).is_err() {
                        std::thread::sleep(timeout.min(Duration::from_millis(20)));
                    }
                }
            })
            .map_err(|e| RecordError::Open(OpenError::Other(e)))?
    };

    // The supervisor wakes when a target process exits (pidfd), when the duration ends, and every
    // STOP_CHECK to look at the caller's stop flag.
    let mut exits = Poller::new(Waker::new().map_err(|e| RecordError::Open(OpenError::Other(e)))?)
        .map_err(|e| RecordError::Open(OpenError::Other(e)))?;
    let watched: Vec<u32> = match (&opts.target, &child) {
        (Target::Command(_), Some(c)) => vec![c.id()],
        (Target::Pids(pids), _) => pids.clone(),
        _ => Vec::new(),
    };
    let mut pidfds = Vec::new();
    for &pid in &watched {
        if let Ok(fd) = pidfd(pid)
            && exits.add_once(fd.as_raw_fd()).is_ok()
        {
            pidfds.push(fd);
        }
    }
    // Without a pidfd for every target, look for exits at every check.
    let exits_signalled = pidfds.len() == watched.len();
    let started = Instant::now();
    let mut exit_status = None;
    loop {
        let mut timeout = STOP_CHECK;
        if let Some(d) = opts.duration {
            timeout = timeout.min(d.saturating_sub(started.elapsed()));
        }
        let woken = match exits.wait(timeout) {
            Ok(w) => w.ready,
            Err(_) => {
                std::thread::sleep(timeout);
                true
            }
        };
        if stop.load(Ordering::Acquire) {
            break;
        }
        for e in alloc.follow_new_threads() {
            let _ = new_events.send(e);
        }
        if opts.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        if woken || !exits_signalled {
            if let Some(c) = child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    exit_status = Some(status);
                    break;
                }
            } else if let Target::Pids(pids) = &opts.target
                && !pids.iter().any(|&p| process_alive(p))
            {
                break;
            }
        }
        if reader.is_finished() {
            break;
        }
    }
    done.store(true, Ordering::Release);
    waker.wake();
    reader.join().map_err(|_| RecordError::Panicked("reader"))?;
    let (profile, mut stats, sink_error) = builder
        .join()
        .map_err(|_| RecordError::Panicked("builder"))?;
    attach_notes.extend(attach_notes_early);
    for note in attach_notes.into_iter().rev() {
        if !stats.jit_notes.contains(&note) {
            stats.jit_notes.insert(0, note);
        }
    }
    if let Some(c) = child.as_mut()
        && exit_status.is_none()
    {
        // Stopped by the user or the duration: wait for the command if it is ending anyway.
        exit_status = c.try_wait().ok().flatten();
    }
    if let Some(e) = sink_error {
        return Err(RecordError::Sink(e));
    }
    Ok(Recording {
        stats,
        profile,
        event: event_kind,
        exit_status,
    })
}

/// Buffers reused by every pass over the rings.
#[derive(Default)]
struct Drain {
    heads: Vec<u64>,
    /// Side-band records `(time, start, end)` into `bytes`.
    side_band: Vec<(u64, usize, usize)>,
    bytes: Vec<u8>,
}

impl Drain {
    /// One pass over every ring: side-band records first, merged across rings in time order (an
    /// exec on one CPU and the mmaps that follow on another must apply in order), so mappings are
    /// known before the samples that use them; then samples. Returns the number of records
    /// handled.
    ///
    /// With `cap`, the rate cap looks at the switch-out samples as soon as they are counted,
    /// before any is unwound (the sooner it pauses the events, the less a window overshoots);
    /// the second value is how long until its window ends while it holds them paused.
    fn round(
        &mut self,
        events: &mut [PerfEvent],
        pipeline: &mut Pipeline,
        cap: Option<&mut SwitchCap>,
    ) -> (usize, Option<Duration>) {
        let kernel = pipeline.callchain();
        let mut count = 0;
        pipeline.begin_round();
        self.heads.clear();
        self.side_band.clear();
        self.bytes.clear();
        for e in events.iter_mut() {
            let Some(ring) = e.ring() else {
                self.heads.push(0);
                continue;
            };
            let head = ring.head();
            ring.peek(head, |data| {
                if !is_sample(data) {
                    let start = self.bytes.len();
                    self.bytes.extend_from_slice(data);
                    let time = side_band_time(data).unwrap_or(0);
                    self.side_band.push((time, start, self.bytes.len()));
                }
            });
            self.heads.push(head);
        }
        // Every sample up to the heads just read had its walk written before it.
        pipeline.drain_kernel_walk();
        self.side_band.sort_by_key(|r| r.0);
        for &(time, start, end) in &self.side_band {
            pipeline.side_band(time, &parse_record(&self.bytes[start..end], kernel));
        }
        if !self.side_band.is_empty() {
            // New mappings reach the in-kernel walk before this round's samples are unwound.
            pipeline.sync_kernel_walk();
        }
        for (e, &head) in events.iter_mut().zip(&self.heads) {
            let (switches, alloc) = (e.switches(), e.is_alloc());
            let Some(ring) = e.ring() else {
                continue;
            };
            let pos = ring.peek(head, |data| {
                count += 1;
                match switches {
                    None => {
                        // Allocation samples carry no callchain (see `open_alloc_events`).
                        if let Record::Sample(s) = parse_record(data, kernel && !alloc) {
                            if alloc {
                                pipeline.alloc_record(data, &s);
                            } else {
                                pipeline.sample_record(data, &s);
                            }
                        }
                    }
                    Some(None) => {
                        if let Record::Sample(s) = parse_record(data, kernel) {
                            pipeline.switch_record(data, &s, None);
                        }
                    }
                    // The tracepoint's samples: the state it reports, then the sample without it.
                    Some(Some(tp)) => {
                        if is_sample(data)
                            && let Some((sample, raw)) = strip_raw(data, kernel)
                            && let Record::Sample(s) = parse_record(&sample, kernel)
                        {
                            pipeline.switch_record(&sample, &s, tp.state(raw));
                        }
                    }
                }
            });
            ring.consume(pos);
        }
        let paused = cap.and_then(|cap| cap.after_round(pipeline.off_cpu_sampled(), events));
        pipeline.settle_off_cpu(None);
        (count, paused)
    }
}

fn finish_metadata(profile: &mut Profile, stats: &Stats) {
    let m = &mut profile.metadata;
    m.end_time_ns = monotonic_ns();
    m.lost_samples = stats.lost;
    m.truncated_samples = stats.truncated_total();
    m.extra.retain(|k, _| !k.starts_with("truncated."));
    for (reason, n) in &stats.truncated {
        m.extra.insert(format!("truncated.{reason}"), n.to_string());
    }
    if stats.full_register_unwinds > 0 {
        m.extra.insert(
            "unwind.full_register_samples".into(),
            stats.full_register_unwinds.to_string(),
        );
    }
    m.extra
        .insert("deferred.samples".into(), stats.deferred.to_string());
    if stats.live.samples > 0 {
        m.extra
            .insert("live.samples".into(), stats.live.samples.to_string());
        m.extra
            .insert("live.bytes".into(), stats.live.bytes.to_string());
        m.extra.insert(
            "live.max_sample_bytes".into(),
            stats.live.max_sample_bytes.to_string(),
        );
    }
    let cc = &stats.callchain;
    if cc.checked > 0 {
        m.extra
            .insert("callchain.checked".into(), cc.checked.to_string());
        m.extra.insert(
            "callchain.confirmed_frames".into(),
            cc.confirmed_frames.to_string(),
        );
        m.extra
            .insert("callchain.mismatches".into(), cc.mismatches.to_string());
    }
    if cc.capped > 0 {
        m.extra
            .insert("callchain.capped".into(), cc.capped.to_string());
    }
    alloc::describe_stats(&stats.alloc, &mut m.extra);
    if let Some(kw) = &stats.kernel_walk {
        let w = &kw.walk;
        for (key, n) in [
            ("kernel_walk.walks", w.walks),
            ("kernel_walk.frames", w.frames),
            ("kernel_walk.lost_chunks", w.lost_chunks),
            ("kernel_walk.unwound", kw.unwound),
            ("kernel_walk.fell_back", kw.fell_back),
            ("kernel_walk.no_walk", kw.no_walk),
            ("kernel_walk.in_copy", kw.in_copy),
            ("kernel_walk.dumps_dropped", kw.dumps_dropped),
            ("kernel_walk.rows_used", w.rows_used),
            ("kernel_walk.binaries_refused", w.binaries_refused),
        ] {
            m.extra.insert(key.into(), n.to_string());
        }
    }
    let off = &stats.off_cpu;
    if off.switches > 0 {
        for (key, n) in [
            ("off_cpu.switches", off.switches),
            ("off_cpu.sampled", off.sampled),
            ("off_cpu.unwound", off.unwound),
            ("off_cpu.unwound_ns", off.unwound_ns),
            ("off_cpu.below_min", off.below_min),
            ("off_cpu.below_min_ns", off.below_min_ns),
            ("off_cpu.unsampled", off.unsampled),
            ("off_cpu.unsampled_ns", off.unsampled_ns),
            ("off_cpu.unmatched", off.unmatched),
            ("off_cpu.open_at_end", off.open_at_end),
        ] {
            m.extra.insert(key.into(), n.to_string());
        }
    }
}
