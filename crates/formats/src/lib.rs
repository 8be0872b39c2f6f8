//! Readers and writers of other profilers' file formats, on top of [`rootline_profile::Profile`].
//!
//! Every format lives in its own module with the same shape: a `read` function taking a
//! [`std::io::BufRead`] and returning a [`Profile`], and/or a `write` function taking a profile and a
//! [`std::io::Write`]. Errors are [`FormatError`]s that carry the [`Position`] (line or byte offset) of
//! the problem, so a caller can name the file and the place. No reader panics on any input.
//!
//! [`Format`] names the formats, picks one from a file name or a `--format` value, and dispatches to
//! the module with [`read()`] and [`write()`]. Adding a format means adding a module, a variant and two
//! match arms.
//!
//! Readers that recover from damage (a torn `.rlp` tail, unclosed slices in a trace) keep going and
//! leave a warning in the profile's metadata under a key starting with [`WARNING_PREFIX`]; callers
//! show those to the user.

#![forbid(unsafe_code)]

pub mod chromium;
pub mod differential;
mod error;
pub mod folded;
pub mod fxprof;
pub mod otlp;
pub mod perf_script;
pub mod pprof;
pub mod rlp;
pub mod speedscope;
pub mod svg;

use std::io::{BufRead, Write};
use std::path::Path;

pub use error::{FormatError, Position};
use rootline_profile::Profile;

/// Metadata `extra` keys starting with this hold warnings a reader wants the user to see.
pub const WARNING_PREFIX: &str = "warning.";

/// The warnings a reader left in `profile`'s metadata, as `(topic, message)`.
pub fn warnings(profile: &Profile) -> impl Iterator<Item = (&str, &str)> {
    profile
        .metadata
        .extra
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(WARNING_PREFIX)?, v.as_str())))
}

/// A file format rootline can read and/or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// rootline's native chunked file (`.rlp`).
    Rlp,
    /// Collapsed stacks (`.folded`): `comm;root;…;leaf count` per line.
    Folded,
    /// Flame graph SVG (`.svg`), write only.
    Svg,
    /// Chromium trace-event JSON (`.json`, `.chromium.json`), dotnet-trace's `B`/`E` dialect and more.
    Chromium,
    /// speedscope's own JSON (`.speedscope.json`).
    Speedscope,
    /// pprof `profile.proto` (`.pb.gz`, `.pprof`), gzipped or not.
    Pprof,
    /// OpenTelemetry profiles (`.otlp.pb`): an `ExportProfilesServiceRequest`, write only.
    Otlp,
    /// Firefox Profiler processed profile JSON (`.fxprof.json`), write only.
    Fxprof,
    /// Firefox Profiler processed profile JSON, gzipped (`.fxprof.json.gz`), write only.
    FxprofGz,
    /// `perf script` text (`.perf`, `.perf-script`; also found by content), read only.
    PerfScript,
}

impl Format {
    /// Every format, for help texts.
    pub const ALL: &'static [Format] = &[
        Format::Rlp,
        Format::Folded,
        Format::Svg,
        Format::Chromium,
        Format::Speedscope,
        Format::Pprof,
        Format::Otlp,
        Format::Fxprof,
        Format::FxprofGz,
        Format::PerfScript,
    ];

    /// The format's `--format` name.
    pub fn name(self) -> &'static str {
        match self {
            Format::Rlp => "rlp",
            Format::Folded => "folded",
            Format::Svg => "svg",
            Format::Chromium => "chromium",
            Format::Speedscope => "speedscope",
            Format::Pprof => "pprof",
            Format::Otlp => "otlp",
            Format::Fxprof => "fxprof",
            Format::FxprofGz => "fxprof-gz",
            Format::PerfScript => "perf-script",
        }
    }

    /// File name endings that select this format, most specific first.
    pub fn extensions(self) -> &'static [&'static str] {
        match self {
            Format::Rlp => &[".rlp"],
            Format::Folded => &[".folded", ".collapsed"],
            Format::Svg => &[".svg"],
            Format::Chromium => &[".chromium.json", ".json"],
            Format::Speedscope => &[".speedscope.json"],
            Format::Pprof => &[".pb.gz", ".pprof"],
            Format::Otlp => &[".otlp.pb"],
            Format::Fxprof => &[".fxprof.json"],
            Format::FxprofGz => &[".fxprof.json.gz"],
            Format::PerfScript => &[".perf-script", ".perf"],
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
        !matches!(
            self,
            Format::Svg | Format::Otlp | Format::Fxprof | Format::FxprofGz
        )
    }

    /// True when rootline can write this format.
    pub fn can_write(self) -> bool {
        !matches!(self, Format::PerfScript)
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
        Format::Rlp => rlp::read(reader),
        Format::Folded => folded::read(reader),
        Format::Chromium => chromium::read(reader),
        Format::Speedscope => speedscope::read(reader),
        Format::Pprof => pprof::read(reader),
        Format::PerfScript => perf_script::read(reader),
        Format::Svg | Format::Otlp | Format::Fxprof | Format::FxprofGz => {
            Err(FormatError::Unsupported {
                format: format.name(),
                action: "read",
            })
        }
    }
}

/// Writes `profile` in `format` to `writer`.
pub fn write(format: Format, profile: &Profile, writer: impl Write) -> Result<(), FormatError> {
    match format {
        Format::Rlp => rlp::write(profile, writer),
        Format::Folded => folded::write(profile, writer),
        Format::Svg => svg::write(profile, writer),
        Format::Chromium => chromium::write(profile, writer),
        Format::Speedscope => speedscope::write(profile, writer),
        Format::Pprof => pprof::write(profile, writer),
        Format::Otlp => otlp::write(profile, writer),
        Format::Fxprof => fxprof::write(profile, writer),
        Format::FxprofGz => fxprof::write_gz(profile, writer),
        Format::PerfScript => Err(FormatError::Unsupported {
            format: format.name(),
            action: "written",
        }),
    }
}
