//! speedscope's JSON file format (`.speedscope.json`, schema
//! `https://www.speedscope.app/file-format-schema.json`).
//!
//! A file holds `shared.frames` (name, optional file/line/col) and a list of profiles, each either
//! `evented` (open/close events at times) or `sampled` (stacks of frame indexes with weights), with
//! a unit (`nanoseconds` … `seconds`, `bytes`, `none`).
//!
//! **Reading**: each profile becomes one thread (pid 0, tid = profile index + 1, named after the
//! profile). Evented profiles become one sample per interval between events with a non-empty stack;
//! a close event that does not match the innermost open frame is an error (as in speedscope), frames
//! still open at the end are closed at `endValue` and counted in `speedscope.unclosed_frames`.
//! Values go to one column per kind of unit: time units become `wall` nanoseconds, `bytes` becomes
//! `alloc-bytes`, `none` becomes `samples`.
//!
//! **Writing**: one `sampled` profile per thread, frames shared, weights in the unit of the
//! profile's time column (`nanoseconds`), else its bytes column (`bytes`), else its first column
//! (`none`); a profile with off-CPU time gets one per time column, and one with allocation columns
//! one more per allocation column (`alloc-bytes` in `bytes`, `alloc-count` in `none`), each named
//! `THREAD — COLUMN`. A frame with a code tier and no source file (a .NET method from a perf map) shows
//! its tier in the `file` field, `[OptimizedTier1]`; the reader takes such a `file` back as the
//! tier.

use std::collections::HashMap;
use std::io::{BufRead, Write};

use rootline_profile::{FrameId, FrameKind, Function, Profile, SampleType, StackId, ThreadId};
use serde::{Deserialize, Serialize};
use serde_json::Number;

use crate::error::{FormatError, Position};

/// The schema URL speedscope files declare.
pub const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

#[derive(Debug, Deserialize, Serialize)]
struct File {
    #[serde(rename = "$schema", default)]
    schema: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(
        rename = "activeProfileIndex",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    active_profile_index: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exporter: Option<String>,
    shared: Shared,
    profiles: Vec<SpeedscopeProfile>,
}

#[derive(Debug, Deserialize, Serialize)]
struct Shared {
    frames: Vec<Frame>,
}

#[derive(Debug, Deserialize, Serialize)]
struct Frame {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    line: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    col: Option<f64>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(tag = "type")]
enum SpeedscopeProfile {
    #[serde(rename = "evented")]
    Evented {
        name: String,
        unit: Unit,
        #[serde(rename = "startValue")]
        start_value: f64,
        #[serde(rename = "endValue")]
        end_value: f64,
        events: Vec<Event>,
    },
    #[serde(rename = "sampled")]
    Sampled {
        name: String,
        unit: Unit,
        #[serde(rename = "startValue")]
        start_value: f64,
        #[serde(rename = "endValue")]
        end_value: f64,
        samples: Vec<Vec<Number>>,
        weights: Vec<Number>,
    },
}

#[derive(Debug, Deserialize, Serialize)]
struct Event {
    #[serde(rename = "type")]
    kind: EventKind,
    at: f64,
    frame: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
enum EventKind {
    #[serde(rename = "O")]
    Open,
    #[serde(rename = "C")]
    Close,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
enum Unit {
    Bytes,
    Microseconds,
    Milliseconds,
    Nanoseconds,
    None,
    Seconds,
}

impl Unit {
    /// The sample type values in this unit go to, and the factor to that type's unit.
    fn column(self) -> (SampleType, f64) {
        match self {
            Unit::Nanoseconds => (SampleType::wall_nanoseconds(), 1.0),
            Unit::Microseconds => (SampleType::wall_nanoseconds(), 1e3),
            Unit::Milliseconds => (SampleType::wall_nanoseconds(), 1e6),
            Unit::Seconds => (SampleType::wall_nanoseconds(), 1e9),
            Unit::Bytes => (SampleType::alloc_bytes(), 1.0),
            Unit::None => (SampleType::samples(), 1.0),
        }
    }
}

fn as_f64(n: &Number) -> f64 {
    n.as_f64().unwrap_or(f64::NAN)
}

fn invalid(message: String) -> FormatError {
    FormatError::invalid(Position::Input, message)
}

fn scaled(value: f64, factor: f64, what: &dyn Fn() -> String) -> Result<i64, FormatError> {
    let v = (value * factor).round();
    if v.is_finite() && v.abs() < 9.2e18 {
        Ok(v as i64)
    } else {
        Err(invalid(format!(
            "{}: the value {value} is out of range",
            what()
        )))
    }
}

fn frame_index(value: f64, frames: usize, what: &dyn Fn() -> String) -> Result<usize, FormatError> {
    if value >= 0.0 && value.fract() == 0.0 && value < frames as f64 {
        Ok(value as usize)
    } else {
        Err(invalid(format!(
            "{}: frame index {value} is not one of the {frames} shared frames",
            what()
        )))
    }
}

/// Reads a speedscope file (evented and sampled profiles).
pub fn read(reader: impl BufRead) -> Result<Profile, FormatError> {
    let file: File = serde_json::from_reader(reader).map_err(|e| {
        if e.is_io() {
            return FormatError::Io(e.into());
        }
        FormatError::invalid(
            Position::LineColumn {
                line: e.line() as u64,
                column: e.column() as u64,
            },
            format!("not a speedscope file: {e}"),
        )
    })?;

    let mut types: Vec<SampleType> = Vec::new();
    for p in &file.profiles {
        let unit = match p {
            SpeedscopeProfile::Evented { unit, .. } | SpeedscopeProfile::Sampled { unit, .. } => {
                *unit
            }
        };
        let (t, _) = unit.column();
        if !types.contains(&t) {
            types.push(t);
        }
    }
    let columns = types.len();
    let mut profile = Profile::new(types.clone());
    profile.metadata.producer = match &file.exporter {
        Some(e) => format!("{e} (speedscope file)"),
        None => "speedscope file".into(),
    };
    if let Some(name) = &file.name {
        profile
            .metadata
            .extra
            .insert("speedscope.name".into(), name.clone());
    }

    let frames: Vec<FrameId> = file
        .shared
        .frames
        .iter()
        .map(|f| {
            let name = profile.intern_string(&f.name);
            let tier = f
                .file
                .as_deref()
                .and_then(|s| s.strip_prefix('[')?.strip_suffix(']'))
                .filter(|t| !t.is_empty() && !t.contains(['[', ']', '/']))
                .map(|t| profile.intern_string(t));
            let file_name = match tier {
                Some(_) => None,
                None => f.file.as_deref().map(|s| profile.intern_string(s)),
            };
            let function = profile.intern_function(Function {
                tier,
                ..Function::new(name, file_name)
            });
            profile.intern_frame(rootline_profile::Frame {
                function,
                mapping: None,
                address: 0,
                line: f
                    .line
                    .filter(|l| *l >= 0.0 && *l <= f64::from(u32::MAX))
                    .map(|l| l as u32),
                inline_depth: 0,
                kind: FrameKind::Native,
                from_live_memory: false,
            })
        })
        .collect();

    let mut values = vec![0i64; columns];
    let mut unclosed = 0u64;
    let (mut start_ns, mut end_ns) = (i64::MAX, i64::MIN);
    for (index, p) in file.profiles.iter().enumerate() {
        let what = |detail: String| format!("profile {index} {detail}");
        let (name, unit, start_value, end_value) = match p {
            SpeedscopeProfile::Evented {
                name,
                unit,
                start_value,
                end_value,
                ..
            }
            | SpeedscopeProfile::Sampled {
                name,
                unit,
                start_value,
                end_value,
                ..
            } => (name, *unit, *start_value, *end_value),
        };
        let (sample_type, factor) = unit.column();
        let column = types.iter().position(|t| *t == sample_type).unwrap_or(0);
        let time_factor = if sample_type.unit == "nanoseconds" {
            factor
        } else {
            0.0
        };
        let thread = profile.intern_thread(0, index as u32 + 1);
        profile.set_thread_name(thread, name);
        let start = scaled(start_value, time_factor, &|| what("startValue".into()))?;
        let end = scaled(end_value, time_factor, &|| what("endValue".into()))?;
        start_ns = start_ns.min(start);
        end_ns = end_ns.max(end);
        let mut push = |profile: &mut Profile, time: i64, stack: StackId, value: i64| {
            values.iter_mut().for_each(|v| *v = 0);
            values[column] = value;
            profile
                .push_sample(time.max(0) as u64, thread, stack, &values)
                .map_err(|e| invalid(e.to_string()))
        };
        match p {
            SpeedscopeProfile::Sampled {
                samples, weights, ..
            } => {
                if samples.len() != weights.len() {
                    return Err(invalid(what(format!(
                        "has {} samples but {} weights",
                        samples.len(),
                        weights.len()
                    ))));
                }
                let mut at = start_value;
                for (i, (stack, weight)) in samples.iter().zip(weights).enumerate() {
                    let here = || what(format!("sample {i}"));
                    let weight = as_f64(weight);
                    let mut parent = None;
                    for f in stack {
                        let f = frame_index(as_f64(f), frames.len(), &here)?;
                        parent = Some(profile.intern_stack(parent, frames[f]));
                    }
                    let time = scaled(at, time_factor, &here)?;
                    at += weight;
                    let value = scaled(weight, factor, &here)?;
                    if let Some(stack) = parent {
                        push(&mut profile, time, stack, value)?;
                    }
                }
            }
            SpeedscopeProfile::Evented { events, .. } => {
                let mut open: Vec<(usize, StackId)> = Vec::new();
                let mut last = start_value;
                for (i, event) in events.iter().enumerate() {
                    let here = || what(format!("event {i}"));
                    let f = frame_index(event.frame, frames.len(), &here)?;
                    if event.at < last {
                        return Err(invalid(
                            here()
                                + &format!(
                                    ": time {} is before the previous event's {last}",
                                    event.at
                                ),
                        ));
                    }
                    if let Some(&(_, stack)) = open.last()
                        && event.at > last
                    {
                        let time = scaled(last, time_factor, &here)?;
                        let value = scaled(event.at - last, factor, &here)?;
                        push(&mut profile, time, stack, value)?;
                    }
                    last = event.at;
                    match event.kind {
                        EventKind::Open => {
                            let parent = open.last().map(|&(_, s)| s);
                            open.push((f, profile.intern_stack(parent, frames[f])));
                        }
                        EventKind::Close => match open.last() {
                            Some(&(top, _)) if top == f => {
                                open.pop();
                            }
                            Some(&(top, _)) => {
                                return Err(invalid(
                                    here()
                                        + &format!(
                                            ": closes frame {:?} while {:?} is the innermost open frame",
                                            file.shared.frames[f].name,
                                            file.shared.frames[top].name
                                        ),
                                ));
                            }
                            None => {
                                return Err(invalid(
                                    here()
                                        + &format!(
                                            ": closes frame {:?} but no frame is open",
                                            file.shared.frames[f].name
                                        ),
                                ));
                            }
                        },
                    }
                }
                if let Some(&(_, stack)) = open.last() {
                    unclosed += open.len() as u64;
                    if end_value > last {
                        let here = || what("end".into());
                        let time = scaled(last, time_factor, &here)?;
                        let value = scaled(end_value - last, factor, &here)?;
                        push(&mut profile, time, stack, value)?;
                    }
                }
            }
        }
    }
    if start_ns <= end_ns {
        profile.metadata.start_time_ns = start_ns.max(0) as u64;
        profile.metadata.end_time_ns = end_ns.max(0) as u64;
    }
    if unclosed > 0 {
        let extra = &mut profile.metadata.extra;
        extra.insert("speedscope.unclosed_frames".into(), unclosed.to_string());
        extra.insert(
            format!("{}speedscope.unclosed_frames", crate::WARNING_PREFIX),
            format!("{unclosed} frame(s) were never closed; they were closed at endValue"),
        );
    }
    Ok(profile)
}

/// The column written and its speedscope unit.
fn weight_column(profile: &Profile) -> Option<(usize, Unit)> {
    let types = profile.sample_types();
    if let Some(c) = crate::chromium::time_column(profile) {
        return Some((c, Unit::Nanoseconds));
    }
    if let Some(c) = types.iter().position(|t| t.unit == "bytes") {
        return Some((c, Unit::Bytes));
    }
    (!types.is_empty()).then_some((0, Unit::None))
}

/// A view: its column and unit (None: each sample weighs 1), its unit, and its name when there
/// are several.
type View<'a> = (Option<(usize, Unit)>, Unit, Option<&'a str>);

/// The views written, each a set of per-thread profiles: one per time column (`cpu`, `off_cpu`,
/// `wall`, named in the profile names) when the profile has off-CPU time, else the one column of
/// [`weight_column`]; and, when the profile has allocation columns (`alloc-bytes`, `alloc-count`),
/// one more per allocation column, all named.
fn views(profile: &Profile) -> Vec<View<'_>> {
    let types = profile.sample_types();
    let allocs: Vec<View<'_>> = types
        .iter()
        .enumerate()
        .filter(|(_, t)| **t == SampleType::alloc_bytes() || **t == SampleType::alloc_count())
        .map(|(c, t)| {
            let unit = if t.unit == "bytes" {
                Unit::Bytes
            } else {
                Unit::None
            };
            (Some((c, unit)), unit, Some(t.name.as_str()))
        })
        .collect();
    let mut views = time_views(profile);
    if allocs.is_empty() {
        return views;
    }
    if let [(column, _, name @ None)] = &mut views[..] {
        match column {
            // No time column: the allocation views are the whole file.
            Some((c, _))
                if allocs
                    .iter()
                    .any(|(a, _, _)| a.map(|(ac, _)| ac) == Some(*c)) =>
            {
                views.clear();
            }
            Some((c, _)) => *name = Some(types[*c].name.as_str()),
            None => views.clear(),
        }
    }
    views.extend(allocs);
    views
}

/// The time views of [`views`]: one per time column when the profile has off-CPU time, else the
/// one column of [`weight_column`], unnamed.
fn time_views(profile: &Profile) -> Vec<View<'_>> {
    let types = profile.sample_types();
    let has_off_cpu = types
        .iter()
        .any(|t| t.name == "off_cpu" && t.unit == "nanoseconds");
    if has_off_cpu {
        return types
            .iter()
            .enumerate()
            .filter(|(_, t)| t.unit == "nanoseconds")
            .map(|(c, t)| {
                (
                    Some((c, Unit::Nanoseconds)),
                    Unit::Nanoseconds,
                    Some(t.name.as_str()),
                )
            })
            .collect();
    }
    let column = weight_column(profile);
    vec![(column, column.map_or(Unit::None, |(_, u)| u), None)]
}

fn thread_label(profile: &Profile, thread: ThreadId) -> String {
    let t = profile.thread(thread);
    match (profile.thread_name(thread), profile.process_name(t.pid)) {
        (Some(name), _) => format!("{name} (pid {}, tid {})", t.pid, t.tid),
        (None, Some(process)) => format!("{process} (pid {}, tid {})", t.pid, t.tid),
        (None, None) => format!("pid {}, tid {}", t.pid, t.tid),
    }
}

/// Writes `profile` as a speedscope file: one `sampled` profile per thread, frames shared.
pub fn write(profile: &Profile, writer: impl Write) -> Result<(), FormatError> {
    write_titled(profile, None, writer)
}

/// Writes `profile` as [`write`] does, with `title` as the file's name (speedscope shows it in its
/// toolbar and window title); `None` names it after the profile's producer.
pub fn write_titled(
    profile: &Profile,
    title: Option<&str>,
    writer: impl Write,
) -> Result<(), FormatError> {
    let samples = profile.samples();
    let views = views(profile);

    let mut frame_index: HashMap<FrameId, usize> = HashMap::new();
    let mut frames: Vec<Frame> = Vec::new();
    let mut per_thread: Vec<Vec<usize>> = vec![Vec::new(); profile.threads().len()];
    for (i, t) in samples.threads.iter().enumerate() {
        per_thread[t.index()].push(i);
    }
    let mut stack_cache: HashMap<StackId, Vec<Number>> = HashMap::new();
    let mut root_first = Vec::new();
    let mut profiles = Vec::new();
    for list in per_thread.iter_mut() {
        list.sort_by_key(|&i| samples.times[i]);
    }
    for &(column, unit, suffix) in &views {
        for (t, list) in per_thread.iter().enumerate() {
            if list.is_empty() {
                continue;
            }
            let mut stacks = Vec::with_capacity(list.len());
            let mut weights = Vec::with_capacity(list.len());
            let mut total = 0i64;
            for &i in list.iter() {
                let weight = column.map_or(1, |(c, _)| samples.values[c][i]);
                if weight == 0 && suffix.is_some() {
                    continue; // e.g. an off-CPU sample in the CPU view
                }
                let stack = samples.stacks[i];
                let indexes = stack_cache.entry(stack).or_insert_with(|| {
                    profile.stack_frames_root_first(stack, &mut root_first);
                    root_first
                        .iter()
                        .map(|&f| {
                            Number::from(*frame_index.entry(f).or_insert_with(|| {
                                let frame = profile.frame(f);
                                let function = profile.function(frame.function);
                                frames.push(Frame {
                                    name: profile.string(function.name).to_owned(),
                                    file: match (function.file, function.tier) {
                                        (Some(file), _) => Some(profile.string(file).to_owned()),
                                        (None, Some(tier)) => {
                                            Some(format!("[{}]", profile.string(tier)))
                                        }
                                        (None, None) => None,
                                    },
                                    line: frame.line.map(f64::from),
                                    col: None,
                                });
                                frames.len() - 1
                            }) as u64)
                        })
                        .collect()
                });
                total = total.saturating_add(weight);
                stacks.push(indexes.clone());
                weights.push(Number::from(weight));
            }
            if stacks.is_empty() {
                continue;
            }
            let label = thread_label(profile, ThreadId(t as u32));
            profiles.push(SpeedscopeProfile::Sampled {
                name: match suffix {
                    Some(s) => format!("{label} — {s}"),
                    None => label,
                },
                unit,
                start_value: 0.0,
                end_value: total as f64,
                samples: stacks,
                weights,
            });
        }
    }
    let name = match title {
        Some(title) => title.to_owned(),
        None if profile.metadata.producer.is_empty() => "rootline profile".to_owned(),
        None => format!("rootline profile ({})", profile.metadata.producer),
    };
    let file = File {
        schema: Some(SCHEMA.to_owned()),
        name: Some(name),
        active_profile_index: Some(0.0),
        exporter: Some(format!("rootline@{}", env!("CARGO_PKG_VERSION"))),
        shared: Shared { frames },
        profiles,
    };
    let mut w = std::io::BufWriter::new(writer);
    serde_json::to_writer(&mut w, &file).map_err(|e| FormatError::Io(e.into()))?;
    w.write_all(b"\n")?;
    w.flush()?;
    Ok(())
}
