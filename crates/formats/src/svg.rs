//! Flame graph SVG (`.svg`), drawn by inferno from the profile's collapsed stacks.

use std::io::Write;

use inferno::flamegraph::{self, Options};
use rootline_profile::Profile;

use crate::error::{FormatError, Position};
use crate::folded;

/// Writes `profile` as an interactive flame graph SVG (inferno), titled with the profile's producer.
pub fn write(profile: &Profile, writer: impl Write) -> Result<(), FormatError> {
    let lines: Vec<String> = folded::lines(profile)
        .into_iter()
        .filter(|(line, count)| !line.is_empty() && *count > 0)
        .map(|(line, count)| format!("{line} {count}"))
        .collect();
    let mut options = Options::default();
    options.title = if profile.metadata.producer.is_empty() {
        "rootline".to_owned()
    } else {
        format!("rootline — {}", profile.metadata.producer)
    };
    options.count_name = profile
        .sample_types()
        .first()
        .map_or_else(|| "samples".to_owned(), |t| t.name.clone());
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), writer)
        .map_err(|e| FormatError::invalid(Position::Input, format!("drawing the flame graph: {e}")))
}
