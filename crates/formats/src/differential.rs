//! Differential collapsed stacks and flame graphs of two profiles, "before" and "after".
//!
//! Stacks are compared by their frames alone, root first, without the thread or process name
//! (which differ between two runs of a program). Each output line is `root;…;leaf BEFORE AFTER`,
//! the two-count format of FlameGraph's `difffolded.pl` that inferno and `flamegraph.pl` draw as a
//! differential flame graph: widths are AFTER's counts, red marks a stack that grew, blue one that
//! shrank.
//!
//! **Normalisation**: when the totals differ, BEFORE's counts are scaled by AFTER's total over
//! BEFORE's (inferno's `normalize`), so a recording that ran twice as long is not drawn as
//! everything having grown; colours then show changes in each stack's share of its profile.

use std::collections::BTreeMap;
use std::io::Write;

use inferno::differential;
use inferno::flamegraph::{self, Options};
use rootline_profile::Profile;

use crate::error::{FormatError, Position};
use crate::folded;

/// The summed count of each distinct stack of `profile` as a collapsed line of frame names (no
/// thread or process name), in the unit `.folded` files use (samples, else the first column).
pub fn code_lines(profile: &Profile) -> BTreeMap<String, i64> {
    let samples = profile.samples();
    let column = folded::count_column(profile).map(|c| &samples.values[c]);
    let mut per_stack: BTreeMap<u32, i64> = BTreeMap::new();
    for (i, stack) in samples.stacks.iter().enumerate() {
        let value = column.map_or(1, |c| c[i]);
        let entry = per_stack.entry(stack.0).or_default();
        *entry = entry.saturating_add(value);
    }
    let mut lines: BTreeMap<String, i64> = BTreeMap::new();
    let mut frames = Vec::new();
    for (stack, count) in per_stack {
        profile.stack_frames_root_first(rootline_profile::StackId(stack), &mut frames);
        let mut line = String::new();
        for &frame in &frames {
            if !line.is_empty() {
                line.push(';');
            }
            folded::push_frame_name(&mut line, profile.frame_name(frame));
        }
        if line.is_empty() {
            continue;
        }
        let entry = lines.entry(line).or_default();
        *entry = entry.saturating_add(count);
    }
    lines
}

/// Renders `lines` as collapsed text, leaving out counts inferno can't take (zero or negative).
fn collapsed_text(lines: &BTreeMap<String, i64>) -> String {
    let mut text = String::new();
    for (line, &count) in lines {
        if count > 0 {
            text.push_str(line);
            text.push(' ');
            text.push_str(itoa::Buffer::new().format(count));
            text.push('\n');
        }
    }
    text
}

/// Writes the differential collapsed stacks of `before` and `after` (`stack BEFORE AFTER` per
/// line, BEFORE normalised to AFTER's total).
pub fn write_folded(
    before: &Profile,
    after: &Profile,
    mut writer: impl Write,
) -> Result<(), FormatError> {
    let before = collapsed_text(&code_lines(before));
    let after = collapsed_text(&code_lines(after));
    let options = differential::Options {
        normalize: true,
        strip_hex: false,
    };
    differential::from_readers(options, before.as_bytes(), after.as_bytes(), &mut writer)?;
    writer.flush()?;
    Ok(())
}

/// Writes a differential flame graph SVG (inferno): AFTER's stacks, coloured by their change from
/// BEFORE (red grew, blue shrank), BEFORE normalised to AFTER's total.
pub fn write_svg(
    before: &Profile,
    after: &Profile,
    title: &str,
    writer: impl Write,
) -> Result<(), FormatError> {
    let mut diff = Vec::new();
    write_folded(before, after, &mut diff)?;
    let diff = String::from_utf8(diff)
        .map_err(|e| FormatError::invalid(Position::Input, format!("differential stacks: {e}")))?;
    let mut options = Options::default();
    options.title = title.to_owned();
    options.subtitle =
        Some("width: after; colour: change from before (red grew, blue shrank), normalised".into());
    options.count_name = after
        .sample_types()
        .first()
        .map_or_else(|| "samples".to_owned(), |t| t.name.clone());
    flamegraph::from_lines(&mut options, diff.lines(), writer).map_err(|e| {
        FormatError::invalid(
            Position::Input,
            format!("drawing the differential flame graph: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rootline_profile::{FrameKind, SampleType};

    fn profile(counts: &[(&[&str], i64)], thread_name: &str) -> Profile {
        let mut p = Profile::new(vec![SampleType::new("samples", "count")]);
        let thread = p.intern_thread(1, 1);
        p.set_thread_name(thread, thread_name);
        for (frames, count) in counts {
            let ids: Vec<_> = frames
                .iter()
                .map(|n| p.intern_named_frame(n, FrameKind::Native))
                .collect();
            let stack = p.intern_stack_root_first(ids).unwrap();
            p.push_sample(0, thread, stack, &[*count]).unwrap();
        }
        p
    }

    #[test]
    fn before_is_scaled_to_after_and_threads_do_not_split_stacks() {
        let before = profile(&[(&["main", "a"], 10), (&["main", "b"], 10)], "v1");
        let after = profile(&[(&["main", "a"], 20), (&["main", "b"], 60)], "v2");
        let mut out = Vec::new();
        write_folded(&before, &after, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort();
        // BEFORE's 20 samples scaled to AFTER's 80: 10 → 40 each.
        assert_eq!(lines, ["main;a 40 20", "main;b 40 60"]);
    }
}
