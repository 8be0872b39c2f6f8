//! Writes a profile the way dotnet-trace's `convert` writes it, for reading back with rootline's
//! readers: the Chromium dialect (`B`/`E` events, `"cat": "sampleEvent"`, `ts` in relative
//! milliseconds, `pid` 0, an `sf` id into `stackFrames` whose `category` holds the module of a
//! `Module!Method` name) and the speedscope dialect (one evented profile per thread named
//! `Thread (N)`, the thread's grouping frames left out, times in milliseconds, `exporter` naming
//! dotnet-trace). Each sample lasts until the next sample of its thread, 1 ms for the last.

#![allow(dead_code)]

use std::io::{self, Write};

use rootline_profile::{Profile, StackId};

const LAST_SAMPLE_NS: u64 = 1_000_000;

fn escape(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            c if (c as u32) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes())
            }
            c => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out.push(b'"');
}

/// A sample as a span: start ns, end ns, stack.
type Span = (u64, u64, StackId);

/// Per thread (by tid), the samples in time order.
fn timelines(profile: &Profile) -> Vec<(u32, Vec<Span>)> {
    let s = profile.samples();
    let mut out = Vec::new();
    for (t, thread) in profile.threads().iter().enumerate() {
        let mut idx: Vec<usize> = (0..s.len())
            .filter(|&i| s.threads[i].index() == t)
            .collect();
        idx.sort_by_key(|&i| s.times[i]);
        let spans = idx
            .iter()
            .enumerate()
            .map(|(k, &i)| {
                let end = idx
                    .get(k + 1)
                    .map_or(s.times[i] + LAST_SAMPLE_NS, |&j| s.times[j]);
                (s.times[i], end, s.stacks[i])
            })
            .collect();
        out.push((thread.tid, spans));
    }
    out
}

fn path(profile: &Profile, stack: StackId, out: &mut Vec<StackId>) {
    out.clear();
    let mut node = Some(stack);
    while let Some(n) = node {
        out.push(n);
        node = profile.stack(n).parent;
    }
    out.reverse();
}

/// Milliseconds relative to `origin`, as TraceEvent prints them.
fn ms(ns: u64, origin: u64) -> String {
    format!("{:.3}", (ns - origin) as f64 / 1e6)
}

/// Writes `profile` as dotnet-trace's Chromium trace-event JSON.
pub fn write_chromium(profile: &Profile, w: &mut impl Write) -> io::Result<()> {
    let origin = profile.samples().times.iter().copied().min().unwrap_or(0);
    let mut out = Vec::with_capacity(1 << 16);
    out.extend_from_slice(b"{\"traceEvents\": [");
    let mut first = true;
    let (mut prev, mut cur) = (Vec::new(), Vec::new());
    let mut event = |out: &mut Vec<u8>, ph: &str, node: StackId, ns: u64, tid: u32| {
        if !first {
            out.extend_from_slice(b", ");
        }
        first = false;
        let name = profile.frame_name(profile.stack(node).frame);
        let method = name.split_once('!').map_or(name, |(_, m)| m);
        out.extend_from_slice(b"{\"name\": ");
        escape(method, out);
        write!(
            out,
            ", \"cat\": \"sampleEvent\", \"ph\": \"{ph}\", \"ts\": {}, \"pid\": 0, \"tid\": {tid}, \"sf\": {}}}",
            ms(ns, origin),
            node.0
        )
        .unwrap();
    };
    for (tid, spans) in timelines(profile) {
        prev.clear();
        for (k, &(start, end, stack)) in spans.iter().enumerate() {
            path(profile, stack, &mut cur);
            let common = prev.iter().zip(&cur).take_while(|(a, b)| a == b).count();
            for &n in prev[common..].iter().rev() {
                event(&mut out, "E", n, start, tid);
            }
            for &n in &cur[common..] {
                event(&mut out, "B", n, start, tid);
            }
            std::mem::swap(&mut prev, &mut cur);
            if k + 1 == spans.len() {
                for &n in prev.iter().rev() {
                    event(&mut out, "E", n, end, tid);
                }
            }
            if out.len() > 1 << 16 {
                w.write_all(&out)?;
                out.clear();
            }
        }
    }
    out.extend_from_slice(b"], \"displayTimeUnit\": \"ms\", \"stackFrames\": {");
    for (i, node) in profile.stacks().iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(b", ");
        }
        let name = profile.frame_name(node.frame);
        let (module, method) = name.split_once('!').unwrap_or(("", name));
        write!(out, "\"{i}\": {{\"name\": ").unwrap();
        escape(method, &mut out);
        out.extend_from_slice(b", \"category\": ");
        escape(module, &mut out);
        if let Some(p) = node.parent {
            write!(out, ", \"parent\": {}", p.0).unwrap();
        }
        out.push(b'}');
        if out.len() > 1 << 16 {
            w.write_all(&out)?;
            out.clear();
        }
    }
    out.extend_from_slice(b"}, \"otherData\": {\"name\": \"trace\"}}");
    w.write_all(&out)
}

/// Writes `profile` as dotnet-trace's speedscope JSON: per thread an evented profile, without the
/// leading `Process64 …`/`Threads`/`Thread (N)` frames.
pub fn write_speedscope(profile: &Profile, w: &mut impl Write) -> io::Result<()> {
    let origin = profile.samples().times.iter().copied().min().unwrap_or(0);
    let mut frame_index = vec![u32::MAX; profile.frames().len()];
    let mut frames: Vec<u32> = Vec::new();
    let mut profiles = Vec::new();
    let (mut prev, mut cur) = (Vec::new(), Vec::new());
    let grouping = |f: rootline_profile::FrameId| {
        let n = profile.frame_name(f);
        n.starts_with("Process64 ") || n == "Threads" || n.starts_with("Thread (")
    };
    for (tid, spans) in timelines(profile) {
        let mut events = Vec::new();
        prev.clear();
        let (first, last) = match (spans.first(), spans.last()) {
            (Some(f), Some(l)) => (f.0, l.1),
            _ => continue,
        };
        for (k, &(start, end, stack)) in spans.iter().enumerate() {
            let mut full = Vec::new();
            path(profile, stack, &mut full);
            cur.clear();
            cur.extend(
                full.iter()
                    .map(|&n| profile.stack(n).frame)
                    .skip_while(|&f| grouping(f)),
            );
            let common = prev.iter().zip(&cur).take_while(|(a, b)| a == b).count();
            let mut index = |f: rootline_profile::FrameId| {
                if frame_index[f.index()] == u32::MAX {
                    frame_index[f.index()] = frames.len() as u32;
                    frames.push(f.0);
                }
                frame_index[f.index()]
            };
            for &f in prev[common..].iter().rev() {
                events.push(format!(
                    "{{\"type\": \"C\", \"frame\": {}, \"at\": {}}}",
                    index(f),
                    ms(start, origin)
                ));
            }
            for &f in &cur[common..] {
                events.push(format!(
                    "{{\"type\": \"O\", \"frame\": {}, \"at\": {}}}",
                    index(f),
                    ms(start, origin)
                ));
            }
            std::mem::swap(&mut prev, &mut cur);
            if k + 1 == spans.len() {
                for &f in prev.iter().rev() {
                    events.push(format!(
                        "{{\"type\": \"C\", \"frame\": {}, \"at\": {}}}",
                        index(f),
                        ms(end, origin)
                    ));
                }
            }
        }
        profiles.push(format!(
            "{{\"type\": \"evented\", \"name\": \"Thread ({tid})\", \"unit\": \"milliseconds\", \"startValue\": {}, \"endValue\": {}, \"events\": [{}]}}",
            ms(first, origin),
            ms(last, origin),
            events.join(", ")
        ));
    }
    let mut out = Vec::new();
    out.extend_from_slice(
        b"{\"exporter\": \"dotnet-trace@8.0.452401\", \"name\": \"trace.nettrace\", \"activeProfileIndex\": 0, \"$schema\": \"https://www.speedscope.app/file-format-schema.json\", \"shared\": {\"frames\": [",
    );
    for (i, &f) in frames.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(b"{\"name\": ");
        escape(profile.frame_name(rootline_profile::FrameId(f)), &mut out);
        out.push(b'}');
    }
    out.extend_from_slice(b"]}, \"profiles\": [");
    out.extend_from_slice(profiles.join(", ").as_bytes());
    out.extend_from_slice(b"]}");
    w.write_all(&out)
}
