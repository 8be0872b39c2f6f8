//! `rootline dotnet collect|ps`: EventPipe traces from live .NET processes over the diagnostics
//! socket, and reading `.nettrace` files for `convert` and `report`.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use rootline_dotnet::collect::{CollectOptions, StopReason, collect};
use rootline_dotnet::ipc::{
    DiagnosticsClient, E_UNKNOWN_COMMAND, IpcError, PerfMapType, Provider, SessionConfig,
};
use rootline_dotnet::{discover, read_profile_with_stats};
use rootline_repair::RepairOptions;

use crate::exit::{Exit, PERMISSION, TARGET_GONE};
use crate::input;

/// Arguments of `rootline dotnet`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Trace a live .NET process (CPU samples of every managed thread, and with --alloc GC
    /// allocation ticks) over its diagnostics socket.
    Collect(CollectArgs),
    /// List the .NET processes that have a diagnostics socket.
    Ps,
    /// Turn perf maps (/tmp/perf-PID.map) on or off in a live .NET 8+ process.
    Perfmap(PerfmapArgs),
}

/// Arguments of `rootline dotnet perfmap`.
#[derive(Debug, clap::Args)]
struct PerfmapArgs {
    /// The process.
    #[arg(short, long)]
    pid: u32,
    /// Turn perf maps off instead of on.
    #[arg(long)]
    disable: bool,
}

/// Arguments of `rootline dotnet collect`.
#[derive(Debug, clap::Args)]
struct CollectArgs {
    /// The process to trace.
    #[arg(short, long)]
    pid: u32,
    /// Stop after this many seconds (default: at Ctrl-C or when the process exits).
    #[arg(long, value_name = "SECS")]
    duration: Option<f64>,
    /// EventPipe providers in dotnet-trace syntax, `Name[:Keywords[:Level[:Args]]]`, comma-separated
    /// (default: dotnet-trace's cpu-sampling profile: SampleProfiler and the runtime's JIT/loader
    /// events).
    #[arg(long, value_name = "LIST")]
    providers: Option<String>,
    /// Where to write the profile; the format comes from the extension (`.nettrace` keeps the raw
    /// trace).
    #[arg(short, long)]
    output: PathBuf,
    /// Output format, overriding the extension of --output (`nettrace` for the raw trace).
    #[arg(long, value_name = "F")]
    format: Option<String>,
    /// The runtime's buffer for the session, in MB.
    #[arg(long, default_value_t = 256, value_name = "MB")]
    buffer_mb: u32,
    /// Keep stacks as EventPipe cut them (at 100 frames) instead of repairing them.
    #[arg(long)]
    no_repair: bool,
    /// Also record GC allocation ticks: about every 100 KB a thread allocates, the stack and type
    /// of the allocation that crossed the mark, weighed by the bytes since the previous tick.
    /// Adds the value columns `alloc-bytes` and `alloc-count` (ticks) to the CPU samples' own;
    /// each tick's stack ends in `[alloc: TYPE]`. Pick one with `report/convert --value
    /// alloc-bytes`.
    #[arg(long)]
    alloc: bool,
}

/// Runs `rootline dotnet …`.
pub fn run(args: Args) -> Result<()> {
    match args.command {
        Command::Collect(a) => run_collect(a),
        Command::Ps => run_ps(),
        Command::Perfmap(a) => run_perfmap(a),
    }
}

fn run_perfmap(args: PerfmapArgs) -> Result<()> {
    let socket = discover::find_socket(args.pid).map_err(|e| ipc_error(e, args.pid))?;
    let client = DiagnosticsClient::new(socket);
    let result = if args.disable {
        client.disable_perf_map()
    } else {
        client.enable_perf_map(PerfMapType::PerfMap)
    };
    match result {
        Ok(()) => {
            eprintln!(
                "rootline: perf maps {} in process {}",
                if args.disable { "disabled" } else { "enabled" },
                args.pid
            );
            Ok(())
        }
        Err(IpcError::Server {
            hresult: E_UNKNOWN_COMMAND,
            ..
        }) => bail!(
            "process {} runs a .NET older than 8, which cannot switch perf maps on while running \
             (it answered \"unknown command\"); {}",
            args.pid,
            rootline_dotnet::perfmap::START_TIME_HINT
        ),
        Err(e) => Err(ipc_error(e, args.pid)),
    }
}

fn run_ps() -> Result<()> {
    let processes = discover::list_processes();
    if processes.is_empty() {
        eprintln!("rootline: no .NET process with a diagnostics socket is visible to this user");
        return Ok(());
    }
    println!("{:>8}  {:<16}  COMMAND", "PID", "NAME");
    for p in processes {
        println!("{:>8}  {:<16}  {}", p.pid, p.name, p.command_line);
    }
    Ok(())
}

fn run_collect(args: CollectArgs) -> Result<()> {
    let raw = match &args.format {
        Some(f) => f.eq_ignore_ascii_case("nettrace"),
        None => args
            .output
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("nettrace")),
    };
    // Check the output format before tracing, not after.
    let out_format = if raw {
        None
    } else {
        Some(input::output_format(&args.output, args.format.as_deref())?)
    };
    let mut providers = match &args.providers {
        Some(list) => Provider::parse_list(list).map_err(|e| anyhow!("--providers: {e}"))?,
        None => Provider::cpu_sampling(),
    };
    if args.alloc {
        Provider::add_allocation_ticks(&mut providers);
    }
    let duration = match args.duration {
        Some(s) if !(s > 0.0 && s.is_finite()) => {
            bail!("--duration must be a positive number of seconds")
        }
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    let options = CollectOptions {
        session: SessionConfig {
            circular_buffer_mb: args.buffer_mb,
            request_rundown: true,
            providers,
        },
        duration,
        ..CollectOptions::default()
    };

    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::AcqRel) {
            // A second Ctrl-C: leave now; the runtime abandons the session when our socket closes.
            std::process::exit(130);
        }
        eprintln!("rootline: stopping the session (the runtime sends its rundown; Ctrl-C again to quit now)");
    })
    .context("installing the Ctrl-C handler")?;

    let trace_path = partial_trace_path(&args.output);
    // Unbuffered: the stream arrives in large chunks, and what arrived is on disk if we are killed.
    let mut writer = File::create(&trace_path)
        .with_context(|| format!("can't create {}", trace_path.display()))?;
    eprintln!(
        "rootline: collecting from process {}{} (Ctrl-C to stop)",
        args.pid,
        duration.map_or(String::new(), |d| format!(" for {:.1} s", d.as_secs_f64()))
    );
    let summary = collect(args.pid, &options, &mut writer, &stop);
    drop(writer);
    let summary = match summary {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_file(&trace_path);
            return Err(ipc_error(e, args.pid));
        }
    };
    if let Some(e) = &summary.stop_error {
        eprintln!("rootline: warning: stopping the session: {e}");
    }
    if !summary.complete {
        eprintln!(
            "rootline: warning: the runtime did not finish the trace in time; it may lack the \
             rundown (method names)"
        );
    }
    if summary.reason == StopReason::StreamEnded {
        eprintln!(
            "rootline: the runtime ended the session (did process {} exit?)",
            args.pid
        );
    }

    let Some(out_format) = out_format else {
        std::fs::rename(&trace_path, &args.output)
            .with_context(|| format!("can't move the trace to {}", args.output.display()))?;
        eprintln!(
            "rootline: wrote {} ({} bytes of nettrace)",
            args.output.display(),
            summary.bytes
        );
        return Ok(());
    };
    let file =
        File::open(&trace_path).with_context(|| format!("can't open {}", trace_path.display()))?;
    let read = read_profile_with_stats(BufReader::with_capacity(1 << 20, file));
    let (mut profile, stats) = match read {
        Ok(r) => r,
        Err(e) => {
            return Err(anyhow!(e).context(format!(
                "the collected trace is damaged; it is kept in {} for inspection",
                trace_path.display()
            )));
        }
    };
    let _ = std::fs::remove_file(&trace_path);
    profile.metadata.producer = "rootline dotnet collect (EventPipe)".into();
    let repaired = if args.no_repair {
        String::new()
    } else {
        let report = rootline_repair::repair(&mut profile, &RepairOptions::default())
            .context("repairing the collected stacks")?;
        let t = report.totals();
        format!(
            "; repair: {} exact, {} ambiguous, {} unrepairable",
            t.exact, t.ambiguous, t.unrepairable
        )
    };
    input::write_profile(&profile, &args.output, out_format)?;
    let named = if stats.sample_frames == 0 {
        100.0
    } else {
        100.0 * stats.resolved_sample_frames as f64 / stats.sample_frames as f64
    };
    let allocations = if args.alloc || stats.allocation_ticks > 0 {
        let bytes: u64 = profile
            .sample_types()
            .iter()
            .position(|t| *t == rootline_profile::SampleType::alloc_bytes())
            .map_or(0, |c| {
                u64::try_from(profile.totals().get(c).copied().unwrap_or(0)).unwrap_or(0)
            });
        format!(
            ", {} allocation ticks for {:.1} MB allocated ({} cut at the frame limit)",
            stats.allocation_ticks,
            bytes as f64 / 1e6,
            stats.allocation_ticks_at_cap
        )
    } else {
        String::new()
    };
    eprintln!(
        "rootline: wrote {} ({out_format}, {} thread samples{allocations}, {named:.1}% of managed \
         frames named, {} samples cut at EventPipe's {}-frame limit{repaired})",
        args.output.display(),
        stats.managed_samples + stats.external_samples,
        stats.samples_at_cap,
        rootline_dotnet::EVENTPIPE_DEPTH_CAP
    );
    Ok(())
}

fn partial_trace_path(output: &Path) -> PathBuf {
    let mut name = output.file_name().unwrap_or_default().to_os_string();
    name.push(".nettrace.partial");
    output.with_file_name(name)
}

/// Maps IPC failures to the CLI's exit codes, with what to do about them.
fn ipc_error(e: IpcError, pid: u32) -> anyhow::Error {
    match &e {
        IpcError::NoProcess { .. } => anyhow::Error::new(Exit {
            code: TARGET_GONE,
            message: format!("process {pid} does not exist"),
        }),
        IpcError::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
            anyhow::Error::new(Exit {
                code: PERMISSION,
                message: format!(
                    "{e}; run rootline as the user that runs process {pid}, or as root"
                ),
            })
        }
        _ => anyhow!(e),
    }
}
