//! `perf script` text, the input of every FlameGraph and inferno pipeline (read only).
//!
//! Each sample is an event line followed by its call chain, leaf first, and a blank line:
//!
//! ```text
//! comm 1234/1235 [001] 4794564.109216:     250000 cpu-clock:uhH:
//!         401b97 leaf+0x1f (/usr/bin/prog)
//!     7f443cc6f090 main+0x30 (/usr/bin/prog)
//! ```
//!
//! The event line gives the command (which may contain spaces), the thread (`tid` or
//! `pid/tid`), an optional `[cpu]`, the time in seconds (unless `-F` left it out), an optional
//! period and the event's name (ending with `:`).
//! A frame line gives the address, the symbol (with `+0x…` offset, dropped) and the module in
//! parentheses (without `-g`, perf prints the one frame on the event line itself, which is read
//! too); an unknown symbol is named after its module (`[libc.so.6]`, `[[kernel.kallsyms]]`)
//! as inferno does. Each sample counts 1 in `samples` and its period (as stackcollapse-perf and
//! inferno count) in a second column: `cpu` nanoseconds for `cpu-clock`/`task-clock`, else
//! `events`. Lines starting with `#` (perf's header) are skipped; a frame line that is not
//! `address symbol (module)` is skipped with a warning naming its line; an event line that cannot be
//! read is an error naming its line.

use std::collections::HashSet;
use std::io::BufRead;

use rootline_profile::{FrameKind, Profile, SampleType, StackId};

use crate::WARNING_PREFIX;
use crate::error::{FormatError, Position};

/// One sample's event line, parsed.
#[derive(Debug, PartialEq)]
struct Event<'a> {
    comm: &'a str,
    pid: Option<u32>,
    tid: u32,
    time_ns: u64,
    period: Option<u64>,
    event: &'a str,
    /// What follows the event's name: a frame when perf printed the sample on one line.
    rest: &'a str,
}

/// Parses an event line (`comm [pid/]tid [cpu] secs.frac: [period] event[:mods]:`).
fn parse_event(line: &str) -> Option<Event<'_>> {
    let line = line.trim_end();
    // The thread token is the first one after the command that is followed by `[cpu]` or the time.
    let tokens: Vec<(usize, &str)> = line
        .split_whitespace()
        .map(|t| (t.as_ptr() as usize - line.as_ptr() as usize, t))
        .collect();
    for i in 1..tokens.len() {
        let (start, token) = tokens[i];
        let Some((pid, tid)) = parse_thread(token) else {
            continue;
        };
        let mut rest = &tokens[i + 1..];
        if rest
            .first()
            .is_some_and(|(_, t)| t.starts_with('[') && t.ends_with(']'))
        {
            rest = &rest[1..];
        }
        // The time is left out by `perf script -F` without `time`.
        let time_ns = rest.first().and_then(|(_, t)| parse_time(t));
        if time_ns.is_some() {
            rest = &rest[1..];
        }
        let period = rest.first().and_then(|(_, t)| t.parse::<u64>().ok());
        if period.is_some() {
            rest = &rest[1..];
        }
        // The event's name ends with `:` (then its modifiers, each ending with `:`).
        if !rest.first().is_some_and(|(_, t)| t.ends_with(':')) {
            continue;
        }
        let time_ns = time_ns.unwrap_or(0);
        let (at, event) = *rest.first()?;
        let after = line[at + event.len()..].trim();
        let event = event.split(':').next().unwrap_or(event);
        let comm = line[..start].trim();
        return Some(Event {
            comm,
            pid,
            tid,
            time_ns,
            period,
            event,
            rest: after,
        });
    }
    None
}

/// `tid` or `pid/tid`.
fn parse_thread(token: &str) -> Option<(Option<u32>, u32)> {
    match token.split_once('/') {
        Some((pid, tid)) => Some((Some(pid.parse().ok()?), tid.parse().ok()?)),
        None => Some((None, token.parse().ok()?)),
    }
}

/// `secs.frac:` in nanoseconds.
fn parse_time(token: &str) -> Option<u64> {
    let t = token.strip_suffix(':')?;
    let (secs, frac) = t.split_once('.').unwrap_or((t, ""));
    if secs.is_empty() || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: u64 = secs.parse().ok()?;
    let frac: u64 = if frac.is_empty() {
        0
    } else {
        frac.parse::<u64>().ok()? * 10u64.pow(9 - frac.len() as u32)
    };
    secs.checked_mul(1_000_000_000)?.checked_add(frac)
}

/// A frame line's function name and kind, or None when it is not `address symbol (module)`.
fn parse_frame(line: &str) -> Option<(String, FrameKind)> {
    let line = line.trim();
    let (addr, rest) = line.split_once(char::is_whitespace)?;
    if !addr.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let rest = rest.trim();
    let (symbol, module) = match rest.strip_suffix(')').and_then(|r| r.rfind(" (")) {
        Some(open) => (&rest[..open], &rest[open + 2..rest.len() - 1]),
        None if rest.ends_with(')') && rest.starts_with('(') => ("", &rest[1..rest.len() - 1]),
        None => (rest, ""),
    };
    let symbol = strip_offset(symbol.trim());
    let kind = if module == "[kernel.kallsyms]"
        || module.starts_with("[kernel")
        || module.contains("vmlinux")
        || module.starts_with("/lib/modules/")
    {
        FrameKind::Kernel
    } else if module.contains("/tmp/perf-") && module.ends_with(".map")
        || module.contains("jitted-")
    {
        FrameKind::Jit
    } else {
        FrameKind::Native
    };
    let name = if symbol.is_empty() || symbol == "[unknown]" {
        match module.rsplit('/').next() {
            Some(base) if !base.is_empty() && module != "[unknown]" => format!("[{base}]"),
            _ => "[unknown]".to_string(),
        }
    } else {
        symbol.to_string()
    };
    Some((name, kind))
}

/// `symbol+0x1f` → `symbol`.
fn strip_offset(symbol: &str) -> &str {
    match symbol.rsplit_once("+0x") {
        Some((name, off)) if !name.is_empty() && off.bytes().all(|b| b.is_ascii_hexdigit()) => name,
        _ => symbol,
    }
}

/// Whether `head` (the first bytes of a file) looks like `perf script` output: its first line
/// that is not a `#` comment is an event line, followed by a frame line or a blank line.
pub fn looks_like(head: &[u8]) -> bool {
    let text = match std::str::from_utf8(head) {
        Ok(t) => t,
        Err(e) => std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or(""),
    };
    let mut lines = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty());
    let Some(first) = lines.next() else {
        return false;
    };
    if parse_frame(first).is_some() || parse_event(first).is_none() {
        return false;
    }
    lines
        .next()
        .is_none_or(|l| parse_event(l).is_some() || parse_frame(l).is_some())
}

/// The sample being read: its event, line number and frames, leaf first.
struct Pending {
    line: u64,
    comm: String,
    pid: Option<u32>,
    tid: u32,
    time_ns: u64,
    period: Option<u64>,
    frames: Vec<(String, FrameKind)>,
}

/// Reads `perf script` text (see the module documentation).
pub fn read(mut reader: impl BufRead) -> Result<Profile, FormatError> {
    let mut samples: Vec<Pending> = Vec::new();
    let mut events: HashSet<String> = HashSet::new();
    let mut skipped: Vec<u64> = Vec::new();
    let mut buf = Vec::new();
    let mut number = 0u64;
    let mut current: Option<Pending> = None;
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        number += 1;
        let text = String::from_utf8_lossy(&buf);
        let text = text.trim_end_matches(['\r', '\n']);
        if text.trim().is_empty() {
            // A blank line ends a sample; one straight after the event line is perf's quirk of
            // printing an empty line before the frames, and does not.
            if current.as_ref().is_some_and(|c| !c.frames.is_empty()) {
                samples.extend(current.take());
            }
            continue;
        }
        if text.starts_with('#') && current.is_none() {
            continue;
        }
        // Inside a sample, a line is a frame when it reads as one; an indented line that is
        // neither a frame nor an event line is a frame line perf garbled.
        if let Some(sample) = current.as_mut() {
            if let Some(frame) = parse_frame(text) {
                sample.frames.push(frame);
                continue;
            }
            if text.starts_with(char::is_whitespace) && parse_event(text).is_none() {
                skipped.push(number);
                continue;
            }
        }
        samples.extend(current.take());
        let Some(event) = parse_event(text) else {
            return Err(FormatError::invalid(
                Position::Line(number),
                format!(
                    "expected an event line `comm [pid/]tid [cpu] time: [period] event:`, found {:?}",
                    text.chars().take(80).collect::<String>()
                ),
            ));
        };
        if !events.contains(event.event) {
            events.insert(event.event.to_string());
        }
        current = Some(Pending {
            line: number,
            comm: event.comm.to_string(),
            pid: event.pid,
            tid: event.tid,
            time_ns: event.time_ns,
            period: event.period,
            frames: parse_frame(event.rest).into_iter().collect(),
        });
    }
    samples.extend(current.take());

    let has_period = samples.iter().any(|s| s.period.is_some());
    let mut types = vec![SampleType::samples()];
    if has_period {
        let clock = events.iter().all(|e| e == "cpu-clock" || e == "task-clock");
        types.push(if clock {
            SampleType::new("cpu", "nanoseconds")
        } else {
            SampleType::new("events", "count")
        });
    }
    let mut profile = Profile::new(types);
    profile.metadata.producer = "perf script".into();
    let mut names: Vec<&String> = events.iter().collect();
    names.sort();
    if !names.is_empty() {
        profile.metadata.extra.insert(
            "perf.events".into(),
            names
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    let mut without_frames = 0u64;
    let (mut start, mut end) = (u64::MAX, 0u64);
    for sample in samples {
        if sample.frames.is_empty() {
            without_frames += 1;
            continue;
        }
        let pid = sample.pid.unwrap_or(sample.tid);
        let thread = profile.intern_thread(pid, sample.tid);
        if !sample.comm.is_empty() {
            profile.set_thread_name(thread, &sample.comm);
        }
        let mut stack: Option<StackId> = None;
        for (name, kind) in sample.frames.iter().rev() {
            let frame = profile.intern_named_frame(name, *kind);
            stack = Some(profile.intern_stack(stack, frame));
        }
        let Some(stack) = stack else { continue };
        let mut values = vec![1i64];
        if has_period {
            values.push(i64::try_from(sample.period.unwrap_or(1)).unwrap_or(i64::MAX));
        }
        profile
            .push_sample(sample.time_ns, thread, stack, &values)
            .map_err(|e| FormatError::invalid(Position::Line(sample.line), e.to_string()))?;
        start = start.min(sample.time_ns);
        end = end.max(sample.time_ns);
    }
    if end >= start && start != u64::MAX {
        profile.metadata.start_time_ns = start;
        profile.metadata.end_time_ns = end;
    }
    if without_frames > 0 {
        profile.metadata.extra.insert(
            format!("{WARNING_PREFIX}perf-script-no-frames"),
            format!(
                "{without_frames} samples had no call chain and were left out (record with -g, \
                 or print the ip field)"
            ),
        );
    }
    if let Some(first) = skipped.first() {
        profile.metadata.extra.insert(
            format!("{WARNING_PREFIX}perf-script-frames"),
            format!(
                "{} frame lines were not `address symbol (module)` and were skipped (first at \
                 line {first})",
                skipped.len()
            ),
        );
    }
    Ok(profile)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_lines_of_perfs_layouts_are_read() {
        let e = parse_event("iperf 27409/28744 [000] 441995.133575: cpu-clock: ").unwrap();
        assert_eq!(
            e,
            Event {
                comm: "iperf",
                pid: Some(27409),
                tid: 28744,
                time_ns: 441_995_133_575_000,
                period: None,
                event: "cpu-clock",
                rest: "",
            }
        );
        let e =
            parse_event("inline-counter 26037  8801.193547:     250000 cpu-clock:uhH:").unwrap();
        assert_eq!(
            (e.comm, e.tid, e.period),
            ("inline-counter", 26037, Some(250000))
        );
        let e = parse_event("Web Content 12 3 [001] 5.5: 1 cycles:ppp:").unwrap();
        assert_eq!((e.comm, e.tid, e.event), ("Web Content 12", 3, "cycles"));
        let e =
            parse_event("  false 39654 19115.489713:    1 cycles:u:  7f _dl_start+0x4 (/ld.so)")
                .unwrap();
        assert_eq!(
            (e.comm, e.event, e.rest),
            ("false", "cycles", "7f _dl_start+0x4 (/ld.so)")
        );
        let e = parse_event("func_ab 15294 cpu-clock: ").unwrap();
        assert_eq!(
            (e.comm, e.tid, e.time_ns, e.event),
            ("func_ab", 15294, 0, "cpu-clock")
        );
        assert!(parse_event("not an event").is_none());
        assert!(parse_event("comm 12 34").is_none());
        assert!(parse_event("x 1 2.5").is_none());
    }

    #[test]
    fn frame_lines_name_functions_or_their_modules() {
        let f = |l| parse_frame(l).unwrap();
        assert_eq!(
            f("\t  401b97 main+0x1f (/usr/bin/prog)"),
            ("main".into(), FrameKind::Native)
        );
        assert_eq!(
            f("\tffffffff9c2009e7 [unknown] ([kernel.kallsyms])"),
            ("[[kernel.kallsyms]]".into(), FrameKind::Kernel)
        );
        assert_eq!(
            f("\t7f [unknown] (/usr/lib/libstdc++.so.6)"),
            ("[libstdc++.so.6]".into(), FrameKind::Native)
        );
        assert_eq!(
            f("\t5966605dd52f8e00 [unknown] ([unknown])"),
            ("[unknown]".into(), FrameKind::Native)
        );
        assert_eq!(
            f("\t7f std::function<void ()>::operator()() const+0x2 (/x)").0,
            "std::function<void ()>::operator()() const"
        );
        assert!(parse_frame("\tTHIS_IS_A_WEIRD_LINE").is_none());
    }

    #[test]
    fn samples_become_stacks_root_first_with_their_periods() {
        let text = "# header\n\
            prog 10/11 [000] 1.000000: 250000 cpu-clock:\n\
            \t1 leaf+0x1 (/p)\n\t2 main+0x2 (/p)\n\n\
            prog 10/11 [000] 1.001000: 250000 cpu-clock:\n\
            \t1 leaf+0x1 (/p)\n\tWEIRD\n\t2 main+0x2 (/p)\n";
        assert!(looks_like(text.as_bytes()));
        let p = read(text.as_bytes()).unwrap();
        assert_eq!(p.samples().len(), 2);
        assert_eq!(p.totals(), vec![2, 500000]);
        assert_eq!(p.sample_types()[1].unit, "nanoseconds");
        let stack = p.samples().stacks[0];
        let mut frames = Vec::new();
        p.stack_frames_root_first(stack, &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| p.frame_name(f)).collect();
        assert_eq!(names, ["main", "leaf"]);
        assert!(
            crate::warnings(&p).any(|(k, v)| k == "perf-script-frames" && v.contains("line 8"))
        );
        let one_line = "  p 1 1.0: 1 cycles:u:  7f f+0x4 (/x)\n  p 1 1.1: 1 cycles:u:  7f g (/x)\n";
        assert!(looks_like(one_line.as_bytes()));
        assert_eq!(read(one_line.as_bytes()).unwrap().samples().len(), 2);
        let err = read("garbage line\n".as_bytes()).unwrap_err().to_string();
        assert!(err.starts_with("line 1:"), "{err}");
        assert!(!looks_like(b"main;leaf 3\n"));
    }
}
