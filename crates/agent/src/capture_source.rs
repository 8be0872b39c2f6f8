//! The production [`SampleSource`]: rootline-capture's `perf_event_open` sampler, unwinder and
//! symbolizer, sampling every CPU (`cpu-clock`, or cycles where a PMU exists).
//!
//! rootline-capture builds a [`Profile`] and hands it to a [`ChunkSink`] at every flush; this
//! adapter appends the frames and stack nodes new in the capture profile to a shared
//! [`StackTable`] with the same ids (each frame resolved once), and passes the flush's samples —
//! each a [`StackId`], nothing copied per sample — to the agent's capture thread over a bounded
//! channel. The sink asks for [`Retention::HandOver`]: the recording drops each flush's samples
//! once handed over and starts its tables over past [`TABLE_ENTRIES`], and the adapter then
//! starts a new table, so one recording runs for as long as the agent does in bounded memory.
//! Samples the channel cannot take are counted as lost.
//!
//! The whole host is always sampled: the agent's target rules pick the processes, so targets that
//! start later are seen from their first sample. The agent's own process is left out.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rootline_capture::recorder::{self, ChunkSink, RecordError, RecordOptions, Retention, Target};
use rootline_profile::{FrameId, Profile, StackId};

use crate::config::AgentConfig;
use crate::source::{KernelWalkCounts, PollStats, RawSample, SampleSource, SourceError};
use crate::stacks::{CodeDetail, FrameDesc, StackTable};

/// Distinct frames, stack nodes and threads the capture profile holds before it starts over
/// (bounds its memory, and that of the shared table mirroring it).
pub const TABLE_ENTRIES: usize = 200_000;

/// How often the recorder flushes (and so how often samples reach the agent).
const FLUSH_EVERY: Duration = Duration::from_millis(200);

/// Batches the channel holds; past that, new batches are counted as lost.
const CHANNEL_BATCHES: usize = 64;

struct OwnedSample {
    pid: u32,
    tid: u32,
    time_ns: u64,
    weight_ns: u64,
    alloc_bytes: u64,
    off_cpu: bool,
    stack: StackId,
}

/// One flush's samples, the table their stacks are in, and their processes' names.
struct Flush {
    stacks: StackTable,
    samples: Vec<OwnedSample>,
    names: HashMap<u32, Box<str>>,
}

impl Flush {
    fn deliver(&self, sink: &mut dyn FnMut(&RawSample<'_>)) {
        for s in &self.samples {
            sink(&RawSample {
                process_name: self.names.get(&s.pid).map(|n| &**n),
                pid: s.pid,
                tid: s.tid,
                time_ns: s.time_ns,
                weight_ns: s.weight_ns,
                alloc_bytes: s.alloc_bytes,
                off_cpu: s.off_cpu,
                stack: s.stack,
                stacks: &self.stacks,
            });
        }
    }
}

/// Counters and state shared between the recorder thread and the source.
#[derive(Default)]
struct Shared {
    lost: AtomicU64,
    /// The in-kernel walk's totals, from the recording's metadata.
    kernel_walk: Mutex<Option<KernelWalkCounts>>,
    stop: AtomicBool,
    error: Mutex<Option<SourceError>>,
}

/// Per-sample budget of live stack reads in continuous mode (see
/// [`RecordOptions::live_stack_budget`]).
pub const AGENT_LIVE_STACK_BUDGET: usize = 8 * 1024 * 1024;

/// rootline-capture as a [`SampleSource`]. See the module documentation.
pub struct CaptureSource {
    rx: Receiver<Flush>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    reported_lost: u64,
    /// Where the recorder counts its modules.
    modules: rootline_image::ModuleBudget,
    /// .NET allocation ticks, when `dotnet.allocation_ticks` is on.
    dotnet: Option<Arc<crate::dotnet_ticks::DotnetTicks>>,
}

impl CaptureSource {
    /// Starts sampling the whole host at `config.frequency_hz`. When perf events cannot be opened,
    /// the first [`SampleSource::poll`] returns the error (it says which setting to change).
    pub fn start(config: &AgentConfig) -> Result<CaptureSource, SourceError> {
        let mut options = RecordOptions::new(Target::System);
        options.frequency_hz = config.frequency_hz;
        options.stack_bytes = config.stack_bytes as u32;
        options.flush_interval = FLUSH_EVERY;
        // Continuous mode bounds each sample's live stack reads more tightly than `record`:
        // 8 MiB still covers the default main-thread and pthread stack sizes whole.
        options.live_stack_budget = AGENT_LIVE_STACK_BUDGET;
        options.module_budget = Some(config.modules.byte_budget);
        let modules = options.modules.clone();
        options.dwarf_budget = Some(config.modules.dwarf_budget);
        // The agent holds what it learns within its memory limit; names kept on disk between
        // its runs (and held in memory meanwhile) would sit outside that limit.
        options.keep_symbol_names = false;
        // Host-wide and continuous: the kernel's BPF statistics stay as the host has them.
        options.kernel_walk_run_time = false;
        // The in-kernel stack walk: its rows table, ring and working set are counted in the
        // memory estimate (`AgentConfig::kernel_walk_memory`).
        options.kernel_walk = config.kernel_walk.mode();
        options.kernel_walk_ring_bytes = crate::config::KERNEL_WALK_RING_BYTES as u32;
        options.kernel_walk_kept_dumps = crate::config::KERNEL_WALK_KEPT_DUMPS;
        options.kernel_walk_table = recorder::KernelWalkTable::Counted(config.kernel_rows());
        // The agent does not profile itself: its samples are not even unwound.
        options.skip_own_process = true;
        let dotnet = if config.dotnet.allocation_ticks {
            let ticks = crate::dotnet_ticks::DotnetTicks::start(config.dotnet.session_length)
                .map_err(|e| SourceError::Failed(e.to_string()))?;
            let ticks = Arc::new(ticks);
            options.extra_columns = vec![
                rootline_profile::SampleType::alloc_bytes(),
                rootline_profile::SampleType::alloc_count(),
            ];
            options.injector = Some(Arc::clone(&ticks) as Arc<dyn recorder::SampleInjector>);
            Some(ticks)
        } else {
            None
        };
        if config.off_cpu.enabled {
            options.off_cpu_min_ns = Some(config.off_cpu.min_us.saturating_mul(1000));
            options.off_cpu_max_rate = config.off_cpu.max_rate;
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(CHANNEL_BATCHES);
        let shared = Arc::new(Shared::default());
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("rootline-perf".into())
                .spawn(move || run(options, tx, shared))
                .map_err(|e| SourceError::Failed(e.to_string()))?
        };
        Ok(CaptureSource {
            rx,
            shared,
            thread: Some(thread),
            reported_lost: 0,
            modules,
            dotnet,
        })
    }
}

impl Drop for CaptureSource {
    fn drop(&mut self) {
        self.shared.stop.store(true, Relaxed);
        // Unblock a recorder waiting on a full channel.
        while self.rx.try_recv().is_ok() {}
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl SampleSource for CaptureSource {
    fn modules(&self) -> Option<rootline_image::ModuleBudget> {
        Some(self.modules.clone())
    }

    fn set_targets(&mut self, pids: Option<&[u32]>) -> Result<(), SourceError> {
        // The whole host is sampled either way; allocation ticks are collected from targets only.
        if let Some(d) = &self.dotnet {
            d.set_targets(pids);
        }
        Ok(())
    }

    fn poll(
        &mut self,
        timeout: Duration,
        sink: &mut dyn FnMut(&RawSample<'_>),
    ) -> Result<PollStats, SourceError> {
        match self.rx.recv_timeout(timeout) {
            Ok(flush) => {
                flush.deliver(sink);
                while let Ok(flush) = self.rx.try_recv() {
                    flush.deliver(sink);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                let error = self
                    .shared
                    .error
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .unwrap_or_else(|| SourceError::Failed("the sampler stopped".into()));
                return Err(error);
            }
        }
        Ok(self.take_lost())
    }

    fn finish(&mut self, sink: &mut dyn FnMut(&RawSample<'_>)) -> Result<PollStats, SourceError> {
        // The recorder flushes once more when it stops; wait for it, then hand everything over.
        self.shared.stop.store(true, Relaxed);
        let thread = self.thread.take();
        let mut pending = Vec::new();
        if let Some(thread) = thread {
            while !thread.is_finished() {
                // Keep the channel moving so the recorder's last batch is not refused.
                while let Ok(batch) = self.rx.try_recv() {
                    pending.push(batch);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = thread.join();
        }
        while let Ok(batch) = self.rx.try_recv() {
            pending.push(batch);
        }
        for flush in pending {
            flush.deliver(sink);
        }
        Ok(self.take_lost())
    }
}

impl CaptureSource {
    fn take_lost(&mut self) -> PollStats {
        let lost = self.shared.lost.load(Relaxed);
        let stats = PollStats {
            lost: lost - self.reported_lost,
            kernel_walk: *self
                .shared
                .kernel_walk
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        };
        self.reported_lost = lost;
        stats
    }
}

/// The recorder thread: one recording until the source stops it.
fn run(options: RecordOptions, tx: SyncSender<Flush>, shared: Arc<Shared>) {
    let sink = Forward::new(tx, Arc::clone(&shared));
    let result = recorder::record(&options, &shared.stop, Some(Box::new(sink)));
    if let Err(e) = result {
        let error = match e {
            RecordError::Permission(_) => SourceError::Permission(e.to_string()),
            _ => SourceError::Failed(e.to_string()),
        };
        *shared.error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
    }
}

/// The [`ChunkSink`] that forwards new samples to the agent.
struct Forward {
    tx: SyncSender<Flush>,
    shared: Arc<Shared>,
    lost_seen: u64,
    /// The capture profile's frames and stack nodes, same ids, shared with the agent.
    stacks: StackTable,
    /// Frames and stack nodes of the capture profile already in `stacks`.
    mirrored: (usize, usize),
    /// Names and module paths, each held once.
    names: HashMap<String, Arc<str>>,
    /// Unix time minus monotonic time, to stamp samples in Unix nanoseconds.
    clock_offset: i128,
    /// Whether the in-kernel walk's state was logged.
    walk_logged: bool,
}

impl Forward {
    fn new(tx: SyncSender<Flush>, shared: Arc<Shared>) -> Forward {
        let mono = recorder::monotonic_ns() as i128;
        let unix = crate::now_ns() as i128;
        Forward {
            tx,
            shared,
            lost_seen: 0,
            stacks: StackTable::new(),
            mirrored: (0, 0),
            names: HashMap::new(),
            clock_offset: unix - mono,
            walk_logged: false,
        }
    }

    /// Logs once whether the in-kernel walk runs (with the fix when it cannot), and keeps its
    /// totals from the recording's metadata.
    fn note_kernel_walk(&mut self, profile: &Profile) {
        let extra = &profile.metadata.extra;
        let state = extra.get("kernel_walk").map(String::as_str);
        if !self.walk_logged {
            self.walk_logged = true;
            match state {
                Some("on") => tracing::info!("walking sampled user stacks in the kernel"),
                Some("unavailable") => tracing::warn!(
                    "{}; set kernel_walk = \"off\" to stop trying",
                    extra
                        .get("kernel_walk.note")
                        .map_or("in-kernel stack walk off", String::as_str)
                ),
                _ => {}
            }
        }
        if state != Some("on") {
            return;
        }
        let n = |key: &str| {
            extra
                .get(&format!("kernel_walk.{key}"))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let counts = KernelWalkCounts {
            walks: n("walks"),
            unwound: n("unwound"),
            fell_back: n("fell_back"),
            no_walk: n("no_walk"),
            in_copy: n("in_copy"),
            lost_chunks: n("lost_chunks"),
            rows_used: n("rows_used"),
            binaries_refused: n("binaries_refused"),
        };
        *self
            .shared
            .kernel_walk
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(counts);
    }

    fn intern(names: &mut HashMap<String, Arc<str>>, text: &str) -> Arc<str> {
        if let Some(name) = names.get(text) {
            return Arc::clone(name);
        }
        let name: Arc<str> = Arc::from(text);
        names.insert(text.to_string(), Arc::clone(&name));
        name
    }

    fn frame(&mut self, profile: &Profile, id: FrameId) -> FrameDesc {
        let frame = profile.frame(id);
        let name = Forward::intern(&mut self.names, profile.frame_name(id));
        let module = frame.mapping.map(|m| {
            let path = profile.string(profile.mapping(m).path);
            Forward::intern(&mut self.names, path)
        });
        let function = profile.function(frame.function);
        let code = (function.system_name.is_some() || function.tier.is_some()).then(|| {
            let mut text = |s: Option<rootline_profile::StringId>| {
                s.map(|s| Forward::intern(&mut self.names, profile.string(s)))
            };
            Arc::new(CodeDetail {
                system_name: text(function.system_name),
                tier: text(function.tier),
            })
        });
        FrameDesc {
            name,
            module,
            address: frame.address,
            inline_depth: frame.inline_depth,
            kind: frame.kind,
            code,
        }
    }

    /// Appends what is new in the capture profile's frames and stack trie to the shared table.
    fn mirror(&mut self, profile: &Profile) {
        let (frames, nodes) = self.mirrored;
        let new_frames: Vec<FrameDesc> = (frames..profile.frames().len())
            .map(|i| self.frame(profile, FrameId(i as u32)))
            .collect();
        let new_nodes = profile.stacks()[nodes.min(profile.stacks().len())..]
            .iter()
            .map(|n| (n.parent, n.frame.0));
        self.stacks.append(new_frames, new_nodes);
        self.mirrored = (profile.frames().len(), profile.stacks().len());
    }
}

impl ChunkSink for Forward {
    fn retention(&self) -> Retention {
        Retention::HandOver {
            max_entries: TABLE_ENTRIES,
        }
    }

    fn started_over(&mut self) {
        // Ids restart with the new profile: a new table (the agent lets go of the old one once
        // its stacks are exported); names are interned again as they recur.
        self.stacks = StackTable::new();
        self.mirrored = (0, 0);
        self.names.clear();
    }

    fn write_chunk(&mut self, profile: &Profile) -> std::io::Result<()> {
        let lost = profile.metadata.lost_samples;
        if lost > self.lost_seen {
            self.shared.lost.fetch_add(lost - self.lost_seen, Relaxed);
            self.lost_seen = lost;
        }
        self.note_kernel_walk(profile);
        self.mirror(profile);
        let samples = profile.samples();
        let column = |name: &str| {
            profile
                .sample_types()
                .iter()
                .position(|t| t.name == name && t.unit == "nanoseconds")
        };
        let (cpu, off) = (column("cpu"), column("off_cpu"));
        let alloc = profile
            .sample_types()
            .iter()
            .position(|t| *t == rootline_profile::SampleType::alloc_bytes());

        let mut batch = Vec::with_capacity(samples.len());
        let mut names = HashMap::new();
        let me = std::process::id();
        // The recording drops each flush's samples once handed over: all of them are new.
        for i in 0..samples.len() {
            let thread = profile.thread(samples.threads[i]);
            if thread.pid == me {
                continue; // the agent does not profile itself
            }
            let time = (samples.times[i] as i128 + self.clock_offset).max(0) as u64;
            let value = |c: Option<usize>| c.map_or(0, |c| samples.values[c][i].max(0) as u64);
            // A sample is on or off the CPU: its off_cpu value is 0 or its cpu value is.
            let off_ns = value(off);
            if let Entry::Vacant(e) = names.entry(thread.pid)
                && let Some(name) = profile.process_name(thread.pid)
            {
                e.insert(Box::from(name));
            }
            batch.push(OwnedSample {
                pid: thread.pid,
                tid: thread.tid,
                time_ns: time,
                weight_ns: if off_ns > 0 { off_ns } else { value(cpu) },
                off_cpu: off_ns > 0,
                alloc_bytes: value(alloc),
                stack: samples.stacks[i],
            });
        }
        if batch.is_empty() {
            return Ok(());
        }
        let n = batch.len() as u64;
        let flush = Flush {
            stacks: self.stacks.clone(),
            samples: batch,
            names,
        };
        match self.tx.try_send(flush) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.shared.lost.fetch_add(n, Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => {
                self.shared.stop.store(true, Relaxed);
            }
        }
        Ok(())
    }
}

/// The production source for `config`: rootline-capture's sampler on every CPU.
pub fn default_source(config: &AgentConfig) -> Result<Box<dyn SampleSource>, SourceError> {
    Ok(Box::new(CaptureSource::start(config)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rootline_profile::{FrameKind, SampleType};

    /// Pushes one sample of pid 4242 per stack (names root first) into `profile`.
    fn push_stacks(profile: &mut Profile, stacks: &[&[&str]]) {
        let thread = profile.intern_thread(4242, 4243);
        for (i, names) in stacks.iter().enumerate() {
            let mut stack = None;
            for name in *names {
                let frame = profile.intern_named_frame(name, FrameKind::Native);
                stack = Some(profile.intern_stack(stack, frame));
            }
            let stack = stack.expect("a stack has frames");
            profile
                .push_sample(i as u64, thread, stack, &[1, 10_000_000])
                .expect("ids of this profile");
        }
    }

    fn new_profile() -> Profile {
        Profile::new(vec![SampleType::samples(), SampleType::cpu_nanoseconds()])
    }

    /// Each delivered sample's stack, root first, by name, and its table's id.
    fn delivered(rx: &Receiver<Flush>) -> Vec<(u64, Vec<String>)> {
        let mut out = Vec::new();
        let mut frames = Vec::new();
        while let Ok(flush) = rx.try_recv() {
            flush.deliver(&mut |s| {
                s.stacks.read().frames_root_first(s.stack, &mut frames);
                let names = frames.iter().map(|f| f.name.to_string()).collect();
                out.push((s.stacks.id(), names));
            });
        }
        out
    }

    #[test]
    fn flushed_samples_name_their_whole_stacks_in_the_shared_table_across_a_start_over() {
        let (tx, rx) = std::sync::mpsc::sync_channel(8);
        let mut forward = Forward::new(tx, Arc::new(Shared::default()));
        let mut profile = new_profile();
        push_stacks(
            &mut profile,
            &[&["_start", "main", "a"], &["_start", "main", "b"]],
        );
        forward.write_chunk(&profile).unwrap();
        profile.take_samples();
        // The next flush adds nodes under known ones and repeats a known stack.
        push_stacks(
            &mut profile,
            &[&["_start", "main", "a", "c"], &["_start", "main", "b"]],
        );
        forward.write_chunk(&profile).unwrap();
        // The recording starts over: ids restart, and the same ids now name other stacks.
        forward.started_over();
        let mut fresh = new_profile();
        push_stacks(
            &mut fresh,
            &[&["_start", "other"], &["_start", "main", "a"]],
        );
        forward.write_chunk(&fresh).unwrap();

        let got = delivered(&rx);
        let names: Vec<Vec<&str>> = got
            .iter()
            .map(|(_, n)| n.iter().map(String::as_str).collect())
            .collect();
        assert_eq!(
            names,
            vec![
                vec!["_start", "main", "a"],
                vec!["_start", "main", "b"],
                vec!["_start", "main", "a", "c"],
                vec!["_start", "main", "b"],
                vec!["_start", "other"],
                vec!["_start", "main", "a"],
            ]
        );
        let tables: Vec<u64> = got.iter().map(|(t, _)| *t).collect();
        assert_eq!(
            tables[0], tables[3],
            "one table until the recording starts over"
        );
        assert_ne!(tables[3], tables[4], "a new table after it");
        assert_eq!(tables[4], tables[5]);
    }
}
