//! `rootline convert IN -o OUT [--format F]`.

use std::path::PathBuf;

use anyhow::{Result, bail};

use crate::input;

/// Arguments of `rootline convert`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The profile to read (format from its extension or content).
    pub input: PathBuf,
    /// Where to write the converted profile (format from its extension).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Output format, overriding the extension of --output.
    #[arg(long, value_name = "F")]
    pub format: Option<String>,
    /// Input format, overriding the extension and content of INPUT.
    #[arg(long, value_name = "F")]
    pub input_format: Option<String>,
    /// Write only this value column (e.g. cpu-ns, off-cpu-ns, wall-ns, samples): what folded and
    /// SVG count, and the one profile speedscope shows.
    #[arg(long, value_name = "NAME")]
    pub value: Option<String>,
}

/// Runs `rootline convert`.
pub fn run(args: Args) -> Result<()> {
    let out_format = input::output_format(&args.output, args.format.as_deref())?;
    let mut profile = input::read_profile(&args.input, args.input_format.as_deref())?;
    if let Some(name) = &args.value {
        let Some(column) = input::find_column(&profile, name) else {
            bail!(
                "{} has no value column {name:?}; it has: {}",
                args.input.display(),
                input::column_names(&profile)
            );
        };
        profile.keep_value_column(column)?;
    }
    input::write_profile(&profile, &args.output, out_format)?;
    eprintln!(
        "rootline: wrote {} ({}, {} samples, {} stack-trie nodes)",
        args.output.display(),
        out_format,
        profile.samples().len(),
        profile.stacks().len()
    );
    Ok(())
}
