//! [`Profile`] → pprof message: deduplicated tables, inline chains grouped into locations, samples
//! summed per (thread, stack).

use std::collections::HashMap;

use rootline_profile::{Frame, Profile, StackId, ThreadId, pseudo};

use super::proto;

/// The pprof string table: index 0 is "", each string stored once.
#[derive(Default)]
pub(crate) struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    pub(crate) fn new() -> Strings {
        let mut s = Strings::default();
        s.intern("");
        s
    }

    pub(crate) fn intern(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }

    pub(crate) fn into_table(self) -> Vec<String> {
        self.table
    }
}

/// The frames of one pprof location: a physical frame and the frames inlined into it, leaf first.
/// Returns how many frames of `frames` (leaf first) the first location takes.
pub(crate) fn location_span(frames: &[Frame]) -> usize {
    let Some(first) = frames.first() else {
        return 0;
    };
    if first.address == 0 || first.inline_depth == 0 {
        return 1;
    }
    let mut n = 1;
    let mut depth = first.inline_depth;
    while depth > 0 {
        match frames.get(n) {
            Some(f)
                if f.address == first.address
                    && f.mapping == first.mapping
                    && f.inline_depth < depth =>
            {
                depth = f.inline_depth;
                n += 1;
            }
            _ => break,
        }
    }
    n
}

/// The period type and period for a profile: CPU nanoseconds between samples when a sampling rate is
/// known, else one per sample.
/// A period type read from a pprof file (kept in the metadata as `pprof.period_type` and
/// `pprof.period`) is written back unchanged.
pub(crate) fn period_of(profile: &Profile) -> (&str, &str, i64) {
    let extra = &profile.metadata.extra;
    let kept = extra
        .get("pprof.period_type")
        .and_then(|t| t.split_once('/'))
        .zip(
            extra
                .get("pprof.period")
                .and_then(|p| p.parse::<i64>().ok()),
        );
    if let Some(((name, unit), period)) = kept {
        return (name, unit, period);
    }
    match profile.metadata.sample_rate_hz {
        Some(hz) if hz > 0 => ("cpu", "nanoseconds", 1_000_000_000 / i64::from(hz)),
        _ => ("samples", "count", 1),
    }
}

/// True for the frame the reader makes from a location without lines: a function named by the
/// frame's own address (`0x…`), no file, no line. The writer gives such a frame no `Line` again.
pub(crate) fn is_address_only(profile: &Profile, frame: &Frame) -> bool {
    let function = profile.function(frame.function);
    frame.address != 0
        && frame.line.is_none()
        && function.file.is_none()
        && profile.string(function.name) == format!("0x{:x}", frame.address)
}

pub(super) fn to_message(profile: &Profile) -> proto::Profile {
    let mut strings = Strings::new();
    let mut message = proto::Profile {
        sample_type: profile
            .sample_types()
            .iter()
            .map(|t| proto::ValueType {
                r#type: strings.intern(t.pprof_name()),
                unit: strings.intern(&t.unit),
            })
            .collect(),
        ..proto::Profile::default()
    };
    let meta = &profile.metadata;
    message.time_nanos = i64::try_from(meta.start_time_ns).unwrap_or(i64::MAX);
    message.duration_nanos =
        i64::try_from(meta.end_time_ns.saturating_sub(meta.start_time_ns)).unwrap_or(i64::MAX);
    let (period_name, period_unit, period) = period_of(profile);
    message.period_type = Some(proto::ValueType {
        r#type: strings.intern(period_name),
        unit: strings.intern(period_unit),
    });
    message.period = period;
    if !meta.producer.is_empty() {
        message
            .comment
            .push(strings.intern(&format!("producer: {}", meta.producer)));
    }

    // Mappings and functions are interned by full key in the profile already: one row each.
    for (i, m) in profile.mappings().iter().enumerate() {
        message.mapping.push(proto::Mapping {
            id: i as u64 + 1,
            memory_start: m.start,
            memory_limit: m.end,
            file_offset: m.file_offset,
            filename: strings.intern(profile.string(m.path)),
            build_id: m.build_id.map_or(0, |b| strings.intern(profile.string(b))),
            has_functions: true,
            has_filenames: false,
            has_line_numbers: false,
            has_inline_frames: true,
        });
    }
    for (i, f) in profile.functions().iter().enumerate() {
        let name = strings.intern(profile.string(f.name));
        // The runtime's own name (a CoreCLR perf map's whole line, tier included) when known.
        let system_name = f
            .system_name
            .map_or(name, |s| strings.intern(profile.string(s)));
        message.function.push(proto::Function {
            id: i as u64 + 1,
            name,
            system_name,
            filename: f
                .file
                .map_or(0, |file| strings.intern(profile.string(file))),
            start_line: 0,
        });
    }

    let mut locations: HashMap<proto::Location, u64> = HashMap::new();
    let mut stack_locations: HashMap<StackId, Vec<u64>> = HashMap::new();
    let mut samples: HashMap<(ThreadId, StackId), usize> = HashMap::new();
    let mut frames: Vec<Frame> = Vec::new();
    let data = profile.samples();
    for (n, (&thread, &stack)) in data.threads.iter().zip(&data.stacks).enumerate() {
        let slot = *samples.entry((thread, stack)).or_insert_with(|| {
            let ids = stack_locations.entry(stack).or_insert_with(|| {
                frames.clear();
                frames.extend(profile.stack_frames(stack).map(|f| *profile.frame(f)));
                location_ids(profile, &frames, &mut locations, &mut message.location)
            });
            let mut label = thread_labels(profile, thread, &mut strings);
            // An allocation's type, which its leaf frame `[alloc: TYPE]` also shows (a native
            // allocation's frame names the C function called instead: no type).
            if let Some(ty) = pseudo::alloc_type_of(profile.frame_name(profile.stack(stack).frame))
                .filter(|ty| !pseudo::NATIVE_ALLOC_FUNCTIONS.contains(ty))
            {
                label.push(proto::Label {
                    key: strings.intern(ALLOCATED_TYPE_KEY),
                    str: strings.intern(ty),
                    ..proto::Label::default()
                });
            }
            message.sample.push(proto::Sample {
                location_id: ids.clone(),
                value: vec![0; data.values.len()],
                label,
            });
            message.sample.len() - 1
        });
        for (total, column) in message.sample[slot].value.iter_mut().zip(&data.values) {
            *total = total.saturating_add(column[n]);
        }
    }
    message.string_table = strings.into_table();
    message
}

/// The location ids (leaf first) of a stack's frames (leaf first), adding new locations.
fn location_ids(
    profile: &Profile,
    frames: &[Frame],
    index: &mut HashMap<proto::Location, u64>,
    table: &mut Vec<proto::Location>,
) -> Vec<u64> {
    let mut ids = Vec::new();
    let mut rest = frames;
    while !rest.is_empty() {
        let span = location_span(rest);
        let (group, tail) = rest.split_at(span);
        let key = proto::Location {
            id: 0,
            mapping_id: group[0].mapping.map_or(0, |m| u64::from(m.0) + 1),
            address: group[0].address,
            line: group
                .iter()
                .filter(|f| !is_address_only(profile, f))
                .map(|f| proto::Line {
                    function_id: u64::from(f.function.0) + 1,
                    line: f.line.map_or(0, i64::from),
                    column: 0,
                })
                .collect(),
            is_folded: false,
        };
        let id = *index.entry(key).or_insert_with_key(|key| {
            let id = table.len() as u64 + 1;
            table.push(proto::Location { id, ..key.clone() });
            id
        });
        ids.push(id);
        rest = tail;
    }
    ids
}

/// The label key of an allocation sample's type.
pub(crate) const ALLOCATED_TYPE_KEY: &str = "allocated_type";

fn thread_labels(profile: &Profile, thread: ThreadId, strings: &mut Strings) -> Vec<proto::Label> {
    let t = profile.thread(thread);
    let mut labels = Vec::new();
    if t.pid != 0 || t.tid != 0 {
        labels.push(proto::Label {
            key: strings.intern("thread_id"),
            num: i64::from(t.tid),
            ..proto::Label::default()
        });
        labels.push(proto::Label {
            key: strings.intern("pid"),
            num: i64::from(t.pid),
            ..proto::Label::default()
        });
    }
    if let Some(name) = profile.thread_name(thread) {
        labels.push(proto::Label {
            key: strings.intern("thread_name"),
            str: strings.intern(name),
            ..proto::Label::default()
        });
    }
    labels
}
