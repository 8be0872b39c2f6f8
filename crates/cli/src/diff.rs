//! `rootline diff BEFORE AFTER [-o diff.svg | -o diff.folded] [--top N]`: how a profile changed.
//!
//! Without `-o` it prints the functions whose share moved most. A function's share is its self or
//! total count in percent of its own profile's total, so two recordings of different lengths or
//! rates compare; changes are in percentage points, largest first (the larger of the self and total
//! change). `-o x.svg` draws a differential flame graph and `-o x.folded` writes its input
//! (`stack BEFORE AFTER`), BEFORE's counts scaled to AFTER's total (see
//! [`rootline_formats::differential`]).

use std::collections::{HashMap, HashSet};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use rootline_formats::differential;
use rootline_profile::{FrameKind, Profile};

use crate::input;

/// Arguments of `rootline diff`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The profile before the change (any readable format).
    pub before: PathBuf,
    /// The profile after the change.
    pub after: PathBuf,
    /// Write a differential flame graph (.svg) or differential collapsed stacks (.folded)
    /// instead of printing the text diff.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// How many functions the text diff lists.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// The value column to compare (e.g. samples, cpu); default: samples, else the first.
    #[arg(long, value_name = "NAME")]
    pub value: Option<String>,
}

/// Runs `rootline diff`.
pub fn run(args: Args) -> Result<()> {
    let before = input::read_profile(&args.before, None)?;
    let after = input::read_profile(&args.after, None)?;
    for (profile, path) in [(&before, &args.before), (&after, &args.after)] {
        if profile.samples().is_empty() {
            bail!(
                "{} has no samples: there is nothing to compare",
                path.display()
            );
        }
    }
    let Some(output) = &args.output else {
        let mut out = io::stdout().lock();
        return write_text(
            &before,
            &after,
            Labels::new(&args.before, &args.after),
            args.value.as_deref(),
            args.top,
            &mut out,
        );
    };
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if name.ends_with(".svg") {
        let title = format!(
            "rootline diff: {} → {}",
            file_name(&args.before),
            file_name(&args.after)
        );
        input::write_file(output, |w| {
            differential::write_svg(&before, &after, &title, w)
                .with_context(|| format!("writing {}", output.display()))
        })?;
        eprintln!(
            "rootline: wrote {} (widths: {after}; colours: change from {before}, red grew, blue \
             shrank; {before}'s counts scaled to {after}'s total)",
            output.display(),
            before = file_name(&args.before),
            after = file_name(&args.after),
        );
    } else if name.ends_with(".folded") || name.ends_with(".collapsed") {
        input::write_file(output, |w| {
            differential::write_folded(&before, &after, w)
                .with_context(|| format!("writing {}", output.display()))
        })?;
        eprintln!(
            "rootline: wrote {} (stack, {before}'s count scaled to {after}'s total, {after}'s count)",
            output.display(),
            before = file_name(&args.before),
            after = file_name(&args.after),
        );
    } else {
        bail!(
            "rootline diff writes .svg (differential flame graph) or .folded (its input), not {}; \
             leave out -o for the text diff",
            output.display()
        );
    }
    Ok(())
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    )
}

/// How the two profiles are named in the text diff.
pub struct Labels {
    before: String,
    after: String,
}

impl Labels {
    /// Labels from the two files' names.
    pub fn new(before: &Path, after: &Path) -> Labels {
        Labels {
            before: file_name(before),
            after: file_name(after),
        }
    }
}

/// Each function's self and total count in a profile, and the profile's total.
struct Shares<'p> {
    self_time: HashMap<&'p str, i64>,
    total_time: HashMap<&'p str, i64>,
    total: i64,
}

impl<'p> Shares<'p> {
    /// Counts `column` (or 1 per sample): self goes to the leaf-most frame that is code (not a
    /// producer's pseudo-frame), total to each function once per sample however often it recurses.
    fn of(profile: &'p Profile, column: Option<usize>) -> Shares<'p> {
        let samples = profile.samples();
        let mut per_stack = HashMap::new();
        for (i, &stack) in samples.stacks.iter().enumerate() {
            let value = column.map_or(1, |c| samples.values[c][i]);
            let sum: &mut i64 = per_stack.entry(stack).or_default();
            *sum = sum.saturating_add(value);
        }
        let mut shares = Shares {
            self_time: HashMap::new(),
            total_time: HashMap::new(),
            total: 0,
        };
        let mut seen = HashSet::new();
        for (stack, value) in per_stack {
            shares.total = shares.total.saturating_add(value);
            seen.clear();
            let mut leaf = true;
            for frame in profile.stack_frames(stack) {
                if matches!(profile.frame(frame).kind, FrameKind::Pseudo) {
                    continue;
                }
                let name = profile.frame_name(frame);
                if leaf {
                    *shares.self_time.entry(name).or_default() += value;
                    leaf = false;
                }
                if seen.insert(name) {
                    *shares.total_time.entry(name).or_default() += value;
                }
            }
        }
        shares
    }

    /// `name`'s (self, total) in percent of the total.
    fn percent(&self, name: &str) -> (f64, f64) {
        let pct = |v: Option<&i64>| {
            if self.total == 0 {
                0.0
            } else {
                v.copied().unwrap_or(0) as f64 * 100.0 / self.total as f64
            }
        };
        (
            pct(self.self_time.get(name)),
            pct(self.total_time.get(name)),
        )
    }
}

/// The column named `value` in `profile`, else the one `report` counts by default.
fn column(profile: &Profile, value: Option<&str>, label: &str) -> Result<Option<usize>> {
    match value {
        None => Ok(input::default_column(profile)),
        Some(name) => match input::find_column(profile, name) {
            Some(c) => Ok(Some(c)),
            None => bail!("{label} has no value column {name:?}"),
        },
    }
}

/// One function's shares before and after, in percent.
struct Row<'p> {
    name: &'p str,
    before: (f64, f64),
    after: (f64, f64),
}

impl Row<'_> {
    fn self_change(&self) -> f64 {
        self.after.0 - self.before.0
    }
    fn total_change(&self) -> f64 {
        self.after.1 - self.before.1
    }
    /// The larger of the self and total change, unsigned: what the rows are sorted by.
    fn moved(&self) -> f64 {
        self.self_change().abs().max(self.total_change().abs())
    }
}

/// Writes the text diff: the `top` functions whose self or total share moved most, largest first.
pub fn write_text(
    before: &Profile,
    after: &Profile,
    labels: Labels,
    value: Option<&str>,
    top: usize,
    out: &mut dyn Write,
) -> Result<()> {
    let old = Shares::of(before, column(before, value, &labels.before)?);
    let new = Shares::of(after, column(after, value, &labels.after)?);
    let names: HashSet<&str> = old
        .total_time
        .keys()
        .chain(new.total_time.keys())
        .copied()
        .collect();
    let mut rows: Vec<Row> = names
        .into_iter()
        .map(|name| Row {
            name,
            before: old.percent(name),
            after: new.percent(name),
        })
        .collect();
    rows.sort_by(|a, b| {
        b.moved()
            .total_cmp(&a.moved())
            .then(b.self_change().abs().total_cmp(&a.self_change().abs()))
            .then(a.name.cmp(b.name))
    });
    writeln!(
        out,
        "Changes from {} (total {}) to {} (total {})",
        labels.before, old.total, labels.after, new.total
    )?;
    writeln!(
        out,
        "  shares in percent of each profile's own total; changes in percentage points, largest first"
    )?;
    writeln!(out, "  {:<25}   {:<25}", "self %", "total %")?;
    writeln!(
        out,
        "  {:>7} {:>7} {:>8}   {:>7} {:>7} {:>8}   function",
        "before", "after", "change", "before", "after", "change"
    )?;
    for row in rows.iter().take(top).filter(|r| r.moved() > 0.0) {
        writeln!(
            out,
            "  {:>7.2} {:>7.2} {:>+8.2}   {:>7.2} {:>7.2} {:>+8.2}   {}",
            row.before.0,
            row.after.0,
            row.self_change(),
            row.before.1,
            row.after.1,
            row.total_change(),
            row.name
        )?;
    }
    Ok(())
}
