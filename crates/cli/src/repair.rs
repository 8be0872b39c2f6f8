//! `rootline repair IN -o OUT [--report] [--cap N]`: re-attach the base frames that another
//! profiler's depth cap cut off (see the rootline-repair crate).

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rootline_formats::Format;
use rootline_repair::{RepairOptions, repair_with_progress};

use crate::input;

/// Profiles with more samples than this get a progress bar while repairing (stderr terminals only).
const PROGRESS_SAMPLES: usize = 1_000_000;

/// Arguments of `rootline repair`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The profile to repair (format from its extension or content).
    pub input: PathBuf,
    /// Where to write the repaired profile; its format is the input's unless the extension of
    /// OUT or --format says otherwise.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Print per thread: samples, truncated, exact, ambiguous, unrepairable, spans merged.
    #[arg(long)]
    pub report: bool,
    /// The producer's depth cap, when the file does not tell it (dotnet-trace 100 and perf 127 are
    /// known; otherwise it is detected from the depth histogram).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub cap: Option<u32>,
    /// Output format, overriding the input's format and the extension of --output.
    #[arg(long, value_name = "F")]
    pub format: Option<String>,
    /// Input format, overriding the extension and content of INPUT.
    #[arg(long, value_name = "F")]
    pub input_format: Option<String>,
}

/// Runs `rootline repair`.
pub fn run(args: Args) -> Result<()> {
    // A .nettrace is read, never written: its repaired profile needs an output format.
    let nettrace = crate::input::is_nettrace_file(&args.input, args.input_format.as_deref());
    let in_format = match nettrace {
        true => None,
        false => Some(input_format(&args.input, args.input_format.as_deref())?),
    };
    let out_format = match (&args.format, Format::from_path(&args.output), in_format) {
        (Some(_), _, _) => input::output_format(&args.output, args.format.as_deref())?,
        (None, Some(format), _) => input::output_format(&args.output, Some(format.name()))?,
        (None, None, Some(in_format)) => in_format,
        (None, None, None) => anyhow::bail!(
            "rootline can't write .nettrace files; name the output {} with a known extension \
             (.json for Chromium, as dotnet-trace converts, .speedscope.json, .rlp, …) or give \
             --format",
            args.output.display()
        ),
    };
    let forced = in_format.map(|f| f.name()).or(args.input_format.as_deref());
    let mut profile = input::read_profile(&args.input, forced)?;
    let options = RepairOptions {
        cap: args.cap,
        ..RepairOptions::default()
    };
    let bar = progress_bar(profile.samples().len());
    let report = repair_with_progress(&mut profile, &options, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .with_context(|| format!("repairing {}", args.input.display()))?;
    bar.finish_and_clear();
    input::write_profile(&profile, &args.output, out_format)?;

    if args.report {
        print!("{report}");
    }
    let t = report.totals();
    let cap = match report.cap {
        Some(cap) => format!("depth cap {} ({})", cap.depth, cap.source.as_str()),
        None => "no depth cap known or detected (use --cap N to give one)".to_string(),
    };
    eprintln!(
        "rootline: {cap}: {} of {} samples truncated: {} repaired exactly, {} repaired with a \
         guess (ambiguous, marked [repair: frames unknown]), {} unrepairable (kept, marked [truncated]); {} spans merged; \
         wrote {} ({out_format})",
        t.truncated,
        t.samples,
        t.exact,
        t.ambiguous,
        t.unrepairable,
        t.spans_merged(),
        args.output.display()
    );
    Ok(())
}

/// The input's format, decided the way [`input::read_profile`] decides it.
fn input_format(path: &Path, forced: Option<&str>) -> Result<Format> {
    let mut head = Vec::with_capacity(4096);
    if let Ok(file) = std::fs::File::open(path) {
        // Errors opening or reading are reported by read_profile with the file's name.
        let _ = file.take(4096).read_to_end(&mut head);
    }
    input::input_format(path, forced, &head)
}

fn progress_bar(samples: usize) -> ProgressBar {
    if samples < PROGRESS_SAMPLES {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(samples as u64), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("repairing [{bar:40}] {pos}/{len} samples ({eta})")
            .expect("static progress template is valid")
            .progress_chars("=> "),
    );
    bar
}
