//! `.nettrace` → [`Profile`]: thread samples and GC allocation ticks, with IPs named through the
//! method and module events (JIT-time and rundown).
//!
//! Naming is deferred to the end of the stream because rundown events (the methods and modules
//! alive when the session stopped) come last. Until then samples are kept as compact rows against
//! distinct IP stacks, so memory grows with distinct stacks plus a few bytes per sample.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;

use rootline_profile::{
    Frame, FrameId, FrameKind, Function, Profile, SampleType, StackId, TruncateReason, pseudo,
};

use crate::error::NetTraceError;
use crate::events::{self, KnownEvent, MethodInfo};
use crate::nettrace::NetTraceReader;

/// EventPipe's stack depth cap: a stack walk stops after this many frames.
pub const EVENTPIPE_DEPTH_CAP: u32 = 100;

/// What the conversion saw, beyond what the profile holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConvertStats {
    /// Events read.
    pub events: u64,
    /// Thread samples whose thread was in managed code.
    pub managed_samples: u64,
    /// Thread samples whose thread was in native (external) code.
    pub external_samples: u64,
    /// GC allocation ticks.
    pub allocation_ticks: u64,
    /// Method code ranges known (JIT-time plus rundown, deduplicated).
    pub methods: usize,
    /// Modules known.
    pub modules: usize,
    /// Frames of all thread samples (counted per sample).
    pub sample_frames: u64,
    /// Of `sample_frames`, those whose IP was resolved to a method.
    pub resolved_sample_frames: u64,
    /// Thread samples whose stack is exactly [`EVENTPIPE_DEPTH_CAP`] frames deep.
    pub samples_at_cap: u64,
    /// Allocation ticks whose stack is exactly [`EVENTPIPE_DEPTH_CAP`] frames deep.
    pub allocation_ticks_at_cap: u64,
    /// Events the writer dropped (sequence-number gaps).
    pub dropped_events: u64,
    /// Events that referred to a stack not defined in their region.
    pub missing_stacks: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RowKind {
    Thread,
    Alloc,
}

#[derive(Debug, Clone, Copy)]
struct Row {
    ticks: u64,
    tid: u64,
    stack: u32,
    kind: RowKind,
    /// Bytes, for an allocation tick.
    value: i64,
    /// Index of the allocated type in the type table, for an allocation tick (`None`: the event
    /// version does not say).
    type_name: Option<u32>,
}

/// Method code ranges sorted by start, for IP lookup.
struct MethodIndex {
    starts: Vec<u64>,
    methods: Vec<MethodInfo>,
}

impl MethodIndex {
    fn new(mut methods: Vec<MethodInfo>) -> MethodIndex {
        methods.sort_by_key(|m| (m.start, m.size));
        methods
            .dedup_by(|a, b| a.start == b.start && a.size == b.size && a.method_id == b.method_id);
        MethodIndex {
            starts: methods.iter().map(|m| m.start).collect(),
            methods,
        }
    }

    fn find(&self, ip: u64) -> Option<&MethodInfo> {
        let i = self.starts.partition_point(|&s| s <= ip);
        // Ranges do not nest, but a re-JIT may leave an older, larger range before a newer one:
        // look back a few entries.
        self.methods[..i]
            .iter()
            .rev()
            .take(4)
            .find(|m| ip < m.start.saturating_add(u64::from(m.size)))
    }
}

/// Reads a `.nettrace` stream into a [`Profile`]. See [`read_profile_with_stats`].
pub fn read_profile<R: Read>(source: R) -> Result<Profile, NetTraceError> {
    read_profile_with_stats(source).map(|(p, _)| p)
}

/// Reads a `.nettrace` stream into a [`Profile`] and reports what it saw.
///
/// Sample types: `samples` (count) and `wall` (nanoseconds, the runtime's sampling period per
/// sample), plus `alloc-bytes` and `alloc-count` when the trace has GC allocation ticks (thread
/// samples carry 0 there, allocation ticks carry 0 samples and 0 wall time). The runtime sends a
/// tick each time about 100 KB have been allocated on a heap, with the stack and type of the
/// allocation that crossed the mark: its `alloc-bytes` is the tick's amount (the bytes allocated
/// since the previous tick, so already an estimate of all bytes), its `alloc-count` is 1 (one tick:
/// a count of ticks, not of objects). The stack of a tick ends in the pseudo frame
/// `[alloc: TYPE]` ([`pseudo::alloc_frame_name`]), TYPE as the runtime names it
/// (`System.Byte[]`). Frames are named `Module!Namespace.Method(params)`
/// like dotnet-trace; IPs that no method event covers stay as `?!0x…`. The metadata records the
/// producer `EventPipe` and the depth cap of 100 frames so that repair can find cut stacks.
pub fn read_profile_with_stats<R: Read>(
    source: R,
) -> Result<(Profile, ConvertStats), NetTraceError> {
    let mut reader = NetTraceReader::new(source)?;
    let info = reader.info().clone();
    let mut stats = ConvertStats::default();
    let mut stack_ids: HashMap<Vec<u64>, u32> = HashMap::new();
    let mut stack_list: Vec<Vec<u64>> = Vec::new();
    let mut rows: Vec<Row> = Vec::new();
    let mut methods: Vec<MethodInfo> = Vec::new();
    let mut modules: HashMap<u64, String> = HashMap::new();
    let mut command_line = None;
    let mut ips = Vec::new();
    let mut type_ids: HashMap<String, u32> = HashMap::new();
    let mut type_names: Vec<String> = Vec::new();
    while let Some(event) = reader.next_event()? {
        stats.events += 1;
        let Some(known) = KnownEvent::classify(event.metadata) else {
            continue;
        };
        let at = event.offset;
        let kind = match known {
            KnownEvent::ThreadSample => {
                match events::parse_thread_sample(event.payload, at)? {
                    1 => stats.external_samples += 1,
                    _ => stats.managed_samples += 1,
                }
                RowKind::Thread
            }
            KnownEvent::AllocationTick => {
                stats.allocation_ticks += 1;
                RowKind::Alloc
            }
            KnownEvent::MethodVerbose => {
                methods.push(events::parse_method_verbose(event.payload, at)?);
                continue;
            }
            KnownEvent::Module => {
                let m = events::parse_module(event.payload, at)?;
                modules.insert(m.module_id, m.short_name());
                continue;
            }
            KnownEvent::ProcessInfo => {
                command_line = Some(events::parse_process_info(event.payload, at)?);
                continue;
            }
        };
        let (value, type_name) = if kind == RowKind::Alloc {
            let tick = events::parse_allocation_tick(event.payload, at, info.pointer_size)?;
            let type_name = tick.type_name.map(|name| match type_ids.get(&name) {
                Some(&id) => id,
                None => {
                    let id = u32::try_from(type_names.len()).unwrap_or(u32::MAX);
                    type_ids.insert(name.clone(), id);
                    type_names.push(name);
                    id
                }
            });
            (i64::try_from(tick.amount).unwrap_or(i64::MAX), type_name)
        } else {
            (1, None)
        };
        ips.clear();
        ips.extend(event.stack.ips());
        let stack = match stack_ids.get(&ips) {
            Some(&id) => id,
            None => {
                let id = u32::try_from(stack_list.len()).unwrap_or(u32::MAX);
                stack_ids.insert(ips.clone(), id);
                stack_list.push(ips.clone());
                id
            }
        };
        rows.push(Row {
            ticks: event.timestamp,
            tid: event.thread_id,
            stack,
            kind,
            value,
            type_name,
        });
    }
    let rs = reader.stats();
    stats.dropped_events = rs.dropped_events;
    stats.missing_stacks = rs.missing_stacks;
    drop(stack_ids);
    drop(type_ids);

    let index = MethodIndex::new(methods);
    stats.methods = index.methods.len();
    stats.modules = modules.len();
    let has_alloc = stats.allocation_ticks > 0;
    let mut types = vec![SampleType::samples(), SampleType::wall_nanoseconds()];
    if has_alloc {
        types.push(SampleType::alloc_bytes());
        types.push(SampleType::alloc_count());
    }
    let mut profile = Profile::new(types);

    // Name every distinct stack once.
    let mut frame_cache: HashMap<u64, (FrameId, bool)> = HashMap::new();
    let mut resolved_depth: Vec<(StackId, u32, u32)> = Vec::with_capacity(stack_list.len());
    let mut frames = Vec::new();
    for ips in &stack_list {
        frames.clear();
        let mut resolved = 0u32;
        for &ip in ips.iter().rev() {
            let (frame, ok) = *frame_cache
                .entry(ip)
                .or_insert_with(|| name_frame(&mut profile, &index, &modules, ip));
            resolved += u32::from(ok);
            frames.push(frame);
        }
        let id = profile
            .intern_stack_root_first(frames.iter().copied())
            .unwrap_or_else(|| {
                // The walk found no managed frame: say so instead of inventing one.
                let f = profile.intern_truncated(TruncateReason::NoManagedFrames);
                profile.intern_stack(None, f)
            });
        resolved_depth.push((id, u32::try_from(ips.len()).unwrap_or(u32::MAX), resolved));
    }

    let pid = info.process_id;
    profile.intern_process(pid);
    let period_ns = if info.sampling_period_ns > 0 {
        i64::from(info.sampling_period_ns)
    } else {
        1_000_000
    };
    rows.sort_by_key(|r| r.ticks);
    let mut thread_ids = HashMap::new();
    // An allocation's stack: the event's stack with the allocated type as its leaf frame.
    let mut alloc_stacks: HashMap<(u32, Option<u32>), StackId> = HashMap::new();
    for row in &rows {
        let (mut stack, depth, resolved) = resolved_depth[row.stack as usize];
        if row.kind == RowKind::Alloc {
            stack = *alloc_stacks
                .entry((row.stack, row.type_name))
                .or_insert_with(|| {
                    let name = row
                        .type_name
                        .and_then(|t| type_names.get(t as usize))
                        .map(String::as_str);
                    let leaf = pseudo::intern_alloc_frame(&mut profile, name);
                    profile.intern_stack(Some(stack), leaf)
                });
        }
        let thread = *thread_ids.entry(row.tid).or_insert_with(|| {
            profile.intern_thread(pid, u32::try_from(row.tid).unwrap_or(u32::MAX))
        });
        let mut values = [0i64; 4];
        match row.kind {
            RowKind::Thread => {
                values[0] = 1;
                values[1] = period_ns;
                stats.sample_frames += u64::from(depth);
                stats.resolved_sample_frames += u64::from(resolved);
                if depth == EVENTPIPE_DEPTH_CAP {
                    stats.samples_at_cap += 1;
                }
            }
            RowKind::Alloc => {
                values[2] = row.value;
                values[3] = 1;
                if depth == EVENTPIPE_DEPTH_CAP {
                    stats.allocation_ticks_at_cap += 1;
                }
            }
        }
        let n = if has_alloc { 4 } else { 2 };
        // Ids come from this profile and the value count matches its types.
        let _ = profile.push_sample(info.timestamp_ns(row.ticks), thread, stack, &values[..n]);
    }

    let md = &mut profile.metadata;
    md.producer = "EventPipe".into();
    md.depth_cap = Some(EVENTPIPE_DEPTH_CAP);
    md.start_time_ns = rows.first().map_or(0, |r| info.timestamp_ns(r.ticks));
    md.end_time_ns = rows.last().map_or(0, |r| info.timestamp_ns(r.ticks));
    md.sample_rate_hz = u32::try_from(1_000_000_000 / period_ns).ok();
    md.command_line = command_line;
    md.lost_samples = stats.dropped_events;
    let extra: &mut BTreeMap<String, String> = &mut md.extra;
    extra.insert(
        "nettrace.format_version".into(),
        info.format_version.to_string(),
    );
    extra.insert(
        "nettrace.pointer_size".into(),
        info.pointer_size.to_string(),
    );
    extra.insert("nettrace.events".into(), stats.events.to_string());
    extra.insert(
        "nettrace.dropped_events".into(),
        stats.dropped_events.to_string(),
    );
    extra.insert(
        "nettrace.missing_stacks".into(),
        stats.missing_stacks.to_string(),
    );
    extra.insert(
        "nettrace.managed_samples".into(),
        stats.managed_samples.to_string(),
    );
    extra.insert(
        "nettrace.external_samples".into(),
        stats.external_samples.to_string(),
    );
    extra.insert(
        "nettrace.allocation_ticks".into(),
        stats.allocation_ticks.to_string(),
    );
    extra.insert(
        "nettrace.samples_at_depth_cap".into(),
        stats.samples_at_cap.to_string(),
    );
    extra.insert(
        "nettrace.allocation_ticks_at_depth_cap".into(),
        stats.allocation_ticks_at_cap.to_string(),
    );
    if let Some(cmd) = profile.metadata.command_line.clone() {
        let id = profile.intern_string(&cmd);
        profile.intern_process(pid).command_line = Some(id);
    }
    Ok((profile, stats))
}

fn name_frame(
    profile: &mut Profile,
    index: &MethodIndex,
    modules: &HashMap<u64, String>,
    ip: u64,
) -> (FrameId, bool) {
    let (function, ok) = match index.find(ip) {
        Some(m) => {
            let module = modules.get(&m.module_id).map_or("?", String::as_str);
            let raw = format!("{module}!{}", m.display_name());
            let user = format!("{module}!{}", m.user_name());
            let function = Function {
                system_name: (user != raw).then(|| profile.intern_string(&raw)),
                tier: m.tier().map(|t| profile.intern_string(t)),
                ..Function::new(profile.intern_string(&user), None)
            };
            (function, true)
        }
        None => {
            let name = profile.intern_string(&format!("?!0x{ip:x}"));
            (Function::new(name, None), false)
        }
    };
    let function = profile.intern_function(function);
    let frame = profile.intern_frame(Frame {
        function,
        mapping: None,
        address: ip,
        line: None,
        inline_depth: 0,
        kind: FrameKind::Managed,
        from_live_memory: false,
    });
    (frame, ok)
}
