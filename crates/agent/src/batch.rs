//! Turns drained sample buffers into per-process [`Profile`]s for the exporters.
//!
//! The [`Resolver`] mirrors the capture thread's stack cache from the definitions and evictions in
//! the record stream, so it holds at most what the cache holds (plus stacks evicted while still
//! referenced in a buffer). Keys are never reused, so a mirror entry can never name the wrong stack.
//! A mirror entry is a handle to the source's shared [`crate::StackTable`] and a node in it; each
//! process's profile interns a node (and its callers) once, walking the table, so no stack is
//! copied per sample.

use std::collections::HashMap;
use std::sync::Arc;

use rootline_profile::{
    Frame, FrameId, Function, Mapping, Profile, SampleType, StackId, TruncateReason,
};

use crate::buffer::{Record, SampleBuffer, SampleRecord};
use crate::cache::StackKey;
use crate::process::ProcessInfo;
use crate::stacks::{FrameDesc, StackRef, StackView};

/// The samples of one process for one export.
#[derive(Debug)]
pub struct ProcessProfile {
    /// The process.
    pub process: Arc<ProcessInfo>,
    /// Its samples: value columns `samples/count` and `cpu/nanoseconds`, and with .NET allocation
    /// ticks on `alloc-bytes/bytes` and `alloc-count/count` (ticks).
    pub profile: Profile,
    /// Number of samples in `profile`.
    pub samples: u64,
}

/// Everything one export carries.
#[derive(Debug, Default)]
pub struct ExportBatch {
    /// Sequence number of the export, from 1.
    pub sequence: u64,
    /// Start of the period covered, nanoseconds since the Unix epoch.
    pub start_ns: u64,
    /// End of the period covered, nanoseconds since the Unix epoch.
    pub end_ns: u64,
    /// One profile per sampled process, in order of first sample.
    pub processes: Vec<ProcessProfile>,
    /// Total samples over all processes.
    pub samples: u64,
}

/// Mirror of the stack cache, fed by the record stream.
#[derive(Debug, Default)]
pub struct Resolver {
    stacks: HashMap<StackKey, StackRef>,
    unresolved: u64,
}

/// Per-process profile under construction.
struct Builder {
    profile: Profile,
    samples: u64,
    stack_ids: HashMap<StackKey, StackId>,
    /// This profile's node for each `(table id, node)` resolved so far.
    node_ids: HashMap<(u64, u32), StackId>,
    /// This profile's frame for each `(table id, frame index)` resolved so far.
    frame_ids: HashMap<(u64, u32), FrameId>,
    /// Scratch: the nodes of a stack not resolved yet, leaf first.
    path: Vec<(StackId, u32)>,
}

impl Resolver {
    /// An empty mirror.
    pub fn new() -> Resolver {
        Resolver::default()
    }

    /// Samples whose key had no definition (always 0 unless the stream is broken); such samples
    /// are kept with a `[truncated: stack definition missing]` stack.
    pub fn unresolved(&self) -> u64 {
        self.unresolved
    }

    /// Applies `buffer`'s records in order, adding its samples to `batch` (per process).
    pub fn drain_into(&mut self, buffer: &SampleBuffer, batch: &mut BatchBuilder) {
        for record in buffer.records() {
            match record {
                Record::Define { key, stack } => {
                    self.stacks.insert(*key, stack.clone());
                }
                Record::Evict { key } => {
                    self.stacks.remove(key);
                }
                Record::Retire { table } => {
                    self.stacks.retain(|_, s| s.table.id() == *table);
                }
                Record::Sample(sample) => {
                    let stack = self.stacks.get(&sample.key);
                    if stack.is_none() {
                        self.unresolved += 1;
                    }
                    batch.add(sample, stack);
                }
            }
        }
    }

    /// Forgets every key (after the final rundown).
    pub fn clear(&mut self) {
        self.stacks.clear();
    }
}

/// Collects samples into one profile per process.
#[derive(Default)]
pub struct BatchBuilder {
    order: Vec<u32>,
    processes: HashMap<u32, (Arc<ProcessInfo>, Builder)>,
    sample_rate_hz: Option<u32>,
    /// Whether profiles carry the allocation columns.
    alloc: bool,
    /// Profiles carry the `off_cpu` column.
    off_cpu: bool,
}

impl BatchBuilder {
    /// An empty builder; `sample_rate_hz` goes into each profile's metadata; with `alloc`, each
    /// profile has the allocation columns `alloc-bytes` and `alloc-count` too.
    pub fn new(sample_rate_hz: Option<u32>, alloc: bool) -> BatchBuilder {
        BatchBuilder {
            sample_rate_hz,
            alloc,
            ..BatchBuilder::default()
        }
    }

    /// Profiles get the `off_cpu` column (nanoseconds) beside `samples` and `cpu`: off-CPU
    /// samples weigh there, and 0 in the other two.
    pub fn with_off_cpu(&mut self) {
        self.off_cpu = true;
    }

    fn add(&mut self, sample: &SampleRecord, stack: Option<&StackRef>) {
        let process = &sample.process;
        let pid = process.pid;
        let (rate, alloc, off_cpu) = (self.sample_rate_hz, self.alloc, self.off_cpu);
        let order = &mut self.order;
        let (_, builder) = self.processes.entry(pid).or_insert_with(|| {
            order.push(pid);
            (
                Arc::clone(process),
                Builder::new(process, rate, alloc, off_cpu),
            )
        });
        builder.add(pid, sample, stack);
    }

    /// Finishes the batch covering `start_ns..end_ns`.
    pub fn finish(mut self, sequence: u64, start_ns: u64, end_ns: u64) -> ExportBatch {
        let mut batch = ExportBatch {
            sequence,
            start_ns,
            end_ns,
            ..ExportBatch::default()
        };
        for pid in self.order {
            if let Some((process, mut builder)) = self.processes.remove(&pid) {
                builder.profile.metadata.start_time_ns = start_ns;
                builder.profile.metadata.end_time_ns = end_ns;
                batch.samples += builder.samples;
                batch.processes.push(ProcessProfile {
                    process,
                    profile: builder.profile,
                    samples: builder.samples,
                });
            }
        }
        batch
    }
}

impl Builder {
    /// A profile with the columns `samples` and `cpu`, then `off_cpu` with `off_cpu`, then
    /// `alloc-bytes` and `alloc-count` with `alloc`.
    fn new(
        process: &ProcessInfo,
        sample_rate_hz: Option<u32>,
        alloc: bool,
        off_cpu: bool,
    ) -> Builder {
        let mut types = vec![SampleType::samples(), SampleType::cpu_nanoseconds()];
        if off_cpu {
            types.push(SampleType::off_cpu_nanoseconds());
        }
        if alloc {
            types.push(SampleType::alloc_bytes());
            types.push(SampleType::alloc_count());
        }
        let mut profile = Profile::new(types);
        profile.metadata.producer = "rootline agent".to_string();
        profile.metadata.command_line = process.command_line.clone();
        profile.metadata.sample_rate_hz = sample_rate_hz;
        profile.metadata.host = crate::host_name();
        if let Some(comm) = &process.comm {
            profile.set_process_name(process.pid, comm);
        }
        if let Some(cmd) = &process.command_line {
            let cmd = profile.intern_string(cmd);
            profile.intern_process(process.pid).command_line = Some(cmd);
        }
        Builder {
            profile,
            samples: 0,
            stack_ids: HashMap::new(),
            node_ids: HashMap::new(),
            frame_ids: HashMap::new(),
            path: Vec::new(),
        }
    }

    fn add(&mut self, pid: u32, sample: &SampleRecord, stack: Option<&StackRef>) {
        let stack_id = match self.stack_ids.get(&sample.key) {
            Some(&id) => id,
            None => {
                let id = self.intern_stack(stack);
                self.stack_ids.insert(sample.key, id);
                id
            }
        };
        let thread = self.profile.intern_thread(pid, sample.tid);
        let weight = i64::try_from(sample.weight_ns).unwrap_or(i64::MAX);
        let bytes = i64::try_from(sample.alloc_bytes).unwrap_or(i64::MAX);
        let types = self.profile.sample_types();
        let column = |t: SampleType| types.iter().position(|x| *x == t);
        let mut values = [0i64; 5];
        let values = &mut values[..types.len()];
        if sample.off_cpu {
            // Without the column (off-CPU not configured), an off-CPU sample has no place.
            let Some(c) = column(SampleType::off_cpu_nanoseconds()) else {
                return;
            };
            values[c] = weight;
        } else if sample.alloc_bytes > 0 {
            // Likewise an allocation sample without the allocation columns.
            let (Some(b), Some(n)) = (
                column(SampleType::alloc_bytes()),
                column(SampleType::alloc_count()),
            ) else {
                return;
            };
            values[b] = bytes;
            values[n] = 1;
        } else {
            values[0] = 1;
            values[1] = weight;
        }
        // Cannot fail: the thread and stack were interned just above, one value per column.
        let _ = self
            .profile
            .push_sample(sample.time_ns, thread, stack_id, values);
        self.samples += 1;
    }

    fn intern_stack(&mut self, stack: Option<&StackRef>) -> StackId {
        let resolved = stack.and_then(|s| self.intern_node(s.table.id(), &s.table.read(), s.id));
        resolved.unwrap_or_else(|| {
            let id = self
                .profile
                .intern_truncated(TruncateReason::StackDefinitionMissing);
            self.profile.intern_stack(None, id)
        })
    }

    /// This profile's node for node `id` of table `table` (None: the table has no such node).
    /// Walks up to the first caller already resolved, then interns the rest root-most first.
    fn intern_node(&mut self, table: u64, view: &StackView<'_>, id: StackId) -> Option<StackId> {
        self.path.clear();
        let mut next = Some(id);
        let mut parent = None;
        while let Some(node) = next {
            if let Some(&known) = self.node_ids.get(&(table, node.0)) {
                parent = Some(known);
                break;
            }
            let (caller, frame) = view.node(node)?;
            self.path.push((node, frame));
            next = caller;
        }
        while let Some((node, frame)) = self.path.pop() {
            let frame_id = match self.frame_ids.get(&(table, frame)) {
                Some(&f) => f,
                None => {
                    let f = self.intern_frame(view.frame(frame)?);
                    self.frame_ids.insert((table, frame), f);
                    f
                }
            };
            let stack = self.profile.intern_stack(parent, frame_id);
            self.node_ids.insert((table, node.0), stack);
            parent = Some(stack);
        }
        parent
    }

    fn intern_frame(&mut self, frame: &FrameDesc) -> FrameId {
        let name = self.profile.intern_string(&frame.name);
        let code = frame.code.as_deref();
        let mut text = |s: Option<&Arc<str>>| s.map(|s| self.profile.intern_string(s));
        let function = Function {
            system_name: text(code.and_then(|c| c.system_name.as_ref())),
            tier: text(code.and_then(|c| c.tier.as_ref())),
            ..Function::new(name, None)
        };
        let function = self.profile.intern_function(function);
        let mapping = frame.module.as_ref().map(|module| {
            let path = self.profile.intern_string(module);
            self.profile.intern_mapping(Mapping {
                start: 0,
                end: 0,
                file_offset: 0,
                path,
                build_id: None,
            })
        });
        self.profile.intern_frame(Frame {
            function,
            mapping,
            address: frame.address,
            line: None,
            inline_depth: frame.inline_depth,
            kind: frame.kind,
            from_live_memory: false,
        })
    }
}
