//! OpenTelemetry profiles (`.otlp.pb`): a binary `ExportProfilesServiceRequest` of OTLP profiles
//! proto v1.10 (`v1development`), as an OTLP collector receives it. Write only.
//!
//! The request holds one resource (host, command line, and the pid when the profile covers one
//! process) with one scope (`rootline`) and one OTLP `Profile` per sample type, since an OTLP profile
//! carries a single value type. All profiles share the request's dictionary; every dictionary table
//! starts with its zero value and stores each row once, keyed by all of its fields.
//!
//! - A stack is a `Stack` of location indexes, leaf first. Frames inlined at one address share one
//!   `Location` whose `lines` run from the innermost inlined function to the physical caller;
//!   name-only (address 0) frames each get their own location.
//! - Each location carries the frame's kind as the `profile.frame.type` attribute (OpenTelemetry
//!   semantic conventions: `native`, `kernel`, `dotnet` for managed frames; rootline's own `jit`,
//!   `pseudo` and `truncated` for kinds the conventions do not name).
//! - Samples of one thread and stack form one OTLP `Sample` whose `values` and
//!   `timestamps_unix_nano` list every event, in order. Threads are the sample attributes
//!   `thread.id`, `thread.name` and `process.pid`. Times are written as the profile holds them
//!   (Unix nanoseconds when the producer recorded wall-clock time).
//! - Mappings carry their GNU build id as `process.executable.build_id.gnu`.
//! - A function's `system_name` is the name its runtime wrote (a CoreCLR perf map's whole line),
//!   else its name. The code tier of a location's physical frame (`QuickJitted`,
//!   `OptimizedTier1OSR`, `ReadyToRun`, …) is the location attribute `rootline.code_tier`: the
//!   semantic conventions have no attribute for it, so it carries rootline's prefix.
//! - An allocation sample (its stack's leaf is `[alloc: TYPE]`) carries TYPE as the sample
//!   attribute `rootline.allocated_type` (pprof's `allocated_type` label), so a back end can break
//!   the allocation profiles down by type without parsing frame names.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, InstrumentationScope, KeyValue, any_value::Value,
};
use opentelemetry_proto::tonic::profiles::v1development as pb;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use rootline_profile::{Frame, FrameKind, Profile, StackId, ThreadId};

use crate::error::FormatError;
use crate::pprof::encode::{is_address_only, location_span, period_of};

/// The OTLP profiles proto release this writer follows.
pub const PROTO_VERSION: &str = "1.10.0";

/// The `profile.frame.type` value written for a frame kind.
pub fn frame_type(kind: FrameKind) -> &'static str {
    match kind {
        FrameKind::Native => "native",
        FrameKind::Kernel => "kernel",
        FrameKind::Managed => "dotnet",
        FrameKind::Jit => "jit",
        FrameKind::Pseudo => "pseudo",
        FrameKind::Truncated => "truncated",
    }
}

/// Writes `profile` as a binary `ExportProfilesServiceRequest`.
pub fn write(profile: &Profile, mut writer: impl Write) -> Result<(), FormatError> {
    writer.write_all(&to_request(profile).encode_to_vec())?;
    writer.flush()?;
    Ok(())
}

/// The sample attribute holding the type an allocation sample allocated.
pub const ALLOCATED_TYPE_ATTRIBUTE: &str = "rootline.allocated_type";

/// The location attribute holding the code tier of the location's physical frame.
pub const CODE_TIER_ATTRIBUTE: &str = "rootline.code_tier";

/// An attribute value as a hashable dictionary key.
#[derive(Clone, PartialEq, Eq, Hash)]
enum AttrValue {
    Str(String),
    Int(i64),
}

/// The shared dictionary under construction; each table starts with its zero value.
struct Dictionary {
    strings: Vec<String>,
    string_index: HashMap<String, i32>,
    mappings: Vec<pb::Mapping>,
    mapping_index: HashMap<pb::Mapping, i32>,
    functions: Vec<pb::Function>,
    function_index: HashMap<pb::Function, i32>,
    locations: Vec<pb::Location>,
    location_index: HashMap<(i32, u64, Vec<pb::Line>, Vec<i32>), i32>,
    attributes: Vec<pb::KeyValueAndUnit>,
    attribute_index: HashMap<(i32, AttrValue, i32), i32>,
    stacks: Vec<pb::Stack>,
    stack_index: HashMap<Vec<i32>, i32>,
}

fn index_of(len: usize) -> i32 {
    i32::try_from(len).expect("an OTLP dictionary table exceeds i32::MAX rows")
}

impl Dictionary {
    fn new() -> Dictionary {
        let mut d = Dictionary {
            strings: Vec::new(),
            string_index: HashMap::new(),
            mappings: vec![pb::Mapping::default()],
            mapping_index: HashMap::from([(pb::Mapping::default(), 0)]),
            functions: vec![pb::Function::default()],
            function_index: HashMap::from([(pb::Function::default(), 0)]),
            locations: vec![pb::Location::default()],
            location_index: HashMap::from([((0, 0, Vec::new(), Vec::new()), 0)]),
            attributes: vec![pb::KeyValueAndUnit::default()],
            attribute_index: HashMap::new(),
            stacks: vec![pb::Stack::default()],
            stack_index: HashMap::from([(Vec::new(), 0)]),
        };
        d.string("");
        d
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.string_index.get(s) {
            return i;
        }
        let i = index_of(self.strings.len());
        self.strings.push(s.to_owned());
        self.string_index.insert(s.to_owned(), i);
        i
    }

    fn attribute(&mut self, key: &str, value: AttrValue) -> i32 {
        let key = self.string(key);
        let full = (key, value, 0);
        if let Some(&i) = self.attribute_index.get(&full) {
            return i;
        }
        let i = index_of(self.attributes.len());
        let any = match &full.1 {
            AttrValue::Str(s) => Value::StringValue(s.clone()),
            AttrValue::Int(n) => Value::IntValue(*n),
        };
        self.attributes.push(pb::KeyValueAndUnit {
            key_strindex: key,
            value: Some(AnyValue { value: Some(any) }),
            unit_strindex: 0,
        });
        self.attribute_index.insert(full, i);
        i
    }

    fn intern<T: Clone + Eq + Hash>(rows: &mut Vec<T>, index: &mut HashMap<T, i32>, row: T) -> i32 {
        if let Some(&i) = index.get(&row) {
            return i;
        }
        let i = index_of(rows.len());
        rows.push(row.clone());
        index.insert(row, i);
        i
    }

    fn mapping(&mut self, profile: &Profile, frame: &Frame) -> i32 {
        let Some(id) = frame.mapping else {
            return 0;
        };
        let m = profile.mapping(id);
        let attribute_indices = match m.build_id {
            Some(b) => vec![self.attribute(
                "process.executable.build_id.gnu",
                AttrValue::Str(profile.string(b).to_owned()),
            )],
            None => Vec::new(),
        };
        let row = pb::Mapping {
            memory_start: m.start,
            memory_limit: m.end,
            file_offset: m.file_offset,
            filename_strindex: self.string(profile.string(m.path)),
            attribute_indices,
        };
        Self::intern(&mut self.mappings, &mut self.mapping_index, row)
    }

    fn function(&mut self, profile: &Profile, frame: &Frame) -> i32 {
        let f = profile.function(frame.function);
        let name = self.string(profile.string(f.name));
        let system_name = f
            .system_name
            .map_or(name, |s| self.string(profile.string(s)));
        let row = pb::Function {
            name_strindex: name,
            system_name_strindex: system_name,
            filename_strindex: f.file.map_or(0, |file| self.string(profile.string(file))),
            start_line: 0,
        };
        Self::intern(&mut self.functions, &mut self.function_index, row)
    }

    /// The location of `group` (a physical frame and the frames inlined into it, leaf first).
    fn location(&mut self, profile: &Profile, group: &[Frame]) -> i32 {
        let physical = group[group.len() - 1];
        let mapping = self.mapping(profile, &physical);
        let lines: Vec<pb::Line> = group
            .iter()
            .filter(|f| !is_address_only(profile, f))
            .map(|f| pb::Line {
                function_index: self.function(profile, f),
                line: f.line.map_or(0, i64::from),
                column: 0,
            })
            .collect();
        let mut attributes = vec![self.attribute(
            "profile.frame.type",
            AttrValue::Str(frame_type(physical.kind).into()),
        )];
        if let Some(tier) = profile.function(physical.function).tier {
            attributes.push(self.attribute(
                CODE_TIER_ATTRIBUTE,
                AttrValue::Str(profile.string(tier).to_owned()),
            ));
        }
        let key = (mapping, physical.address, lines, attributes);
        if let Some(&i) = self.location_index.get(&key) {
            return i;
        }
        let i = index_of(self.locations.len());
        self.locations.push(pb::Location {
            mapping_index: key.0,
            address: key.1,
            lines: key.2.clone(),
            attribute_indices: key.3.clone(),
        });
        self.location_index.insert(key, i);
        i
    }

    fn stack(&mut self, profile: &Profile, stack: StackId) -> i32 {
        let frames: Vec<Frame> = profile
            .stack_frames(stack)
            .map(|f| *profile.frame(f))
            .collect();
        let mut indices = Vec::new();
        let mut rest = frames.as_slice();
        while !rest.is_empty() {
            let (group, tail) = rest.split_at(location_span(rest));
            indices.push(self.location(profile, group));
            rest = tail;
        }
        let row = pb::Stack {
            location_indices: indices,
        };
        if let Some(&i) = self.stack_index.get(&row.location_indices) {
            return i;
        }
        let i = index_of(self.stacks.len());
        self.stack_index.insert(row.location_indices.clone(), i);
        self.stacks.push(row);
        i
    }

    fn thread_attributes(&mut self, profile: &Profile, thread: ThreadId) -> Vec<i32> {
        let t = profile.thread(thread);
        let mut out = Vec::new();
        // Thread (0, 0) is the "unknown thread" of formats that have none; it gets no ids.
        if t.pid != 0 || t.tid != 0 {
            out.push(self.attribute("thread.id", AttrValue::Int(i64::from(t.tid))));
            out.push(self.attribute("process.pid", AttrValue::Int(i64::from(t.pid))));
        }
        if let Some(name) = profile.thread_name(thread) {
            out.push(self.attribute("thread.name", AttrValue::Str(name.to_owned())));
        }
        out
    }

    fn finish(self) -> pb::ProfilesDictionary {
        pb::ProfilesDictionary {
            mapping_table: self.mappings,
            location_table: self.locations,
            function_table: self.functions,
            link_table: vec![pb::Link::default()],
            string_table: self.strings,
            attribute_table: self.attributes,
            stack_table: self.stacks,
        }
    }
}

fn key_value(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    }
}

fn resource(profile: &Profile) -> Resource {
    let meta = &profile.metadata;
    let mut attributes = Vec::new();
    let processes = profile.processes();
    let service = match processes {
        [only] => {
            attributes.push(key_value(
                "process.pid",
                Value::IntValue(i64::from(only.pid)),
            ));
            only.name.map(|n| profile.string(n).to_owned())
        }
        _ => None,
    };
    attributes.push(key_value(
        "service.name",
        Value::StringValue(service.unwrap_or_else(|| "unknown_service".into())),
    ));
    if let Some(host) = &meta.host {
        attributes.push(key_value("host.name", Value::StringValue(host.clone())));
    }
    if let Some(command_line) = &meta.command_line {
        attributes.push(key_value(
            "process.command_line",
            Value::StringValue(command_line.clone()),
        ));
    }
    Resource {
        attributes,
        ..Resource::default()
    }
}

/// A 16-byte, non-zero profile id derived from the profile's content, so equal input gives equal
/// output.
fn profile_id(profile: &Profile, type_index: usize) -> Vec<u8> {
    let mut id = Vec::with_capacity(16);
    for salt in 0u8..2 {
        let mut h = DefaultHasher::new();
        (salt, type_index, &profile.metadata.producer).hash(&mut h);
        profile.metadata.start_time_ns.hash(&mut h);
        profile.samples().times.hash(&mut h);
        profile.samples().stacks.hash(&mut h);
        id.extend_from_slice(&(h.finish() | 1).to_le_bytes());
    }
    id
}

/// Builds the `ExportProfilesServiceRequest` for `profile`.
pub fn to_request(profile: &Profile) -> ExportProfilesServiceRequest {
    let mut dict = Dictionary::new();
    let data = profile.samples();

    // Group the events by (thread, stack), in order of first appearance.
    let mut groups: Vec<(i32, Vec<i32>, Vec<usize>)> = Vec::new();
    let mut group_index: HashMap<(ThreadId, StackId), usize> = HashMap::new();
    let mut stack_index: HashMap<StackId, i32> = HashMap::new();
    for (n, (&thread, &stack)) in data.threads.iter().zip(&data.stacks).enumerate() {
        let g = *group_index.entry((thread, stack)).or_insert_with(|| {
            let s = *stack_index
                .entry(stack)
                .or_insert_with(|| dict.stack(profile, stack));
            let mut attributes = dict.thread_attributes(profile, thread);
            let leaf = profile.frame_name(profile.stack(stack).frame);
            if let Some(ty) = rootline_profile::pseudo::alloc_type_of(leaf) {
                attributes
                    .push(dict.attribute(ALLOCATED_TYPE_ATTRIBUTE, AttrValue::Str(ty.to_owned())));
            }
            groups.push((s, attributes, Vec::new()));
            groups.len() - 1
        });
        groups[g].2.push(n);
    }

    let meta = &profile.metadata;
    let (period_name, period_unit, period) = period_of(profile);
    let period_type = pb::ValueType {
        type_strindex: dict.string(period_name),
        unit_strindex: dict.string(period_unit),
    };
    let columns: Vec<Option<usize>> = if profile.sample_types().is_empty() {
        vec![None]
    } else {
        (0..profile.sample_types().len()).map(Some).collect()
    };
    let mut profiles = Vec::with_capacity(columns.len());
    for column in columns {
        let sample_type = column.map(|c| {
            let t = &profile.sample_types()[c];
            pb::ValueType {
                type_strindex: dict.string(t.pprof_name()),
                unit_strindex: dict.string(&t.unit),
            }
        });
        let samples = groups
            .iter()
            .map(|(stack, attributes, events)| pb::Sample {
                stack_index: *stack,
                attribute_indices: attributes.clone(),
                link_index: 0,
                values: column.map_or_else(Vec::new, |c| {
                    events.iter().map(|&n| data.values[c][n]).collect()
                }),
                timestamps_unix_nano: events.iter().map(|&n| data.times[n]).collect(),
            })
            .collect();
        profiles.push(pb::Profile {
            sample_type,
            samples,
            time_unix_nano: meta.start_time_ns,
            duration_nano: meta.end_time_ns.saturating_sub(meta.start_time_ns),
            period_type: Some(period_type),
            period,
            profile_id: profile_id(profile, column.unwrap_or(0)),
            ..pb::Profile::default()
        });
    }

    ExportProfilesServiceRequest {
        resource_profiles: vec![pb::ResourceProfiles {
            resource: Some(resource(profile)),
            scope_profiles: vec![pb::ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "rootline".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..InstrumentationScope::default()
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(dict.finish()),
    }
}
