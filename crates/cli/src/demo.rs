//! `rootline demo`: records a built-in CPU workload with a known call graph and writes
//! `demo.svg` (flame graph) and `demo.json` (Chromium trace, opens in Perfetto), then prints
//! the report.
//!
//! The workload is this same binary re-executed with the hidden `demo-workload` subcommand: the
//! main thread runs `checksum_pass` (→ `hash_block`, → `mix_words`) and a second thread runs
//! `render_pass` (→ `shade_row` → `shade_pixel`), each for the requested time.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rootline_capture::recorder::{RecordOptions, Target};
use rootline_formats::Format;

use crate::{input, record, report};

/// Arguments of `rootline demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// How long the workload runs, in seconds.
    #[arg(long, default_value_t = 3.0, value_name = "SECS")]
    pub duration: f64,
    /// Directory for demo.svg and demo.json.
    #[arg(long, default_value = ".", value_name = "DIR")]
    pub out_dir: PathBuf,
}

/// Arguments of the hidden `demo-workload` subcommand.
#[derive(Debug, clap::Args)]
pub struct WorkloadArgs {
    /// Seconds to run.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
}

/// Runs `rootline demo`.
pub fn run(args: Args) -> Result<()> {
    let exe = std::env::current_exe().context("can't find the rootline executable to re-run")?;
    let seconds = args.duration.clamp(0.1, 600.0);
    let opts = RecordOptions::new(Target::Command(vec![
        exe.into_os_string(),
        "demo-workload".into(),
        "--seconds".into(),
        seconds.to_string().into(),
    ]));
    let stop = record::stop_on_signals()?;
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("can't create {}", args.out_dir.display()))?;
    let svg = args.out_dir.join("demo.svg");
    let json = args.out_dir.join("demo.json");
    eprintln!("rootline: recording the built-in workload for {seconds} s …");
    let recording = record::record_to(&opts, &stop, &svg, Format::Svg, None)?;
    input::write_profile(&recording.profile, &json, Format::Chromium)?;
    record::summarize(&recording, &svg, Format::Svg);
    eprintln!(
        "rootline: also wrote {} (Chromium trace events)",
        json.display()
    );
    let column = input::default_column(&recording.profile);
    report::write_report(
        &recording.profile,
        column,
        15,
        false,
        &mut std::io::stdout().lock(),
    )?;
    Ok(())
}

/// Runs the workload (the re-executed child of `rootline demo`).
pub fn run_workload(args: WorkloadArgs) -> Result<()> {
    let until = Instant::now() + Duration::from_secs_f64(args.seconds.clamp(0.0, 600.0));
    let render = std::thread::Builder::new()
        .name("render".into())
        .spawn(move || render_pass(until))
        .context("can't start the render thread")?;
    let sum = checksum_pass(until);
    let image = render.join().unwrap_or(0);
    black_box((sum, image));
    Ok(())
}

#[inline(never)]
fn checksum_pass(until: Instant) -> u64 {
    let block: Vec<u64> = (0..4096).collect();
    let mut sum = 0u64;
    while Instant::now() < until {
        for _ in 0..64 {
            sum = sum.wrapping_add(hash_block(black_box(&block)));
            sum ^= mix_words(black_box(sum), 512);
        }
    }
    sum
}

#[inline(never)]
fn hash_block(block: &[u64]) -> u64 {
    block.iter().fold(0xcbf2_9ce4_8422_2325, |h, &w| {
        (h ^ w).wrapping_mul(0x0100_0000_01b3)
    })
}

#[inline(never)]
fn mix_words(mut x: u64, rounds: u32) -> u64 {
    for _ in 0..rounds {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    x
}

#[inline(never)]
fn render_pass(until: Instant) -> u64 {
    let mut image = 0u64;
    while Instant::now() < until {
        for y in 0..64 {
            image = image.wrapping_add(shade_row(black_box(y)));
        }
    }
    image
}

#[inline(never)]
fn shade_row(y: u32) -> u64 {
    (0..256).map(|x| shade_pixel(black_box(x), y)).sum()
}

#[inline(never)]
fn shade_pixel(x: u32, y: u32) -> u64 {
    let (fx, fy) = (f64::from(x) / 256.0, f64::from(y) / 64.0);
    let mut v = 0.0f64;
    for i in 1..16 {
        v += (fx * f64::from(i)).sin() * (fy * f64::from(i)).cos();
    }
    (v.abs() * 1000.0) as u64
}
