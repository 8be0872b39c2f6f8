//! Merging one decoded chunk into a [`Profile`], checking every id before it is used.
//!
//! Rows go through the profile's public `intern_*` methods, so the merged profile keeps all of its
//! invariants; each intern must return exactly the id the file says the row has (a repeated row or a
//! gap is an error). A chunk is merged completely or not at all: on any error the profile is
//! restored to its state before the chunk.

use super::schema;
use crate::ids::{FrameId, FunctionId, MappingId, StackId, StringId, ThreadId};
use crate::metadata::Metadata;
use crate::model::{Frame, FrameKind, Function, Mapping, SampleType};
use crate::profile::Profile;

type Result<T> = std::result::Result<T, String>;

/// Merges `chunk` into `profile` (created from the chunk's sample types when `None`). Returns the
/// number of samples added, or a description of the first inconsistency.
pub(super) fn apply_chunk(profile: &mut Option<Profile>, chunk: schema::Chunk) -> Result<usize> {
    let types: Vec<SampleType> = chunk
        .sample_types
        .iter()
        .map(|t| SampleType::new(t.name.clone(), t.unit.clone()))
        .collect();
    match profile {
        None => {
            let mut fresh = Profile::with_empty_tables(types);
            let samples = apply_rows(&mut fresh, chunk)?;
            *profile = Some(fresh);
            Ok(samples)
        }
        Some(existing) => {
            if !types.is_empty() && types.as_slice() != existing.sample_types() {
                return Err("sample types differ from those of the first chunk".into());
            }
            let checkpoint = existing.checkpoint();
            let result = apply_rows(existing, chunk);
            if result.is_err() {
                existing.restore(checkpoint);
            }
            result
        }
    }
}

fn apply_rows(p: &mut Profile, c: schema::Chunk) -> Result<usize> {
    base("string", c.first_string, p.strings().len())?;
    for s in &c.strings {
        let expected = p.strings().len();
        fresh("string", p.intern_string(s).0, expected)?;
    }

    base("mapping", c.first_mapping, p.mappings().len())?;
    for m in &c.mappings {
        let mapping = Mapping {
            start: m.start,
            end: m.end,
            file_offset: m.file_offset,
            path: string_id(p, m.path)?,
            build_id: m.build_id.map(|s| string_id(p, s)).transpose()?,
        };
        let expected = p.mappings().len();
        fresh("mapping", p.intern_mapping(mapping).0, expected)?;
    }

    base("function", c.first_function, p.functions().len())?;
    for f in &c.functions {
        let function = Function {
            name: string_id(p, f.name)?,
            file: f.file.map(|s| string_id(p, s)).transpose()?,
            system_name: f.system_name.map(|s| string_id(p, s)).transpose()?,
            tier: f.tier.map(|s| string_id(p, s)).transpose()?,
        };
        let expected = p.functions().len();
        fresh("function", p.intern_function(function).0, expected)?;
    }

    base("frame", c.first_frame, p.frames().len())?;
    for f in &c.frames {
        let frame = Frame {
            function: FunctionId(check("function", f.function, p.functions().len())?),
            mapping: f
                .mapping
                .map(|m| check("mapping", m, p.mappings().len()).map(MappingId))
                .transpose()?,
            address: f.address,
            line: f.line,
            inline_depth: u8::try_from(f.inline_depth)
                .map_err(|_| format!("frame inline depth {} exceeds 255", f.inline_depth))?,
            kind: u8::try_from(f.kind)
                .ok()
                .and_then(FrameKind::from_u8)
                .ok_or_else(|| format!("unknown frame kind {}", f.kind))?,
            from_live_memory: f.from_live_memory,
        };
        let expected = p.frames().len();
        fresh("frame", p.intern_frame(frame).0, expected)?;
    }

    base("stack", c.first_stack, p.stacks().len())?;
    if c.stack_parents.len() != c.stack_frames.len() {
        return Err(format!(
            "{} stack parents but {} stack frames",
            c.stack_parents.len(),
            c.stack_frames.len()
        ));
    }
    for (&back, &frame) in c.stack_parents.iter().zip(&c.stack_frames) {
        let expected = p.stacks().len();
        let id = u32::try_from(expected).map_err(|_| "stack table overflows u32".to_string())?;
        let parent = match back {
            0 => None,
            back => Some(StackId(id.checked_sub(back).ok_or_else(|| {
                format!("stack node {id} names a parent {back} nodes before the first")
            })?)),
        };
        let frame = FrameId(check("frame", frame, p.frames().len())?);
        fresh("stack", p.intern_stack(parent, frame).0, expected)?;
    }

    for t in &c.threads {
        let len = p.threads().len();
        if t.id as usize == len {
            fresh("thread", p.intern_thread(t.pid, t.tid).0, len)?;
        } else {
            let id = check("thread", t.id, len)?;
            let existing = p.thread(ThreadId(id));
            if (existing.pid, existing.tid) != (t.pid, t.tid) {
                return Err(format!(
                    "thread {id} is ({}, {}) but the chunk says ({}, {})",
                    existing.pid, existing.tid, t.pid, t.tid
                ));
            }
        }
        let name = t.name.map(|s| string_id(p, s)).transpose()?;
        p.set_thread_name_id(ThreadId(t.id), name)
            .map_err(|e| e.to_string())?;
    }

    for proc in &c.processes {
        let name = proc.name.map(|s| string_id(p, s)).transpose()?;
        let command_line = proc.command_line.map(|s| string_id(p, s)).transpose()?;
        let process = p.intern_process(proc.pid);
        process.name = name;
        process.command_line = command_line;
    }

    let samples = match &c.samples {
        Some(samples) => apply_samples(p, samples)?,
        None => 0,
    };
    if let Some(m) = c.metadata {
        p.metadata = metadata_from_schema(m);
    }
    Ok(samples)
}

fn apply_samples(p: &mut Profile, s: &schema::Samples) -> Result<usize> {
    let n = s.time_deltas.len();
    let types = p.sample_types().len();
    if s.threads.len() != n || s.stacks.len() != n {
        return Err(format!(
            "sample columns differ in length: {n} times, {} threads, {} stacks",
            s.threads.len(),
            s.stacks.len()
        ));
    }
    if s.values.len() != types && !(n == 0 && s.values.is_empty()) {
        return Err(format!(
            "{} value columns but {types} sample types",
            s.values.len()
        ));
    }
    if let Some(column) = s.values.iter().find(|c| c.deltas.len() != n) {
        return Err(format!(
            "a value column has {} entries for {n} samples",
            column.deltas.len()
        ));
    }
    let mut time = 0u64;
    let mut values = vec![0i64; types];
    for i in 0..n {
        time = time.wrapping_add(s.time_deltas[i] as u64);
        for (value, column) in values.iter_mut().zip(&s.values) {
            *value = value.wrapping_add(column.deltas[i]);
        }
        p.push_sample(time, ThreadId(s.threads[i]), StackId(s.stacks[i]), &values)
            .map_err(|e| format!("sample {i}: {e}"))?;
    }
    Ok(n)
}

/// The chunk's first id for `table` must equal the rows already merged.
fn base(table: &str, first: u32, len: usize) -> Result<()> {
    if first as usize == len {
        Ok(())
    } else {
        Err(format!(
            "chunk's first {table} id is {first} but {len} {table} rows precede it"
        ))
    }
}

/// An intern call must have appended a new row (not found an equal earlier one).
fn fresh(table: &str, got: u32, expected: usize) -> Result<()> {
    if got as usize == expected {
        Ok(())
    } else {
        Err(format!(
            "{table} {expected} repeats {table} {got} (rows must be distinct)"
        ))
    }
}

fn check(table: &str, id: u32, len: usize) -> Result<u32> {
    if (id as usize) < len {
        Ok(id)
    } else {
        Err(format!("{table} id {id} is out of range ({len} rows)"))
    }
}

fn string_id(p: &Profile, id: u32) -> Result<StringId> {
    check("string", id, p.strings().len()).map(StringId)
}

fn metadata_from_schema(m: schema::Metadata) -> Metadata {
    Metadata {
        producer: m.producer,
        start_time_ns: m.start_time_ns,
        end_time_ns: m.end_time_ns,
        host: m.host,
        command_line: m.command_line,
        sample_rate_hz: m.sample_rate_hz,
        depth_cap: m.depth_cap,
        lost_samples: m.lost_samples,
        dropped_samples: m.dropped_samples,
        truncated_samples: m.truncated_samples,
        extra: m.extra,
    }
}
