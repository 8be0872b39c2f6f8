//! Reading trace-event JSON: walking the document and handing events to per-thread timelines.

use std::collections::HashMap;

use rustc_hash::FxHashMap;
use std::io::Read;

mod build;
mod fields;

use fields::{Field, id_value, sf_value, string_field};

use super::scan::{Decimal, Kind, Scanner};
use super::timeline::{Action, Context, Counters, KeyTrie, Sink, StackRef, Timeline};
use crate::error::{FormatError, Position};

/// The name of a slice that has none (as speedscope shows it).
const UNNAMED: &str = "(unnamed)";

/// Marks "no `sf`" in a frame key.
const NO_SF: u32 = u32::MAX;

/// One `stackFrames` entry.
#[derive(Debug)]
struct SfDef {
    /// Interned name (index into the reader's names).
    name: u32,
    /// Interned category.
    category: u32,
    parent: Option<u32>,
}

/// The fields of one event (or `samples` entry) that matter, reused between events.
#[derive(Debug, Default)]
struct Event {
    ph: u8,
    name: String,
    has_name: bool,
    sample_event: bool,
    ts: Option<Decimal>,
    dur: Option<Decimal>,
    tdur: Option<Decimal>,
    weight: Option<Decimal>,
    pid: u32,
    tid: u32,
    sf: String,
    has_sf: bool,
    args_name: String,
    has_args_name: bool,
}

impl Event {
    fn reset(&mut self) {
        self.ph = 0;
        self.name.clear();
        self.has_name = false;
        self.sample_event = false;
        self.ts = None;
        self.dur = None;
        self.tdur = None;
        self.weight = None;
        self.pid = 0;
        self.tid = 0;
        self.sf.clear();
        self.has_sf = false;
        self.args_name.clear();
        self.has_args_name = false;
    }
}

/// The reader's state while walking the document.
#[derive(Default)]
pub(super) struct TraceReader {
    trie: KeyTrie,
    sink: Sink,
    counters: Counters,
    keys: Vec<(u32, u32)>,
    key_index: FxHashMap<(u32, u32), u32>,
    names: Vec<Box<str>>,
    name_index: FxHashMap<Box<str>, u32>,
    sf_index: FxHashMap<Box<str>, u32>,
    /// `sf` index per small integer id.
    sf_dense: Vec<u32>,
    /// Frame key per `sf` index, once an event used it.
    sf_key: Vec<u32>,
    sf_defs: Vec<Option<SfDef>>,
    threads: Vec<(u32, u32)>,
    thread_index: FxHashMap<(u32, u32), u32>,
    timelines: Vec<Timeline>,
    thread_names: HashMap<(u32, u32), String>,
    process_names: HashMap<u32, String>,
    /// Power of ten from the file's `ts` unit to nanoseconds (3: µs, 6: ms), once known.
    scale: Option<i32>,
    sample_event_dialect: bool,
    dotnet: bool,
    declared_producer: Option<String>,
    declared_depth_cap: Option<u32>,
    order: u64,
    x_seq: u64,
    start: Option<i64>,
    end: i64,
    slice_samples: bool,
    point_samples: bool,
    ev: Event,
}

impl TraceReader {
    /// Reads the whole document from `sc`.
    pub(super) fn read_document<R: Read>(
        &mut self,
        sc: &mut Scanner<R>,
    ) -> Result<(), FormatError> {
        match sc.peek()? {
            None => return Err(FormatError::invalid(Position::Byte(0), "the file is empty")),
            Some(b'[') => self.read_events(sc, true)?,
            Some(b'{') => {
                sc.begin_object()?;
                let mut first = true;
                while sc.next_key(&mut first)? {
                    match sc.text.as_bytes() {
                        b"traceEvents" => self.read_events(sc, false)?,
                        b"samples" => self.read_samples(sc)?,
                        b"stackFrames" => self.read_stack_frames(sc)?,
                        b"otherData" => self.read_other_data(sc)?,
                        _ => sc.skip_value()?,
                    }
                }
            }
            Some(_) => {
                return Err(
                    sc.error("a trace must start with `{` (object format) or `[` (array format)")
                );
            }
        }
        if sc.peek()?.is_some() {
            return Err(sc.error("unexpected data after the end of the trace"));
        }
        Ok(())
    }

    fn read_events<R: Read>(&mut self, sc: &mut Scanner<R>, top: bool) -> Result<(), FormatError> {
        if sc.kind()? != Kind::Array {
            return Err(sc.error("`traceEvents` must be an array"));
        }
        sc.begin_array()?;
        let mut first = true;
        while sc.next_element(&mut first, top)? {
            let at = sc.offset();
            self.read_event(sc)?;
            self.handle_event(at)?;
        }
        Ok(())
    }

    fn read_samples<R: Read>(&mut self, sc: &mut Scanner<R>) -> Result<(), FormatError> {
        if sc.kind()? != Kind::Array {
            return Err(sc.error("`samples` must be an array"));
        }
        sc.begin_array()?;
        let mut first = true;
        while sc.next_element(&mut first, false)? {
            let at = sc.offset();
            self.read_event(sc)?;
            self.handle_sample(at)?;
        }
        Ok(())
    }

    fn read_event<R: Read>(&mut self, sc: &mut Scanner<R>) -> Result<(), FormatError> {
        if sc.kind()? != Kind::Object {
            return Err(sc.error("each event must be an object"));
        }
        sc.begin_object()?;
        self.ev.reset();
        let ev = &mut self.ev;
        let mut first = true;
        while sc.next_key(&mut first)? {
            match Field::of(sc.text.as_bytes()) {
                Field::Ph => {
                    string_field(sc, "`ph`")?;
                    ev.ph = sc.text.as_bytes().first().copied().unwrap_or(0);
                }
                Field::Name => {
                    string_field(sc, "`name`")?;
                    ev.name.push_str(sc.text_str());
                    ev.has_name = true;
                }
                Field::Cat => {
                    string_field(sc, "`cat`")?;
                    ev.sample_event = sc.text == "sampleEvent";
                }
                Field::Ts => ev.ts = Some(sc.number_or_numeric_string("`ts`")?),
                Field::Dur => ev.dur = Some(sc.number_or_numeric_string("`dur`")?),
                Field::Tdur => ev.tdur = Some(sc.number_or_numeric_string("`tdur`")?),
                Field::Weight => ev.weight = Some(sc.number_or_numeric_string("`weight`")?),
                Field::Pid => ev.pid = id_value(sc, "`pid`")?,
                Field::Tid => ev.tid = id_value(sc, "`tid`")?,
                Field::Sf => {
                    sf_value(sc, &mut ev.sf)?;
                    ev.has_sf = true;
                }
                Field::Args if sc.kind()? == Kind::Object => {
                    sc.begin_object()?;
                    let mut first = true;
                    while sc.next_key(&mut first)? {
                        if sc.text == "name" && sc.kind()? == Kind::String {
                            sc.string()?;
                            ev.args_name.clear();
                            ev.args_name.push_str(sc.text_str());
                            ev.has_args_name = true;
                        } else {
                            sc.skip_value()?;
                        }
                    }
                }
                _ => sc.skip_value()?,
            }
        }
        Ok(())
    }

    fn read_stack_frames<R: Read>(&mut self, sc: &mut Scanner<R>) -> Result<(), FormatError> {
        if sc.kind()? != Kind::Object {
            return Err(sc.error("`stackFrames` must be an object"));
        }
        sc.begin_object()?;
        let mut first = true;
        let mut id = String::new();
        let mut parent = String::new();
        while sc.next_key(&mut first)? {
            id.clear();
            id.push_str(sc.text_str());
            if sc.kind()? != Kind::Object {
                return Err(sc.error("each `stackFrames` entry must be an object"));
            }
            sc.begin_object()?;
            let empty = self.name_of("");
            let mut def = SfDef {
                name: empty,
                category: empty,
                parent: None,
            };
            let mut has_parent = false;
            let mut first_key = true;
            while sc.next_key(&mut first_key)? {
                match sc.text.as_bytes() {
                    b"name" => {
                        string_field(sc, "a stack frame's `name`")?;
                        let text = std::mem::take(&mut sc.text);
                        def.name = self.name_of(&text);
                        sc.text = text;
                    }
                    b"category" => {
                        string_field(sc, "a stack frame's `category`")?;
                        let text = std::mem::take(&mut sc.text);
                        def.category = self.name_of(&text);
                        sc.text = text;
                    }
                    b"parent" => {
                        sf_value(sc, &mut parent)?;
                        has_parent = true;
                    }
                    _ => sc.skip_value()?,
                }
            }
            if has_parent {
                def.parent = Some(self.sf_of(&parent));
            }
            let index = self.sf_of(&id) as usize;
            self.sf_defs[index] = Some(def);
        }
        Ok(())
    }

    fn read_other_data<R: Read>(&mut self, sc: &mut Scanner<R>) -> Result<(), FormatError> {
        if sc.kind()? != Kind::Object {
            return sc.skip_value();
        }
        sc.begin_object()?;
        let mut first = true;
        while sc.next_key(&mut first)? {
            match Field::of(sc.text.as_bytes()) {
                Field::Producer if sc.kind()? == Kind::String => {
                    sc.string()?;
                    self.declared_producer = Some(sc.text_str().to_owned());
                }
                Field::DepthCap if sc.kind()? == Kind::Number => {
                    let at = sc.offset();
                    let cap = sc.number()?.integer().and_then(|v| u32::try_from(v).ok());
                    self.declared_depth_cap = Some(cap.ok_or_else(|| {
                        FormatError::invalid(
                            Position::Byte(at),
                            "`depthCap` must be a 32-bit count",
                        )
                    })?);
                }
                Field::TsUnit if sc.kind()? == Kind::String => {
                    sc.string()?;
                    let scale = match sc.text.as_bytes() {
                        b"ns" => 0,
                        b"us" => 3,
                        b"ms" => 6,
                        _ => return Err(sc.error("`tsUnit` must be `ns`, `us` or `ms`")),
                    };
                    self.scale.get_or_insert(scale);
                }
                _ => sc.skip_value()?,
            }
        }
        Ok(())
    }

    fn sf_of(&mut self, id: &str) -> u32 {
        // Most producers number their frames densely: look those up without hashing.
        let small = (id.len() <= 7 && (id == "0" || !id.starts_with('0')))
            .then(|| id.parse::<u32>().ok())
            .flatten();
        if let Some(n) = small
            && let Some(&i) = self.sf_dense.get(n as usize)
            && i != u32::MAX
        {
            return i;
        }
        if small.is_none()
            && let Some(&i) = self.sf_index.get(id)
        {
            return i;
        }
        let i = self.sf_defs.len() as u32;
        self.sf_defs.push(None);
        self.sf_key.push(u32::MAX);
        match small {
            Some(n) => {
                let n = n as usize;
                if self.sf_dense.len() <= n {
                    self.sf_dense.resize(n + 1, u32::MAX);
                }
                self.sf_dense[n] = i;
            }
            None => {
                self.sf_index.insert(id.into(), i);
            }
        }
        i
    }

    /// The id text of `stackFrames` index `sf`, for messages.
    fn sf_id(&self, sf: u32) -> String {
        if let Some(n) = self.sf_dense.iter().position(|&i| i == sf) {
            return n.to_string();
        }
        let id = self.sf_index.iter().find(|&(_, &i)| i == sf);
        id.map_or_else(String::new, |(id, _)| id.to_string())
    }

    fn name_of(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.name_index.get(name) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(name.into());
        self.name_index.insert(name.into(), i);
        i
    }

    /// The frame key of the current event: its `sf` when it has one (the name seen first with that
    /// `sf` is kept as a fallback), else its name.
    fn key_of_event(&mut self) -> u32 {
        let sf = if self.ev.has_sf {
            let sf = std::mem::take(&mut self.ev.sf);
            let i = self.sf_of(&sf);
            self.ev.sf = sf;
            let key = self.sf_key[i as usize];
            if key != u32::MAX {
                return key;
            }
            i
        } else {
            NO_SF
        };
        let name = std::mem::take(&mut self.ev.name);
        let n = self.name_of(if self.ev.has_name { &name } else { UNNAMED });
        self.ev.name = name;
        let len = self.keys.len() as u32;
        let id = *self.key_index.entry((sf, n)).or_insert(len);
        if id == len {
            self.keys.push((sf, n));
        }
        if sf != NO_SF {
            self.sf_key[sf as usize] = id;
        }
        id
    }

    fn thread_of(&mut self, pid: u32, tid: u32) -> u32 {
        let len = self.threads.len() as u32;
        let id = *self.thread_index.entry((pid, tid)).or_insert(len);
        if id == len {
            self.threads.push((pid, tid));
            self.timelines.push(Timeline::new(id));
        }
        id
    }

    fn time_ns(&mut self, value: Option<Decimal>, what: &str, at: u64) -> Result<i64, FormatError> {
        let scale = *self.scale.get_or_insert(3);
        let value = value.ok_or_else(|| {
            FormatError::invalid(Position::Byte(at), format!("an event without `{what}`"))
        })?;
        let ns = value.scaled_i64(scale).filter(|&v| v >= 0).ok_or_else(|| {
            FormatError::invalid(
                Position::Byte(at),
                format!("`{what}` {:e} is negative or too large", value.to_f64()),
            )
        })?;
        Ok(ns)
    }

    fn handle_event(&mut self, at: u64) -> Result<(), FormatError> {
        match self.ev.ph {
            ph @ (b'B' | b'E' | b'X') => {
                if self.scale.is_none() && self.ev.sample_event && self.ev.has_sf {
                    // dotnet-trace writes TraceEvent's relative milliseconds into `ts`.
                    self.scale = Some(6);
                    self.dotnet = true;
                }
                self.sample_event_dialect |= self.ev.sample_event;
                let ts = self.time_ns(self.ev.ts, "ts", at)?;
                let thread = self.thread_of(self.ev.pid, self.ev.tid) as usize;
                let named = self.ev.has_name || self.ev.has_sf;
                let key = if ph != b'E' || named {
                    Some(self.key_of_event())
                } else {
                    None
                };
                self.order += 1;
                let mut end = ts;
                let mut cx = Context {
                    trie: &mut self.trie,
                    sink: &mut self.sink,
                    counters: &mut self.counters,
                };
                let timeline = &mut self.timelines[thread];
                match (ph, key) {
                    (b'B', Some(key)) => timeline.push(ts, Action::Begin(key), self.order, &mut cx),
                    (b'E', key) => timeline.push(ts, Action::End(key), self.order, &mut cx),
                    (_, Some(key)) => {
                        // Without `dur`, the thread duration `tdur` is the best length known.
                        let dur = match self.ev.dur.or(self.ev.tdur) {
                            Some(dur) => {
                                dur.scaled_i64(self.scale.unwrap_or(3)).ok_or_else(|| {
                                    FormatError::invalid(Position::Byte(at), "`dur` is too large")
                                })?
                            }
                            None => 0,
                        };
                        if dur <= 0 {
                            cx.counters.zero_duration += 1;
                        } else {
                            end = ts.checked_add(dur).ok_or_else(|| {
                                FormatError::invalid(
                                    Position::Byte(at),
                                    "`ts` + `dur` is too large",
                                )
                            })?;
                            self.x_seq += 1;
                            let seq = self.x_seq;
                            timeline.push(
                                ts,
                                Action::XBegin { key, end, seq },
                                self.order,
                                &mut cx,
                            );
                            timeline.push(end, Action::XEnd(seq), self.order, &mut cx);
                        }
                    }
                    (_, None) => {}
                }
                self.slice_samples = true;
                self.start = Some(self.start.map_or(ts, |s| s.min(ts)));
                self.end = self.end.max(end);
            }
            b'M' if self.ev.has_args_name => match self.ev.name.as_str() {
                "process_name" => {
                    self.process_names
                        .insert(self.ev.pid, self.ev.args_name.clone());
                }
                "thread_name" => {
                    self.thread_names
                        .insert((self.ev.pid, self.ev.tid), self.ev.args_name.clone());
                }
                _ => {}
            },
            _ => {}
        }
        Ok(())
    }

    fn handle_sample(&mut self, at: u64) -> Result<(), FormatError> {
        if !self.ev.has_sf {
            return Err(FormatError::invalid(
                Position::Byte(at),
                "a `samples` entry without `sf` (its stack)",
            ));
        }
        let ts = self.time_ns(self.ev.ts, "ts", at)?;
        let weight = match self.ev.weight {
            Some(w) => w
                .scaled_i64(0)
                .ok_or_else(|| FormatError::invalid(Position::Byte(at), "`weight` is too large"))?,
            None => 1,
        };
        let thread = self.thread_of(self.ev.pid, self.ev.tid);
        let sf = std::mem::take(&mut self.ev.sf);
        let sf_index = self.sf_of(&sf);
        self.ev.sf = sf;
        self.sink
            .push(ts, thread, StackRef::Sf(sf_index), 0, weight);
        self.point_samples = true;
        self.start = Some(self.start.map_or(ts, |s| s.min(ts)));
        self.end = self.end.max(ts);
        Ok(())
    }
}
