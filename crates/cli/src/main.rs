//! `rootline`: the command-line front end. It parses arguments, opens files, shows progress and
//! prints; the work itself lives in the library crates.

mod agent;
mod convert;
#[cfg(target_os = "linux")]
mod demo;
mod diff;
mod dotnet;
mod exit;
mod input;
#[cfg(target_os = "linux")]
mod record;
#[cfg(target_os = "linux")]
mod record_alloc;
mod repair;
mod report;
mod view;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Whole, true stacks from live Linux processes — recorded, converted, repaired and reported.
#[derive(Debug, Parser)]
#[command(name = "rootline", version, about, long_about = LONG_ABOUT)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

const LONG_ABOUT: &str = "\
rootline records, converts, repairs and reports CPU profiles whose stacks are whole (they run to the
thread's root, with no depth cap; anything unreadable ends in an explicit [truncated: reason] frame)
and true (no caller skipped, no frame invented).

Formats are chosen by file extension, or with --format:
  .rlp (native), .folded (collapsed stacks), .svg (flame graph, write only),
  .json/.chromium.json (Chromium trace events), .speedscope.json, .pb.gz/.pprof (pprof),
  .otlp.pb (OpenTelemetry profiles, write only), .nettrace (.NET EventPipe trace, read only),
  .fxprof.json/.fxprof.json.gz (Firefox Profiler, write only: open in profiler.firefox.com)

`rootline view FILE` shows any readable profile in an interactive viewer served on 127.0.0.1;
`rootline diff BEFORE AFTER [-o diff.svg]` compares two.";

#[derive(Debug, Subcommand)]
enum Command {
    /// Sample live processes (-p), every CPU (-a) or a command (-- CMD) with whole, true stacks.
    #[cfg(target_os = "linux")]
    Record(record::Args),
    /// Record a built-in workload with a known call graph; writes demo.svg and demo.json.
    #[cfg(target_os = "linux")]
    Demo(demo::Args),
    /// The workload `rootline demo` records (runs in the re-executed child).
    #[cfg(target_os = "linux")]
    #[command(name = "demo-workload", hide = true)]
    DemoWorkload(demo::WorkloadArgs),
    /// Convert a profile from one format to another (formats chosen by extension or --format).
    Convert(convert::Args),
    /// Profile continuously (whole host, PIDs, regex or cgroup) and export OTLP, pprof or .rlp.
    Agent(agent::Args),
    /// Print a text summary: top functions by self and total time, and the hottest paths.
    Report(report::Args),
    /// .NET: trace a live process over its diagnostics socket (EventPipe), list .NET processes.
    Dotnet(dotnet::Args),
    /// Repair stacks another profiler cut at its depth cap (dotnet-trace 100, perf 127).
    Repair(repair::Args),
    /// Compare two profiles: a text diff of function shares, or a differential flame graph (-o x.svg).
    Diff(diff::Args),
    /// Show a profile in an interactive viewer (speedscope, built in) served on 127.0.0.1.
    ///
    /// For the Firefox Profiler instead, write the profile with
    /// `rootline convert FILE -o FILE.fxprof.json.gz` and load that file in profiler.firefox.com.
    View(view::Args),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // Help and --version go to stdout with status 0; usage errors exit 1 (see DESIGN.md §6).
            let code = if err.use_stderr() { 1 } else { 0 };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    let result = match cli.command {
        #[cfg(target_os = "linux")]
        Command::Record(args) => record::run(args),
        #[cfg(target_os = "linux")]
        Command::Demo(args) => demo::run(args),
        #[cfg(target_os = "linux")]
        Command::DemoWorkload(args) => demo::run_workload(args),
        Command::Convert(args) => convert::run(args),
        Command::Report(args) => report::run(args),
        Command::Dotnet(args) => dotnet::run(args),
        Command::Repair(args) => repair::run(args),
        Command::Agent(args) => agent::run(args),
        Command::View(args) => view::run(args),
        Command::Diff(args) => diff::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("rootline: error: {err:#}");
            ExitCode::from(exit::code_of(&err))
        }
    }
}

/// True when the error is a closed stdout (e.g. `rootline report … | head`), which is not a failure.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
