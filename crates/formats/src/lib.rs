//! Readers and writers of other profilers' file formats, on top of [`rootline_profile::Profile`].
//!
//! Every format lives in its own module with the same shape: a `read` function taking a
//! [`std::io::BufRead`] and returning a [`Profile`], and/or a `write` function taking a profile and a
//! [`std::io::Write`]. Errors are [`FormatError`]s that carry the [`Position`] (line or byte offset) of
//! the problem, so a caller can name the file and the place. No reader panics on any input.
//!
//! [`Format`] names the formats, picks one from a file name or a `--format` value, and dispatches to
//! the module with [`read`] and [`write`]. Adding a format means adding a module, a variant and two
//! match arms.

mod error;
pub mod folded;
pub mod otlp;
pub mod pprof;
pub mod svg;

use std::io::{BufRead, Write};
use std::path::Path;

pub use error::{FormatError, Position};
use rootline_profile::Profile;

/// A file format rootline can read and/or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Collapsed stacks (`.folded`): `comm;root;…;leaf count` per line.
    Folded,
    /// Flame graph SVG (`.svg`), write only.
    Svg,
    /// pprof `profile.proto` (`.pb.gz`, `.pprof`), gzipped or not.
    Pprof,
    /// OpenTelemetry profiles (`.otlp.pb`): an `ExportProfilesServiceRequest`, write only.
    Otlp,
}

impl Format {
    /// Every format, for help texts.
    pub const ALL: &'static [Format] = &[Format::Folded, Format::Svg, Format::Pprof, Format::Otlp];

    /// The format's `--format` name.
    pub fn name(self) -> &'static str {
        match self {
            Format::Folded => "folded",
            Format::Svg => "svg",
            Format::Pprof => "pprof",
            Format::Otlp => "otlp",
        }
    }

    /// File name endings that select this format, most specific first.
    pub fn extensions(self) -> &'static [&'static str] {
        match self {
            Format::Folded => &[".folded", ".collapsed"],
            Format::Svg => &[".svg"],
            Format::Pprof => &[".pb.gz", ".pprof"],
            Format::Otlp => &[".otlp.pb"],
        }
    }

    /// The format named `name` (a `--format` value), case-insensitively.
    pub fn from_name(name: &str) -> Option<Format> {
        Format::ALL
            .iter()
            .copied()
            .find(|f| f.name().eq_ignore_ascii_case(name))
    }

    /// The format a file name's ending selects. The longest matching ending wins, so
    /// `x.speedscope.json` is not taken for plain `.json`.
    pub fn from_path(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        Format::ALL
            .iter()
            .flat_map(|&f| f.extensions().iter().map(move |ext| (f, *ext)))
            .filter(|(_, ext)| name.ends_with(ext))
            .max_by_key(|(_, ext)| ext.len())
            .map(|(f, _)| f)
    }

    /// True when rootline can read this format.
    pub fn can_read(self) -> bool {
        !matches!(self, Format::Svg | Format::Otlp)
    }

    /// True when rootline can write this format.
    pub fn can_write(self) -> bool {
        true
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Reads a profile in `format` from `reader`.
pub fn read(format: Format, reader: impl BufRead) -> Result<Profile, FormatError> {
    match format {
        Format::Folded => folded::read(reader),
        Format::Pprof => pprof::read(reader),
        Format::Svg | Format::Otlp => Err(FormatError::Unsupported {
            format: format.name(),
            action: "read",
        }),
    }
}

/// Writes `profile` in `format` to `writer`.
pub fn write(format: Format, profile: &Profile, writer: impl Write) -> Result<(), FormatError> {
    match format {
        Format::Folded => folded::write(profile, writer),
        Format::Svg => svg::write(profile, writer),
        Format::Pprof => pprof::write(profile, writer),
        Format::Otlp => otlp::write(profile, writer),
    }
}
