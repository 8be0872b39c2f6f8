//! Collapsed stacks (`.folded`), the text format of FlameGraph and inferno.
//!
//! One line per stack: frames root first, separated by `;`, then a space and a count, e.g.
//! `myprog;main;work;leaf 42`. The writer puts the thread's (or process's) name first as the `comm`
//! frame, as `stackcollapse-perf` does, and writes one line per distinct stack, sorted. The reader
//! accepts what people produce: CRLF line ends, trailing spaces, no final newline, blank lines, and
//! fractional counts (kept exactly as fixed-point values; see [`fractional_unit`]). A line that is not
//! `stack count` is an error naming its line number.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use rootline_profile::{FrameKind, Profile, SampleType, ThreadId};

use crate::error::{FormatError, Position};

/// Most digits after the decimal point a count may have.
const MAX_DECIMALS: u32 = 9;

/// The sample-type unit for counts scaled by `10^decimals` (fractional folded input).
pub fn fractional_unit(decimals: u32) -> String {
    format!("1e-{decimals} count")
}

fn decimals_of_unit(unit: &str) -> u32 {
    unit.strip_prefix("1e-")
        .and_then(|rest| rest.strip_suffix(" count"))
        .and_then(|d| d.parse().ok())
        .filter(|&d| d <= MAX_DECIMALS)
        .unwrap_or(0)
}

/// One parsed line: the stack text and its count as digits with `decimals` fraction digits.
struct Line {
    stack: String,
    whole: u64,
    fraction: u64,
    decimals: u32,
}

fn parse_line(text: &str, number: u64) -> Result<Option<Line>, FormatError> {
    let text = text.trim_end_matches(['\r', '\n', ' ', '\t']);
    if text.trim().is_empty() {
        return Ok(None);
    }
    let bad = |message: String| FormatError::invalid(Position::Line(number), message);
    let Some((stack, count)) = text.rsplit_once([' ', '\t']) else {
        return Err(bad(format!(
            "expected `frame;frame;… count`, found no count in {:?}",
            shorten(text)
        )));
    };
    let stack = stack.trim_end_matches([' ', '\t']);
    if stack.is_empty() {
        return Err(bad("the stack before the count is empty".into()));
    }
    let (whole_text, fraction_text) = count.split_once('.').unwrap_or((count, ""));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole_text) || !(fraction_text.is_empty() || digits(fraction_text)) {
        return Err(bad(format!(
            "the count {:?} is not a non-negative number",
            shorten(count)
        )));
    }
    let decimals = fraction_text.len() as u32;
    if decimals > MAX_DECIMALS {
        return Err(bad(format!(
            "the count {count:?} has more than {MAX_DECIMALS} decimals"
        )));
    }
    let too_big = || bad(format!("the count {:?} is too large", shorten(count)));
    let whole: u64 = whole_text.parse().map_err(|_| too_big())?;
    let fraction: u64 = if fraction_text.is_empty() {
        0
    } else {
        fraction_text.parse().map_err(|_| too_big())?
    };
    Ok(Some(Line {
        stack: stack.to_owned(),
        whole,
        fraction,
        decimals,
    }))
}

fn shorten(text: &str) -> String {
    const LIMIT: usize = 80;
    match text.char_indices().nth(LIMIT) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

fn kind_of(name: &str) -> FrameKind {
    if name.ends_with("_[k]") {
        FrameKind::Kernel
    } else if name.ends_with("_[j]") {
        FrameKind::Jit
    } else {
        FrameKind::Native
    }
}

/// Reads collapsed stacks. All stacks go to one unnamed thread; each line becomes one sample whose
/// value is the line's count (type `samples`, or a fixed-point unit for fractional counts).
pub fn read(mut reader: impl BufRead) -> Result<Profile, FormatError> {
    let mut lines = Vec::new();
    let mut buf = Vec::new();
    let mut number = 0u64;
    let mut decimals = 0u32;
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        number += 1;
        let text = std::str::from_utf8(&buf).map_err(|e| {
            FormatError::invalid(
                Position::Line(number),
                format!("not valid UTF-8 (at byte {} of the line)", e.valid_up_to()),
            )
        })?;
        if let Some(line) = parse_line(text, number)? {
            decimals = decimals.max(line.decimals);
            lines.push((number, line));
        }
    }

    let sample_type = if decimals == 0 {
        SampleType::samples()
    } else {
        SampleType::new("samples", fractional_unit(decimals))
    };
    let mut profile = Profile::new(vec![sample_type]);
    profile.metadata.producer = "collapsed stacks".into();
    let thread = profile.intern_thread(0, 0);
    for (number, line) in lines {
        let scale = 10u64.pow(decimals);
        let fraction = line.fraction * 10u64.pow(decimals - line.decimals);
        let value = line
            .whole
            .checked_mul(scale)
            .and_then(|v| v.checked_add(fraction))
            .and_then(|v| i64::try_from(v).ok())
            .ok_or_else(|| {
                FormatError::invalid(Position::Line(number), "the count is too large")
            })?;
        let mut parent = None;
        for name in line.stack.split(';') {
            let frame = profile.intern_named_frame(name, kind_of(name));
            parent = Some(profile.intern_stack(parent, frame));
        }
        let stack = parent.expect("a non-empty stack has at least one frame");
        profile
            .push_sample(0, thread, stack, &[value])
            .map_err(|e| FormatError::invalid(Position::Line(number), e.to_string()))?;
    }
    Ok(profile)
}

/// The value column the folded count comes from: the first `samples`/`count` column, else the
/// first column; `None` when the profile has no value columns (each sample then counts 1).
pub(crate) fn count_column(profile: &Profile) -> Option<usize> {
    let types = profile.sample_types();
    types
        .iter()
        .position(|t| t.name == "samples")
        .or_else(|| types.iter().position(|t| t.unit == "count"))
        .or(if types.is_empty() { None } else { Some(0) })
}

/// The `comm` frame written first on a thread's lines: its thread name, else its process name.
fn comm_of(profile: &Profile, thread: ThreadId) -> Option<&str> {
    profile
        .thread_name(thread)
        .or_else(|| profile.process_name(profile.thread(thread).pid))
}

/// Renders the collapsed lines of `profile` (without counts' line ends), one per distinct stack,
/// sorted, with their summed counts in the profile's value unit.
pub fn lines(profile: &Profile) -> BTreeMap<String, i64> {
    let samples = profile.samples();
    let column = count_column(profile).map(|c| &samples.values[c]);
    let mut per_stack: BTreeMap<(Option<&str>, u32), i64> = BTreeMap::new();
    for (i, (&thread, &stack)) in samples.threads.iter().zip(&samples.stacks).enumerate() {
        let value = column.map_or(1, |c| c[i]);
        let entry = per_stack
            .entry((comm_of(profile, thread), stack.0))
            .or_default();
        *entry = entry.saturating_add(value);
    }
    let mut out: BTreeMap<String, i64> = BTreeMap::new();
    let mut frames = Vec::new();
    // Each line is built in one buffer (deep stacks make lines of kilobytes) and kept at its size.
    let mut line = String::new();
    for ((comm, stack), count) in per_stack {
        line.clear();
        if let Some(comm) = comm {
            push_frame_name(&mut line, comm);
        }
        profile.stack_frames_root_first(rootline_profile::StackId(stack), &mut frames);
        for &frame in &frames {
            if !line.is_empty() {
                line.push(';');
            }
            push_frame_name(&mut line, profile.frame_name(frame));
        }
        match out.get_mut(line.as_str()) {
            Some(sum) => *sum = sum.saturating_add(count),
            None => {
                out.insert(line.as_str().to_owned(), count);
            }
        }
    }
    out
}

/// Appends a frame name, replacing the characters the format cannot hold (`;` and line ends).
pub(crate) fn push_frame_name(line: &mut String, name: &str) {
    if name.is_empty() {
        return;
    }
    // Names rarely hold one of them: copy the runs between them whole.
    let mut rest = name;
    while let Some(at) = memchr::memchr3(b';', b'\n', b'\r', rest.as_bytes()) {
        line.push_str(&rest[..at]);
        line.push(if rest.as_bytes()[at] == b';' {
            ':'
        } else {
            ' '
        });
        rest = &rest[at + 1..];
    }
    line.push_str(rest);
}

/// Formats a fixed-point count with `decimals` fraction digits, trailing zeros trimmed.
fn format_count(value: i64, decimals: u32) -> String {
    if decimals == 0 {
        return value.to_string();
    }
    let scale = 10i64.pow(decimals);
    let sign = if value < 0 { "-" } else { "" };
    let abs = value.unsigned_abs();
    let whole = abs / scale as u64;
    let fraction = abs % scale as u64;
    if fraction == 0 {
        return format!("{sign}{whole}");
    }
    let digits = format!("{fraction:0width$}", width = decimals as usize);
    format!("{sign}{whole}.{}", digits.trim_end_matches('0'))
}

/// Writes `profile` as collapsed stacks: `comm;root;…;leaf count`, one sorted line per distinct stack.
pub fn write(profile: &Profile, mut writer: impl Write) -> Result<(), FormatError> {
    let decimals = count_column(profile)
        .map(|c| decimals_of_unit(&profile.sample_types()[c].unit))
        .unwrap_or(0);
    for (line, count) in lines(profile) {
        if line.is_empty() {
            continue;
        }
        writeln!(writer, "{line} {}", format_count(count, decimals))?;
    }
    writer.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn frame_names_keep_their_text_but_the_separators() {
        let mut line = String::from("comm");
        push_frame_name(&mut line, "");
        push_frame_name(&mut line, ";a;b\nc\r\nd;");
        push_frame_name(&mut line, "<T as Trait>::f::{closure#0}");
        assert_eq!(line, "comm:a:b c  d:<T as Trait>::f::{closure#0}");
    }

    use super::*;

    fn round_trip(text: &str) -> String {
        let profile = read(text.as_bytes()).unwrap();
        let mut out = Vec::new();
        write(&profile, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn reads_the_variants_people_produce() {
        let text = "a;b;c 3\r\na;b 2   \r\n\n  \na;b;c 1";
        assert_eq!(round_trip(text), "a;b 2\na;b;c 4\n");
    }

    #[test]
    fn fractional_counts_are_kept_exactly() {
        assert_eq!(
            round_trip("x;y 31.23\nx 6.1\nz 2.567\n"),
            "x 6.1\nx;y 31.23\nz 2.567\n"
        );
    }

    #[test]
    fn kernel_and_jit_annotations_set_the_kind() {
        let p = read("f;g_[k];h_[j] 1\n".as_bytes()).unwrap();
        let kinds: Vec<FrameKind> = p.frames().iter().map(|f| f.kind).collect();
        assert_eq!(
            kinds,
            [FrameKind::Native, FrameKind::Kernel, FrameKind::Jit]
        );
    }

    #[test]
    fn invalid_lines_name_their_line_number() {
        for (text, line) in [
            ("a;b 1\nno count here\n", 2),
            ("a 1\nb 2\nc x3\n", 3),
            (" 5\n", 1),
            ("a -1\n", 1),
            ("a 1.2.3\n", 1),
            ("a 99999999999999999999999\n", 1),
        ] {
            let err = read(text.as_bytes()).unwrap_err();
            assert!(
                err.to_string().starts_with(&format!("line {line}:")),
                "{text:?} gave {err}"
            );
        }
        let err = read(&b"a 1\n\xff\xfe 2\n"[..]).unwrap_err();
        assert!(
            err.to_string().starts_with("line 2: not valid UTF-8"),
            "{err}"
        );
    }

    #[test]
    fn writer_puts_the_thread_name_first() {
        let mut p = Profile::new(vec![SampleType::samples()]);
        let t = p.intern_thread(7, 8);
        p.set_thread_name(t, "worker");
        let main = p.intern_named_frame("main", FrameKind::Native);
        let semi = p.intern_named_frame("Ljava/lang/String;", FrameKind::Jit);
        let s = p.intern_stack_root_first([main, semi]).unwrap();
        p.push_sample(1, t, s, &[2]).unwrap();
        p.push_sample(2, t, s, &[3]).unwrap();
        let mut out = Vec::new();
        write(&p, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "worker;main;Ljava/lang/String: 5\n"
        );
    }

    #[test]
    fn empty_input_is_an_empty_profile() {
        let p = read(&b""[..]).unwrap();
        assert!(p.samples().is_empty());
    }
}
