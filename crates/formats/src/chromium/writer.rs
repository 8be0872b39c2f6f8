//! Writing trace-event JSON: per-thread `B`/`E` slices from samples, frames in `stackFrames`.

use std::io::{BufWriter, Write};

use rootline_profile::{FrameId, Profile, StackId};

use crate::error::FormatError;

/// Length given to a sample whose length nothing else tells (no time column, no later sample).
const DEFAULT_SAMPLE_NS: i64 = 1_000_000;

/// The value column that measures time in nanoseconds (wall first, then cpu, then any).
pub(crate) fn time_column(profile: &Profile) -> Option<usize> {
    let types = profile.sample_types();
    types
        .iter()
        .position(|t| t.name == "wall" && t.unit == "nanoseconds")
        .or_else(|| types.iter().position(|t| t.unit == "nanoseconds"))
}

/// Appends `s` as a JSON string literal.
pub(crate) fn push_json_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            out.extend_from_slice(format!("\\u{b:04x}").as_bytes());
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// Appends nanoseconds `ns` as microseconds with up to three decimals.
fn push_micros(out: &mut Vec<u8>, ns: i64) {
    let mut itoa = itoa::Buffer::new();
    let (sign, abs) = if ns < 0 {
        ("-", ns.unsigned_abs())
    } else {
        ("", ns as u64)
    };
    out.extend_from_slice(sign.as_bytes());
    out.extend_from_slice(itoa.format(abs / 1000).as_bytes());
    let frac = abs % 1000;
    if frac != 0 {
        let digits = [
            b'0' + (frac / 100) as u8,
            b'0' + (frac / 10 % 10) as u8,
            b'0' + (frac % 10) as u8,
        ];
        let len = if frac % 100 == 0 {
            1
        } else if frac % 10 == 0 {
            2
        } else {
            3
        };
        out.push(b'.');
        out.extend_from_slice(&digits[..len]);
    }
}

/// Splits `Module!Method` into (`Module`, `Method`) as dotnet-trace does; no `!` → ("", name).
fn split_category(name: &str) -> (&str, &str) {
    match name.find('!') {
        Some(i) if i > 0 => (&name[..i], &name[i + 1..]),
        _ => ("", name),
    }
}

struct EventWriter<'a> {
    profile: &'a Profile,
    out: Vec<u8>,
    /// The escaped short name (`"Method"`) per frame, built on first use.
    names: Vec<Option<Box<[u8]>>>,
    /// Stack nodes referenced by events.
    used: Vec<bool>,
    first: bool,
}

impl EventWriter<'_> {
    fn separator(&mut self) {
        if !self.first {
            self.out.extend_from_slice(b",\n");
        }
        self.first = false;
    }

    fn slice(&mut self, ph: u8, node: StackId, ts: i64, pid: u32, tid: u32) {
        let frame: FrameId = self.profile.stack(node).frame;
        if self.names[frame.index()].is_none() {
            let (_, short) = split_category(self.profile.frame_name(frame));
            let mut escaped = Vec::new();
            push_json_string(&mut escaped, short);
            self.names[frame.index()] = Some(escaped.into_boxed_slice());
        }
        self.used[node.index()] = true;
        self.separator();
        let mut itoa = itoa::Buffer::new();
        let out = &mut self.out;
        out.extend_from_slice(b"{\"name\":");
        out.extend_from_slice(self.names[frame.index()].as_deref().unwrap_or(b"\"\""));
        out.extend_from_slice(b",\"cat\":\"sampleEvent\",\"ph\":\"");
        out.push(ph);
        out.extend_from_slice(b"\",\"ts\":");
        push_micros(out, ts);
        out.extend_from_slice(b",\"pid\":");
        out.extend_from_slice(itoa.format(pid).as_bytes());
        out.extend_from_slice(b",\"tid\":");
        out.extend_from_slice(itoa.format(tid).as_bytes());
        out.extend_from_slice(b",\"sf\":");
        out.extend_from_slice(itoa.format(node.0).as_bytes());
        if ph == b'B' {
            let function = self.profile.function(self.profile.frame(frame).function);
            let p = self.profile;
            let args = [
                ("tier", function.tier),
                ("system_name", function.system_name),
            ];
            let mut first = true;
            for (key, value) in args {
                let Some(value) = value else { continue };
                out.extend_from_slice(if first { b",\"args\":{\"" } else { b",\"" });
                first = false;
                out.extend_from_slice(key.as_bytes());
                out.extend_from_slice(b"\":");
                push_json_string(out, p.string(value));
            }
            if !first {
                out.push(b'}');
            }
        }
        out.push(b'}');
    }

    /// An allocation sample as a thread-scoped instant event at its time, named by its leaf
    /// (`[alloc: TYPE]`), its stack in `sf`, with `args` `{"allocated_type": TYPE, "bytes": N}`.
    fn allocation(&mut self, node: StackId, ts: i64, pid: u32, tid: u32, ty: &str, bytes: i64) {
        self.used[node.index()] = true;
        self.separator();
        let mut itoa = itoa::Buffer::new();
        let out = &mut self.out;
        out.extend_from_slice(b"{\"name\":");
        push_json_string(out, self.profile.frame_name(self.profile.stack(node).frame));
        out.extend_from_slice(b",\"cat\":\"allocation\",\"ph\":\"i\",\"s\":\"t\",\"ts\":");
        push_micros(out, ts);
        out.extend_from_slice(b",\"pid\":");
        out.extend_from_slice(itoa.format(pid).as_bytes());
        out.extend_from_slice(b",\"tid\":");
        out.extend_from_slice(itoa.format(tid).as_bytes());
        out.extend_from_slice(b",\"sf\":");
        out.extend_from_slice(itoa.format(node.0).as_bytes());
        out.extend_from_slice(b",\"args\":{\"allocated_type\":");
        push_json_string(out, ty);
        out.extend_from_slice(b",\"bytes\":");
        out.extend_from_slice(itoa.format(bytes).as_bytes());
        out.extend_from_slice(b"}}");
    }

    fn metadata(&mut self, what: &str, pid: u32, tid: u32, name: &str) {
        self.separator();
        let mut itoa = itoa::Buffer::new();
        let out = &mut self.out;
        out.extend_from_slice(b"{\"name\":\"");
        out.extend_from_slice(what.as_bytes());
        out.extend_from_slice(b"\",\"ph\":\"M\",\"pid\":");
        out.extend_from_slice(itoa.format(pid).as_bytes());
        out.extend_from_slice(b",\"tid\":");
        out.extend_from_slice(itoa.format(tid).as_bytes());
        out.extend_from_slice(b",\"args\":{\"name\":");
        push_json_string(out, name);
        out.extend_from_slice(b"}}");
    }

    fn flush_to(&mut self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&self.out)?;
        self.out.clear();
        Ok(())
    }
}

/// True when stack nodes `a` and `b` run the same function (so one span can cover both).
fn same_function(profile: &Profile, a: StackId, b: StackId) -> bool {
    let function = |n: StackId| profile.frame(profile.stack(n).frame).function;
    function(a) == function(b)
}

/// Writes `profile` as trace-event JSON in dotnet-trace's shape (see the module documentation).
pub fn write(profile: &Profile, writer: impl Write) -> Result<(), FormatError> {
    let mut w = BufWriter::with_capacity(1 << 20, writer);
    let samples = profile.samples();
    let column = time_column(profile).map(|c| &samples.values[c]);
    // Without a time column, a sample lasts one sampling period per count it carries (collapsed
    // stacks give counts, not times), so span widths keep the profile's proportions.
    let counts = profile
        .sample_types()
        .iter()
        .position(|t| t.unit == "count")
        .map(|c| &samples.values[c]);
    // Off-CPU samples (`record --off-cpu`) say how long the thread stayed off: their slice ends
    // there, not at the thread's next sample.
    let off_cpu = profile
        .sample_types()
        .iter()
        .position(|t| t.name == "off_cpu" && t.unit == "nanoseconds")
        .map(|c| &samples.values[c]);
    let period_ns = profile
        .metadata
        .sample_rate_hz
        .filter(|&hz| hz > 0)
        .map_or(DEFAULT_SAMPLE_NS, |hz| 1_000_000_000 / i64::from(hz));

    let alloc_bytes = profile
        .sample_types()
        .iter()
        .position(|t| *t == rootline_profile::SampleType::alloc_bytes())
        .map(|c| &samples.values[c]);
    // Samples per thread, in time order. With a time column, a sample that weighs no time there
    // (an allocation among thread samples) is not a slice: allocations are instant events.
    let mut per_thread: Vec<Vec<u32>> = vec![Vec::new(); profile.threads().len()];
    let mut allocations: Vec<u32> = Vec::new();
    for (i, t) in samples.threads.iter().enumerate() {
        if column.is_some_and(|c| c[i] <= 0) {
            if alloc_bytes.is_some_and(|b| b[i] > 0) {
                allocations.push(i as u32);
            }
            continue;
        }
        per_thread[t.index()].push(i as u32);
    }
    for list in &mut per_thread {
        list.sort_by_key(|&i| samples.times[i as usize]);
    }
    let mut order: Vec<usize> = (0..per_thread.len()).collect();
    order.sort_by_key(|&t| per_thread[t].first().map(|&i| samples.times[i as usize]));

    let mut ew = EventWriter {
        profile,
        out: Vec::with_capacity(1 << 16),
        names: vec![None; profile.frames().len()],
        used: vec![false; profile.stacks().len()],
        first: true,
    };
    w.write_all(b"{\"otherData\":{\"producer\":\"rootline\",\"tsUnit\":\"us\"")?;
    if let Some(cap) = profile.metadata.depth_cap {
        write!(w, ",\"depthCap\":{cap}")?;
    }
    w.write_all(b"},\n\"traceEvents\":[\n")?;
    for process in profile.processes() {
        if let Some(name) = process.name {
            ew.metadata("process_name", process.pid, 0, profile.string(name));
        }
    }
    for thread in profile.threads() {
        if let Some(name) = thread.name {
            ew.metadata("thread_name", thread.pid, thread.tid, profile.string(name));
        }
    }

    let mut prev: Vec<StackId> = Vec::new();
    let mut cur: Vec<StackId> = Vec::new();
    for &t in &order {
        let list = &per_thread[t];
        let thread = profile.threads()[t];
        let (pid, tid) = (thread.pid, thread.tid);
        let weight = |i: u32| -> i64 {
            match (column, counts) {
                (Some(c), _) => c[i as usize].max(0),
                (None, Some(c)) => c[i as usize].max(0).saturating_mul(period_ns),
                (None, None) => period_ns,
            }
        };
        // Samples without distinct times (e.g. read from collapsed stacks) are laid end to end by
        // their time value; otherwise each lasts until the next sample on the thread.
        let timed = list.len() < 2
            || samples.times[list[0] as usize] != samples.times[list[list.len() - 1] as usize];
        let mut clock = list
            .first()
            .map_or(0, |&i| samples.times[i as usize] as i64);
        prev.clear();
        for (k, &i) in list.iter().enumerate() {
            let start = if timed {
                samples.times[i as usize] as i64
            } else {
                clock
            };
            let end = if !timed || k + 1 == list.len() {
                start.saturating_add(weight(i))
            } else {
                let next = samples.times[list[k + 1] as usize] as i64;
                match off_cpu.map(|c| c[i as usize]).filter(|&ns| ns > 0) {
                    Some(ns) => next.min(start.saturating_add(ns)),
                    None => next,
                }
            };
            clock = end;
            if end <= start {
                continue;
            }
            cur.clear();
            let mut node = Some(samples.stacks[i as usize]);
            while let Some(id) = node {
                cur.push(id);
                node = profile.stack(id).parent;
            }
            cur.reverse();
            // Spans continue while the function at each depth stays the same, as dotnet-trace's
            // writer does: a new call site or address in the same method is not a new call.
            let common = prev
                .iter()
                .zip(&cur)
                .take_while(|&(&a, &b)| a == b || same_function(profile, a, b))
                .count();
            for &node in prev[common..].iter().rev() {
                ew.slice(b'E', node, start, pid, tid);
            }
            for &node in &cur[common..] {
                ew.slice(b'B', node, start, pid, tid);
            }
            std::mem::swap(&mut prev, &mut cur);
            // The stack stays open until the next sample starts; close it at a gap.
            let next_start = list.get(k + 1).map(|&n| {
                if timed {
                    samples.times[n as usize] as i64
                } else {
                    end
                }
            });
            if next_start != Some(end) {
                for &node in prev.iter().rev() {
                    ew.slice(b'E', node, end, pid, tid);
                }
                prev.clear();
            }
            if ew.out.len() > 1 << 16 {
                ew.flush_to(&mut w)?;
            }
        }
    }
    allocations.sort_by_key(|&i| samples.times[i as usize]);
    for i in allocations {
        let i = i as usize;
        let stack = samples.stacks[i];
        let leaf = profile.frame_name(profile.stack(stack).frame);
        let ty = rootline_profile::pseudo::alloc_type_of(leaf)
            .unwrap_or(rootline_profile::pseudo::ALLOC_UNKNOWN_TYPE);
        let thread = profile.thread(samples.threads[i]);
        let bytes = alloc_bytes.map_or(0, |b| b[i]);
        ew.allocation(
            stack,
            samples.times[i] as i64,
            thread.pid,
            thread.tid,
            ty,
            bytes,
        );
        if ew.out.len() > 1 << 16 {
            ew.flush_to(&mut w)?;
        }
    }
    ew.flush_to(&mut w)?;
    w.write_all(b"\n],\n\"displayTimeUnit\":\"ms\",\n\"stackFrames\":{")?;
    // Every referenced node needs its whole parent chain in `stackFrames`. Parents have smaller
    // ids than their children, so one pass from the top down marks them all.
    for index in (0..profile.stacks().len()).rev() {
        if let (true, Some(parent)) = (ew.used[index], profile.stacks()[index].parent) {
            ew.used[parent.index()] = true;
        }
    }
    let mut first = true;
    let mut itoa = itoa::Buffer::new();
    for (index, node) in profile.stacks().iter().enumerate() {
        if !ew.used[index] {
            continue;
        }
        let out = &mut ew.out;
        if !first {
            out.extend_from_slice(b",\n");
        }
        first = false;
        let (category, short) = split_category(profile.frame_name(node.frame));
        out.push(b'"');
        out.extend_from_slice(itoa.format(index).as_bytes());
        out.extend_from_slice(b"\":{\"name\":");
        push_json_string(out, short);
        out.extend_from_slice(b",\"category\":");
        push_json_string(out, category);
        if let Some(parent) = node.parent {
            out.extend_from_slice(b",\"parent\":");
            out.extend_from_slice(itoa.format(parent.0).as_bytes());
        }
        out.push(b'}');
        if out.len() > 1 << 16 {
            ew.flush_to(&mut w)?;
        }
    }
    ew.flush_to(&mut w)?;
    w.write_all(b"}}\n")?;
    w.flush()?;
    Ok(())
}
