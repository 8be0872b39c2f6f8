//! pprof bytes → [`Profile`]: a field-by-field protobuf walk that keeps byte offsets, then checked
//! conversion of the tables.

use std::collections::HashMap;

use prost::Message;
use rootline_profile::{
    Frame, FrameId, FrameKind, Function, Mapping, MappingId, Profile, SampleType, TruncateReason,
};

use super::proto;
use crate::error::{FormatError, Position};

/// Byte offsets of the top-level fields, so later checks can say where a bad row is.
#[derive(Default)]
pub(super) struct Offsets {
    sample: Vec<u64>,
    mapping: Vec<u64>,
    location: Vec<u64>,
    function: Vec<u64>,
    first_string: Option<u64>,
    sample_type: Vec<u64>,
    /// Offset of the last occurrence of each scalar field (the one that wins), by field number.
    last: [u64; 16],
}

impl Offsets {
    fn of(&self, tag: usize) -> u64 {
        self.last.get(tag).copied().unwrap_or(0)
    }
}

fn invalid(offset: u64, message: impl Into<String>) -> FormatError {
    FormatError::invalid(Position::Byte(offset), message)
}

fn field_name(tag: u64) -> &'static str {
    match tag {
        1 => "sample_type",
        2 => "sample",
        3 => "mapping",
        4 => "location",
        5 => "function",
        6 => "string_table",
        7 => "drop_frames",
        8 => "keep_frames",
        9 => "time_nanos",
        10 => "duration_nanos",
        11 => "period_type",
        12 => "period",
        13 => "comment",
        14 => "default_sample_type",
        15 => "doc_url",
        _ => "unknown field",
    }
}

/// Decodes the top-level message one field at a time, so an error names the field's byte offset.
/// Merging field by field is exactly protobuf's semantics for a concatenated message.
pub(super) fn message_from_bytes(bytes: &[u8]) -> Result<(proto::Profile, Offsets), FormatError> {
    let mut message = proto::Profile::default();
    let mut offsets = Offsets::default();
    let mut pos = 0usize;
    while pos < bytes.len() {
        let start = pos as u64;
        let mut rest = &bytes[pos..];
        let key = prost::encoding::decode_varint(&mut rest)
            .map_err(|_| invalid(start, "truncated or over-long field key"))?;
        let (tag, wire) = (key >> 3, key & 7);
        if tag == 0 || tag > u64::from(u32::MAX >> 3) {
            return Err(invalid(
                start,
                format!("field number {tag} is not valid protobuf; this is not a pprof profile"),
            ));
        }
        let need = |rest: &[u8], n: usize| {
            if rest.len() < n {
                Err(invalid(
                    start,
                    format!(
                        "field {tag} ({}) is cut short: it needs {n} bytes, {} remain",
                        field_name(tag),
                        rest.len()
                    ),
                ))
            } else {
                Ok(())
            }
        };
        match wire {
            0 => {
                prost::encoding::decode_varint(&mut rest).map_err(|_| {
                    invalid(start, format!("field {tag} has a truncated varint value"))
                })?;
            }
            1 => {
                need(rest, 8)?;
                rest = &rest[8..];
            }
            2 => {
                let len = prost::encoding::decode_varint(&mut rest)
                    .map_err(|_| invalid(start, format!("field {tag} has a truncated length")))?;
                let len = usize::try_from(len).unwrap_or(usize::MAX);
                need(rest, len)?;
                rest = &rest[len..];
            }
            5 => {
                need(rest, 4)?;
                rest = &rest[4..];
            }
            other => {
                return Err(invalid(
                    start,
                    format!("field {tag} uses wire type {other}, which pprof never writes"),
                ));
            }
        }
        let end = bytes.len() - rest.len();
        message.merge(&bytes[pos..end]).map_err(|e| {
            invalid(
                start,
                format!("field {tag} ({}) is not valid: {e}", field_name(tag)),
            )
        })?;
        match tag {
            2 => offsets.sample.push(start),
            3 => offsets.mapping.push(start),
            4 => offsets.location.push(start),
            5 => offsets.function.push(start),
            1 => offsets.sample_type.push(start),
            6 if offsets.first_string.is_none() => offsets.first_string = Some(start),
            _ => {}
        }
        if let Some(last) = offsets.last.get_mut(tag as usize) {
            *last = start;
        }
        pos = end;
    }
    Ok((message, offsets))
}

/// Decodes and converts a raw (not gzipped) pprof message.
pub(super) fn profile_from_bytes(bytes: &[u8]) -> Result<Profile, FormatError> {
    if super::legacy::is_legacy(bytes) {
        return super::legacy::read(bytes);
    }
    let (message, offsets) = message_from_bytes(bytes)?;
    Converter::new(&message, &offsets)?.convert()
}

/// Mappings whose frames are kernel code. (`[vdso]` is not: it is user-space code the kernel maps
/// into every process, and the recorder and other readers keep its frames native.)
const KERNEL_MAPPINGS: &[&str] = &["[kernel.kallsyms]", "[kernel]", "vmlinux"];
const TID_KEYS: &[&str] = &["thread_id", "tid", "thread.id"];
const NAME_KEYS: &[&str] = &["thread_name", "thread.name", "thread"];
const PID_KEYS: &[&str] = &["pid", "process_id", "process.pid"];
const TIME_KEYS: &[&str] = &["timestamp_ns", "timestamp"];

struct Converter<'a> {
    message: &'a proto::Profile,
    offsets: &'a Offsets,
}

impl<'a> Converter<'a> {
    fn new(message: &'a proto::Profile, offsets: &'a Offsets) -> Result<Self, FormatError> {
        if let Some(first) = message.string_table.first()
            && !first.is_empty()
        {
            return Err(invalid(
                offsets.first_string.unwrap_or(0),
                format!("string_table[0] must be empty but is {first:?}"),
            ));
        }
        Ok(Converter { message, offsets })
    }

    /// The string at `index`, or an error at `offset` naming what referred to it.
    fn string(&self, index: i64, offset: u64, what: &str) -> Result<&'a str, FormatError> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.message.string_table.get(i))
            .map(String::as_str)
            .ok_or_else(|| {
                invalid(
                    offset,
                    format!(
                        "{what} refers to string {index}, but the string table has {} entries",
                        self.message.string_table.len()
                    ),
                )
            })
    }

    fn convert(self) -> Result<Profile, FormatError> {
        let m = self.message;
        let mut types = Vec::with_capacity(m.sample_type.len());
        for (i, t) in m.sample_type.iter().enumerate() {
            let at = self.offsets.sample_type.get(i).copied().unwrap_or(0);
            // Go's allocation types (`alloc_space`, `alloc_objects`) read back as rootline's.
            types.push(SampleType::from_pprof(
                self.string(t.r#type, at, "a sample type")?,
                self.string(t.unit, at, "a sample type's unit")?,
            ));
        }
        let mut profile = Profile::new(types);
        self.metadata(&mut profile)?;
        let mappings = self.mappings(&mut profile)?;
        let functions = self.functions(&mut profile)?;
        let locations = self.locations(&mut profile, &mappings, &functions)?;
        self.samples(&mut profile, &locations)?;
        Ok(profile)
    }

    fn metadata(&self, profile: &mut Profile) -> Result<(), FormatError> {
        let m = self.message;
        let meta = &mut profile.metadata;
        meta.producer = "pprof".into();
        let start = u64::try_from(m.time_nanos).unwrap_or(0);
        meta.start_time_ns = start;
        meta.end_time_ns = start.saturating_add(u64::try_from(m.duration_nanos).unwrap_or(0));
        if let Some(pt) = m.period_type {
            let at = self.offsets.of(11);
            let name = self.string(pt.r#type, at, "the period type")?;
            let unit = self.string(pt.unit, at, "the period unit")?;
            meta.extra
                .insert("pprof.period_type".into(), format!("{name}/{unit}"));
            if unit == "nanoseconds" && m.period > 0 {
                let hz = 1_000_000_000 / m.period;
                if hz > 0 {
                    meta.sample_rate_hz = u32::try_from(hz).ok();
                }
            }
        }
        if m.period != 0 {
            meta.extra
                .insert("pprof.period".into(), m.period.to_string());
        }
        let mut comments = Vec::new();
        for &c in &m.comment {
            comments.push(self.string(c, self.offsets.of(13), "a comment")?.to_owned());
        }
        if !comments.is_empty() {
            meta.extra
                .insert("pprof.comments".into(), comments.join("\n"));
        }
        for (key, index, tag) in [
            ("pprof.drop_frames", m.drop_frames, 7),
            ("pprof.keep_frames", m.keep_frames, 8),
            ("pprof.doc_url", m.doc_url, 15),
        ] {
            let value = self.string(index, self.offsets.of(tag), key)?;
            if !value.is_empty() {
                meta.extra.insert(key.into(), value.to_owned());
            }
        }
        Ok(())
    }

    /// pprof mapping id → (rootline mapping, is a kernel mapping).
    fn mappings(
        &self,
        profile: &mut Profile,
    ) -> Result<HashMap<u64, (MappingId, bool)>, FormatError> {
        let mut out = HashMap::with_capacity(self.message.mapping.len());
        for (i, m) in self.message.mapping.iter().enumerate() {
            let at = self.offsets.mapping.get(i).copied().unwrap_or(0);
            if m.id == 0 {
                return Err(invalid(at, "a mapping has id 0; ids start at 1"));
            }
            let path_text = self.string(m.filename, at, "a mapping's file name")?;
            let build_id = self.string(m.build_id, at, "a mapping's build id")?;
            let kernel = KERNEL_MAPPINGS
                .iter()
                .any(|k| path_text == *k || path_text.starts_with("[kernel"));
            let path = profile.intern_string(path_text);
            let build_id = (!build_id.is_empty()).then(|| profile.intern_string(build_id));
            let id = profile.intern_mapping(Mapping {
                start: m.memory_start,
                end: m.memory_limit,
                file_offset: m.file_offset,
                path,
                build_id,
            });
            if out.insert(m.id, (id, kernel)).is_some() {
                return Err(invalid(at, format!("mapping id {} appears twice", m.id)));
            }
        }
        Ok(out)
    }

    fn functions(
        &self,
        profile: &mut Profile,
    ) -> Result<HashMap<u64, rootline_profile::FunctionId>, FormatError> {
        let mut out = HashMap::with_capacity(self.message.function.len());
        for (i, f) in self.message.function.iter().enumerate() {
            let at = self.offsets.function.get(i).copied().unwrap_or(0);
            if f.id == 0 {
                return Err(invalid(at, "a function has id 0; ids start at 1"));
            }
            let mut name = self.string(f.name, at, "a function's name")?;
            let system_name = self.string(f.system_name, at, "a function's system name")?;
            if name.is_empty() {
                name = system_name;
            }
            let file = self.string(f.filename, at, "a function's file name")?;
            let system_name = (!system_name.is_empty() && system_name != name)
                .then(|| profile.intern_string(system_name));
            let name = profile.intern_string(name);
            let file = (!file.is_empty()).then(|| profile.intern_string(file));
            let id = profile.intern_function(Function {
                system_name,
                ..Function::new(name, file)
            });
            if out.insert(f.id, id).is_some() {
                return Err(invalid(at, format!("function id {} appears twice", f.id)));
            }
        }
        Ok(out)
    }

    /// pprof location id → its frames, innermost (leaf-most) first.
    fn locations(
        &self,
        profile: &mut Profile,
        mappings: &HashMap<u64, (MappingId, bool)>,
        functions: &HashMap<u64, rootline_profile::FunctionId>,
    ) -> Result<HashMap<u64, Vec<FrameId>>, FormatError> {
        let mut out = HashMap::with_capacity(self.message.location.len());
        for (i, loc) in self.message.location.iter().enumerate() {
            let at = self.offsets.location.get(i).copied().unwrap_or(0);
            if loc.id == 0 {
                return Err(invalid(at, "a location has id 0; ids start at 1"));
            }
            let (mapping, kernel) = match loc.mapping_id {
                0 => (None, false),
                id => {
                    let &(m, kernel) = mappings.get(&id).ok_or_else(|| {
                        invalid(
                            at,
                            format!(
                                "location {} refers to mapping {id}, which does not exist",
                                loc.id
                            ),
                        )
                    })?;
                    (Some(m), kernel)
                }
            };
            let base_kind = if kernel {
                FrameKind::Kernel
            } else {
                FrameKind::Native
            };
            let lines = loc.line.len();
            if lines > usize::from(u8::MAX) + 1 {
                return Err(invalid(
                    at,
                    format!(
                        "location {} has {lines} inlined lines; at most 256 are supported",
                        loc.id
                    ),
                ));
            }
            let mut frames = Vec::with_capacity(lines.max(1));
            if lines == 0 {
                let name = format!("0x{:x}", loc.address);
                let name = profile.intern_string(&name);
                let function = profile.intern_function(Function::new(name, None));
                frames.push(profile.intern_frame(Frame {
                    function,
                    mapping,
                    address: loc.address,
                    line: None,
                    inline_depth: 0,
                    kind: base_kind,
                    from_live_memory: false,
                }));
            }
            for (j, line) in loc.line.iter().enumerate() {
                let function = *functions.get(&line.function_id).ok_or_else(|| {
                    invalid(
                        at,
                        format!(
                            "location {} refers to function {}, which does not exist",
                            loc.id, line.function_id
                        ),
                    )
                })?;
                let name = profile.string(profile.function(function).name);
                let kind = if TruncateReason::is_frame_name(name) {
                    FrameKind::Truncated
                } else {
                    base_kind
                };
                let depth = (lines - 1 - j) as u8;
                frames.push(profile.intern_frame(Frame {
                    function,
                    mapping,
                    address: loc.address,
                    line: u32::try_from(line.line).ok().filter(|&l| l > 0),
                    inline_depth: depth,
                    kind,
                    from_live_memory: false,
                }));
            }
            if out.insert(loc.id, frames).is_some() {
                return Err(invalid(at, format!("location id {} appears twice", loc.id)));
            }
        }
        Ok(out)
    }

    fn samples(
        &self,
        profile: &mut Profile,
        locations: &HashMap<u64, Vec<FrameId>>,
    ) -> Result<(), FormatError> {
        let types = self.message.sample_type.len();
        let default_time = profile.metadata.start_time_ns;
        let mut stacks: HashMap<&[u64], rootline_profile::StackId> = HashMap::new();
        let mut frames: Vec<FrameId> = Vec::new();
        let mut empty_marker = None;
        let mut other_keys = std::collections::BTreeSet::new();
        for (i, sample) in self.message.sample.iter().enumerate() {
            let at = self.offsets.sample.get(i).copied().unwrap_or(0);
            if sample.value.len() != types {
                return Err(invalid(
                    at,
                    format!(
                        "sample {i} has {} values but the profile has {types} sample types",
                        sample.value.len()
                    ),
                ));
            }
            let stack = match stacks.get(sample.location_id.as_slice()) {
                Some(&stack) => stack,
                None => {
                    frames.clear();
                    for id in &sample.location_id {
                        let loc = locations.get(id).ok_or_else(|| {
                            invalid(
                                at,
                                format!("sample {i} refers to location {id}, which does not exist"),
                            )
                        })?;
                        frames.extend_from_slice(loc);
                    }
                    if frames.is_empty() {
                        let marker = *empty_marker.get_or_insert_with(|| {
                            profile.intern_truncated(TruncateReason::NoStackInInput)
                        });
                        frames.push(marker);
                    }
                    let stack = profile
                        .intern_stack_root_first(frames.iter().rev().copied())
                        .expect("frames is not empty");
                    stacks.insert(sample.location_id.as_slice(), stack);
                    stack
                }
            };
            let labels = self.labels(sample, at)?;
            other_keys.extend(labels.other_keys.iter().copied());
            let thread = profile.intern_thread(labels.pid, labels.tid);
            if let Some(name) = labels.name {
                profile.set_thread_name(thread, name);
            }
            profile
                .push_sample(
                    labels.time.unwrap_or(default_time),
                    thread,
                    stack,
                    &sample.value,
                )
                .map_err(|e| invalid(at, e.to_string()))?;
        }
        if !other_keys.is_empty() {
            let keys: Vec<&str> = other_keys.into_iter().collect();
            profile
                .metadata
                .extra
                .insert("pprof.dropped_label_keys".into(), keys.join(","));
        }
        Ok(())
    }

    fn labels(&self, sample: &proto::Sample, at: u64) -> Result<Labels<'a>, FormatError> {
        let mut out = Labels::default();
        for label in &sample.label {
            let key = self.string(label.key, at, "a label key")?;
            let text = self.string(label.str, at, "a label value")?;
            let number = if label.str != 0 {
                text.trim().parse::<i64>().ok()
            } else {
                Some(label.num)
            };
            let as_u32 = |n: Option<i64>| n.and_then(|n| u32::try_from(n).ok());
            if TID_KEYS.contains(&key) {
                out.tid = as_u32(number).unwrap_or(out.tid);
            } else if PID_KEYS.contains(&key) {
                out.pid = as_u32(number).unwrap_or(out.pid);
            } else if NAME_KEYS.contains(&key) && label.str != 0 {
                out.name = Some(text);
            } else if TIME_KEYS.contains(&key) {
                let unit = self.string(label.num_unit, at, "a label unit")?;
                if unit.is_empty() || unit == "nanoseconds" {
                    out.time = number.and_then(|n| u64::try_from(n).ok());
                }
            } else if key == super::encode::ALLOCATED_TYPE_KEY {
                // The `[alloc: TYPE]` leaf frame holds it already.
            } else {
                out.other_keys.push(key);
            }
        }
        Ok(out)
    }
}

#[derive(Default)]
struct Labels<'a> {
    pid: u32,
    tid: u32,
    name: Option<&'a str>,
    time: Option<u64>,
    /// Keys of labels the model has no place for.
    other_keys: Vec<&'a str>,
}
