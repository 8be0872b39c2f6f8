//! Times repair on a generated dotnet-trace-like profile (the cut one) and prints throughput and
//! peak memory. Used by `scripts/bench-repair.sh`.
//!
//! Usage: `bench_repair [TICKS] [WORKERS]` (defaults 100000 ms, 7 worker threads + main).

#[path = "../tests/support/dotnet_like.rs"]
mod dotnet_like;

use std::time::Instant;

use rootline_repair::{RepairOptions, repair};

fn main() {
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
