//! Opening profile files: format detection, progress on big inputs, and writing outputs safely.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rootline_dotnet::read_profile_with_stats;
use rootline_formats::Format;
use rootline_profile::Profile;

/// Inputs larger than this get a progress bar (when stderr is a terminal).
const PROGRESS_THRESHOLD: u64 = 50 * 1024 * 1024;

/// Picks the format of `path`: `--format` if given, else its extension, else a look at its first bytes.
pub fn input_format(path: &Path, forced: Option<&str>, head: &[u8]) -> Result<Format> {
    if let Some(name) = forced {
        return parse_format_name(name);
    }
    if let Some(format) = Format::from_path(path) {
        return Ok(format);
    }
    sniff(head).ok_or_else(|| {
        anyhow!(
            "can't tell the format of {} from its name or content; name it with --format ({})",
            path.display(),
            format_names()
        )
    })
}

/// The format selected by a `--format` value.
pub fn parse_format_name(name: &str) -> Result<Format> {
    Format::from_name(name)
        .ok_or_else(|| anyhow!("unknown format {name:?}; known formats: {}", format_names()))
}

fn format_names() -> String {
    Format::ALL
        .iter()
        .map(|f| f.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Guesses a format from the first bytes of a file.
fn sniff(head: &[u8]) -> Option<Format> {
    if head.starts_with(&rootline_profile::rlp::RLP_MAGIC) {
        return Some(Format::Rlp);
    }
    if rootline_formats::pprof::looks_like(head) {
        return Some(Format::Pprof);
    }
    if rootline_formats::perf_script::looks_like(head) {
        return Some(Format::PerfScript);
    }
    let text = std::str::from_utf8(head).ok()?;
    let first = text.lines().find(|l| !l.trim().is_empty())?;
    let (_, count) = first.trim_end().rsplit_once(' ')?;
    count.parse::<f64>().is_ok().then_some(Format::Folded)
}

/// Reads the profile in `path`, choosing the format as [`input_format`] does.
pub fn read_profile(path: &Path, forced: Option<&str>) -> Result<Profile> {
    let file = open_input(path)?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    if size == 0 {
        bail!("{} is empty: there is no profile to read", path.display());
    }
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let head = {
        use std::io::BufRead;
        reader
            .fill_buf()
            .with_context(|| format!("reading {}", path.display()))?
            .to_vec()
    };
    if is_nettrace(path, forced, &head) {
        return read_nettrace(path);
    }
    if is_perf_data(forced, &head) {
        return read_perf_data(path);
    }
    let format = input_format(path, forced, &head)?;
    if !format.can_read() {
        bail!(
            "rootline can't read {} files ({}); it writes them",
            format.name(),
            path.display()
        );
    }
    let progress = progress_bar(size, path);
    let reader = BufReader::with_capacity(
        1 << 20,
        ProgressReader {
            inner: reader,
            bar: progress.clone(),
        },
    );
    let profile = rootline_formats::read(format, reader)
        .with_context(|| format!("reading {} as {}", path.display(), format.name()))?;
    progress.finish_and_clear();
    for (_, message) in rootline_formats::warnings(&profile) {
        eprintln!("rootline: warning: {}: {message}", path.display());
    }
    Ok(profile)
}

/// Whether the input is perf record's `perf.data` (`--input-format perf-data`, or perf's magic
/// `PERFILE2` at its start).
fn is_perf_data(forced: Option<&str>, head: &[u8]) -> bool {
    match forced {
        Some(f) => f.eq_ignore_ascii_case("perf-data"),
        None => head.starts_with(b"PERFILE2"),
    }
}

/// Reads a `perf.data` file: its call chains, or its DWARF samples unwound, symbolized from the
/// binaries it names.
#[cfg(target_os = "linux")]
fn read_perf_data(path: &Path) -> Result<Profile> {
    let profile = rootline_capture::import::perf_data::read(path).with_context(|| {
        format!(
            "reading {} as perf.data (write it with `perf record`; `perf script` text is read too)",
            path.display()
        )
    })?;
    for (_, message) in rootline_formats::warnings(&profile) {
        eprintln!("rootline: warning: {}: {message}", path.display());
    }
    Ok(profile)
}

/// `perf.data` is read on Linux only (its binaries are symbolized from this machine).
#[cfg(not(target_os = "linux"))]
fn read_perf_data(path: &Path) -> Result<Profile> {
    bail!(
        "{} is a perf.data file; rootline reads those on Linux only",
        path.display()
    )
}

/// Opens `path` for reading with errors that say what is wrong with it.
fn open_input(path: &Path) -> Result<File> {
    let meta = std::fs::metadata(path).with_context(|| format!("can't open {}", path.display()))?;
    if meta.is_dir() {
        bail!("{} is a directory, not a profile file", path.display());
    }
    File::open(path).with_context(|| format!("can't open {}", path.display()))
}

/// A progress bar on stderr for inputs over [`PROGRESS_THRESHOLD`] bytes; hidden otherwise, and
/// hidden when stderr is not a terminal.
fn progress_bar(size: u64, path: &Path) -> ProgressBar {
    if size < PROGRESS_THRESHOLD {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(size), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
        )
        .expect("static progress template is valid")
        .progress_chars("=> "),
    );
    bar.set_message(format!("reading {}", path.display()));
    bar
}

/// Counts bytes read into a progress bar.
struct ProgressReader<R> {
    inner: R,
    bar: ProgressBar,
}

impl<R: Read> Read for ProgressReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bar.inc(n as u64);
        Ok(n)
    }
}

/// Picks the output format: `--format` if given, else the extension of `path`.
pub fn output_format(path: &Path, forced: Option<&str>) -> Result<Format> {
    let format = match forced {
        Some(name) => parse_format_name(name)?,
        None => Format::from_path(path).ok_or_else(|| {
            anyhow!(
                "can't tell the output format from {}; use a known extension or --format ({})",
                path.display(),
                format_names()
            )
        })?,
    };
    if !format.can_write() {
        bail!("rootline can't write {} files", format.name());
    }
    Ok(format)
}

/// Writes `profile` to `path` in `format`. The file appears only when complete (see
/// [`write_file`]).
pub fn write_profile(profile: &Profile, path: &Path, format: Format) -> Result<()> {
    write_file(path, |writer| {
        rootline_formats::write(format, profile, writer)
            .with_context(|| format!("writing {} as {}", path.display(), format.name()))
    })
}

/// Writes `path` with `fill`. The file appears only when complete: it is written beside its final
/// name and renamed into place.
pub fn write_file(path: &Path, fill: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<()> {
    let partial = partial_path(path);
    let result = (|| -> Result<()> {
        let file = File::create(&partial)
            .with_context(|| format!("can't create {}", partial.display()))?;
        let mut writer = BufWriter::with_capacity(1 << 20, file);
        fill(&mut writer)?;
        writer
            .flush()
            .with_context(|| format!("writing {}", path.display()))?;
        std::fs::rename(&partial, path)
            .with_context(|| format!("can't move {} into place", path.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}

/// The value column `name` of `profile`: a sample type's name (`samples`, `cpu`, `off_cpu`,
/// `wall`, `alloc-bytes`, …), or that name with its unit as a suffix, dashes for underscores:
/// `cpu-ns`, `off-cpu-ns` and `wall-ns` for the nanosecond columns (`wall` is `cpu` + `off_cpu`
/// in a `record --off-cpu` profile). The allocation columns also answer to pprof's names,
/// `alloc_space` and `alloc_objects`.
pub fn find_column(profile: &Profile, name: &str) -> Option<usize> {
    let types = profile.sample_types();
    if let Some(c) = types
        .iter()
        .position(|t| t.name == name || t.pprof_name() == name)
    {
        return Some(c);
    }
    let (base, unit) = name
        .strip_suffix("-ns")
        .map(|b| (b, "nanoseconds"))
        .or_else(|| name.strip_suffix("-count").map(|b| (b, "count")))
        .or_else(|| name.strip_suffix("-bytes").map(|b| (b, "bytes")))?;
    let normal = |n: &str| n.replace('_', "-");
    types
        .iter()
        .position(|t| t.unit == unit && normal(&t.name) == normal(base))
}

/// The names [`find_column`] accepts for `profile`'s columns, for error messages.
pub fn column_names(profile: &Profile) -> String {
    profile
        .sample_types()
        .iter()
        .map(|t| match t.unit.as_str() {
            "nanoseconds" => format!("{} ({}-ns)", t.name, t.name.replace('_', "-")),
            _ => t.name.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The column counted by default: the first named `samples`, else the first.
pub fn default_column(profile: &Profile) -> Option<usize> {
    let types = profile.sample_types();
    types
        .iter()
        .position(|t| t.name == "samples")
        .or(if types.is_empty() { None } else { Some(0) })
}

/// True when the input should be read as a `.nettrace`: `--format nettrace`, the extension, or the
/// magic bytes.
pub fn is_nettrace(path: &Path, forced: Option<&str>, head: &[u8]) -> bool {
    match forced {
        Some(f) => f.eq_ignore_ascii_case("nettrace"),
        None => {
            path.extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("nettrace"))
                || head.starts_with(b"Nettrace")
        }
    }
}

/// [`is_nettrace`] for a file, looking at its first bytes.
pub fn is_nettrace_file(path: &Path, forced: Option<&str>) -> bool {
    let mut head = [0u8; 8];
    let got = File::open(path)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .unwrap_or(0);
    is_nettrace(path, forced, &head[..got])
}

/// Reads a `.nettrace` file into a profile, with an error that names the file and the byte.
pub fn read_nettrace(path: &Path) -> Result<Profile> {
    let file = File::open(path).with_context(|| format!("can't open {}", path.display()))?;
    let (profile, stats) = read_profile_with_stats(BufReader::with_capacity(1 << 20, file))
        .with_context(|| format!("reading {} as nettrace", path.display()))?;
    if stats.sample_frames > 0 && stats.resolved_sample_frames < stats.sample_frames {
        eprintln!(
            "rootline: warning: {}: {} of {} managed frames have no method name (the trace lacks \
             their JIT or rundown events); they are shown as ?!0x…",
            path.display(),
            stats.sample_frames - stats.resolved_sample_frames,
            stats.sample_frames
        );
    }
    Ok(profile)
}
