//! Benchmark helper for `scripts/bench-repair.sh` (not part of the CLI).
//!
//! - `bench_repair [TICKS] [WORKERS]` times the repair step alone on a generated dotnet-trace-like
//!   profile (stacks cut at 100 managed frames) and prints throughput and peak memory (defaults
//!   100000 ms, 7 worker threads + main).
//! - `bench_repair chromium OUT MB` writes a generated cut profile of about MB megabytes as
//!   dotnet-trace's Chromium JSON.

#[path = "../tests/support/dotnet_like.rs"]
mod dotnet_like;
#[path = "../tests/support/dotnet_trace_files.rs"]
mod dotnet_trace_files;

use std::io::{BufWriter, Write};
use std::time::Instant;

use rootline_repair::{RepairOptions, repair};

fn main() {
    let all: Vec<String> = std::env::args().collect();
    if all.get(1).map(String::as_str) == Some("chromium") && all.len() == 4 {
        let mb: u64 = all[3].parse().expect("MB");
        return write_chromium(&all[2], mb);
    }
    let mut args = std::env::args().skip(1);
    let ticks: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let workers: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(7);
    let started = Instant::now();
    let mut cut = dotnet_like::generate(&dotnet_like::Config {
        workers,
        ticks,
        seed: 11,
        cap: 100,
        whole: false,
    })
    .cut;
    let generated = started.elapsed();
    let samples = cut.samples().len();
    let frames: u64 = cut
        .samples()
        .stacks
        .iter()
        .map(|&s| u64::from(cut.stack_depth(s)))
        .sum();
    let rss_before = peak_rss_kib();
    let started = Instant::now();
    let report = repair(&mut cut, &RepairOptions::default()).expect("repair");
    let took = started.elapsed().as_secs_f64();
    let t = report.totals();
    println!("samples            {samples}");
    println!("trie nodes         {}", cut.stacks().len());
    println!("frames in samples  {frames}");
    println!(
        "truncated          {} (exact {}, ambiguous {}, unrepairable {})",
        t.truncated, t.exact, t.ambiguous, t.unrepairable
    );
    println!("spans              {} -> {}", t.spans_before, t.spans_after);
    println!("generate           {:.2} s", generated.as_secs_f64());
    println!("repair             {took:.3} s");
    println!("samples/s          {:.0}", samples as f64 / took);
    println!("truncated/s        {:.0}", t.truncated as f64 / took);
    println!("frames/s           {:.0}", frames as f64 / took);
    println!(
        "peak RSS           {} MiB before repair, {} MiB after",
        rss_before / 1024,
        peak_rss_kib() / 1024
    );
}

/// Peak resident set size of this process (`VmHWM`), KiB; 0 where /proc is not available.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Counts bytes written.
struct Count(u64);

impl Write for Count {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes a cut profile of about `mb` megabytes as dotnet-trace's Chromium JSON to `path`.
fn write_chromium(path: &str, mb: u64) {
    let config = |ticks| dotnet_like::Config {
        workers: 7,
        ticks,
        seed: 11,
        cap: 100,
        whole: false,
    };
    let pilot = 500;
    let mut count = Count(0);
    dotnet_trace_files::write_chromium(&dotnet_like::generate(&config(pilot)).cut, &mut count)
        .expect("measure");
    let ticks = ((mb << 20) as f64 / (count.0 as f64 / pilot as f64)).ceil() as usize;
    let profile = dotnet_like::generate(&config(ticks)).cut;
    let mut out = BufWriter::new(std::fs::File::create(path).expect("create output"));
    dotnet_trace_files::write_chromium(&profile, &mut out).expect("write");
    out.flush().expect("write");
    println!(
        "wrote {path}: {} bytes, {} samples ({ticks} ms x 8 threads)",
        std::fs::metadata(path).map_or(0, |m| m.len()),
        profile.samples().len()
    );
}
