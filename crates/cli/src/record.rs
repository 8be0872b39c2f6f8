//! `rootline record [-F HZ] [--duration SECS] [-o OUT] [--kernel] (-p PID[,PID…] | -a | -- CMD…)`.
//!
//! `.rlp` output is written incrementally (one chunk per second), so even a killed recorder
//! leaves a readable file; other formats are written when recording ends. Ctrl-C or SIGTERM end
//! the recording cleanly. A summary goes to stderr.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rootline_capture::recorder::{self, ChunkSink, RecordError, RecordOptions, Recording, Target};
use rootline_dotnet::perfmap::{Outcome, PerfMapGuard, START_TIME_HINT};
use rootline_formats::Format;
use rootline_profile::Profile;
use rootline_profile::rlp::RlpWriter;

use crate::exit::Exit;
use crate::{input, report, view};

/// Arguments of `rootline record`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["pid", "all_cpus", "command"])))]
pub struct Args {
    /// Samples per second of CPU time, per thread.
    #[arg(short = 'F', long = "freq", default_value_t = 999, value_name = "HZ")]
    pub frequency: u32,
    /// Stop after this many seconds (default: until Ctrl-C or the target ends).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Where to write the profile; the format follows the extension (or --format).
    #[arg(short, long, default_value = "rootline.rlp")]
    pub output: PathBuf,
    /// Output format, overriding the extension of --output.
    #[arg(long, value_name = "F")]
    pub format: Option<String>,
    /// Also record kernel frames (callchain + /proc/kallsyms).
    #[arg(long)]
    pub kernel: bool,
    /// Bytes of user stack copied with each sample.
    #[arg(long, default_value_t = 16384, value_name = "BYTES")]
    pub stack_size: u32,
    /// Continue stacks deeper than the copy from the live process's memory (process_vm_readv),
    /// reading at most this many bytes per sample (default 32 MiB: a 10,000-deep recursion with
    /// 1 KiB of locals per frame); a stack needing more ends in [truncated: budget]. 0 never reads
    /// live memory (such stacks end in [truncated: stack-copy-exhausted]).
    #[arg(long, default_value_t = rootline_capture::recorder::DEFAULT_LIVE_STACK_BUDGET, value_name = "BYTES")]
    pub live_stack_budget: usize,
    /// Record these running processes (comma-separated PIDs), including threads they create later.
    #[arg(short, long, value_delimiter = ',', value_name = "PID")]
    pub pid: Vec<u32>,
    /// Record every process on every CPU.
    #[arg(short = 'a', long = "all-cpus")]
    pub all_cpus: bool,
    /// Don't ask runtimes to write perf maps (by default rootline sends .NET 8+ processes given
    /// with -p the diagnostics-IPC EnablePerfMap command before sampling and DisablePerfMap after,
    /// and asks HotSpot JVMs for `Compiler.perfmap` over their attach protocol, as `jcmd` does:
    /// before sampling a JVM given with -p, and whenever a JVM's code has no name).
    #[arg(long)]
    pub no_perfmap: bool,
    /// Also record where threads wait (off-CPU / wall-clock profile): each time a thread leaves
    /// the CPU its stack is taken and weighed by how long it stayed off, with a leaf frame saying
    /// why, as the kernel's sched_switch tracepoint tells it: [off-cpu: sleeping],
    /// [off-cpu: uninterruptible], [off-cpu: stopped] or [off-cpu: preempted] ([off-cpu: blocked]
    /// when tracefs is not there to tell the state). Adds the value columns off_cpu and wall
    /// (cpu + off_cpu, nanoseconds): `rootline report --value wall-ns`. With -a, every task's
    /// switches on the host (mind --off-cpu-max-rate).
    #[arg(long)]
    pub off_cpu: bool,
    /// With --off-cpu: intervals off the CPU shorter than this many microseconds are counted and
    /// their time summed per thread as [off-cpu: short, not unwound], without unwinding them.
    #[arg(long, default_value_t = 100, value_name = "US", requires = "off_cpu")]
    pub off_cpu_min_us: u64,
    /// With --off-cpu: most switch-outs per second whose stacks are taken, over all recorded
    /// threads (the kernel's stack copy is the cost of a switch; past the rate, switch-outs are
    /// not sampled for the rest of a 100 ms window). The time of the others is kept, summed per
    /// thread as [off-cpu: over the rate cap, not unwound], and counted in the summary. 0: every
    /// switch.
    #[arg(long, default_value_t = recorder::DEFAULT_OFF_CPU_MAX_RATE, value_name = "N",
          requires = "off_cpu")]
    pub off_cpu_max_rate: u32,
    /// Show the recording in the viewer (as `rootline view` does) once recording ends.
    #[arg(long)]
    pub view: bool,
    #[command(flatten, next_help_heading = "Viewer (with --view)")]
    pub serve: view::ServeArgs,
    /// Launch this command and record it from its first instruction.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Writes `.rlp` chunks as the recording goes.
struct RlpSink(RlpWriter<BufWriter<File>>);

impl ChunkSink for RlpSink {
    fn write_chunk(&mut self, profile: &Profile) -> std::io::Result<()> {
        // The writer flushes each chunk, so a killed recorder leaves every chunk written so far.
        self.0.write_chunk(profile).map_err(std::io::Error::other)
    }
}

/// Runs `rootline record`.
pub fn run(args: Args) -> Result<()> {
    let format = input::output_format(&args.output, args.format.as_deref())?;
    let target = if !args.pid.is_empty() {
        Target::Pids(args.pid.clone())
    } else if args.all_cpus {
        Target::System
    } else {
        Target::Command(args.command.clone())
    };
    let mut opts = RecordOptions::new(target);
    opts.frequency_hz = args.frequency;
    opts.kernel = args.kernel;
    opts.stack_bytes = args.stack_size;
    opts.live_stack_budget = args.live_stack_budget;
    opts.ask_jvms = !args.no_perfmap;
    if args.off_cpu {
        opts.off_cpu_min_ns = Some(args.off_cpu_min_us.saturating_mul(1000));
        opts.off_cpu_max_rate = args.off_cpu_max_rate;
    }
    if !args.no_perfmap {
        opts.launch_env = dotnet_perf_map_env();
    }
    if let Some(secs) = args.duration {
        if !(secs > 0.0 && secs.is_finite()) {
            bail!("--duration must be a positive number of seconds, not {secs}");
        }
        opts.duration = Some(Duration::from_secs_f64(secs));
    }
    let stop = stop_on_signals()?;
    let perf_maps = if args.no_perfmap {
        Vec::new()
    } else {
        enable_dotnet_perf_maps(&args.pid)
    };
    let recording = record_to(&opts, &stop, &args.output, format);
    for guard in perf_maps {
        let pid = guard.pid();
        if let Err(e) = guard.finish() {
            eprintln!(
                "rootline: warning: process {pid}: couldn't switch its perf map off again: {e}"
            );
        }
    }
    let recording = recording?;
    summarize(&recording, &args.output, format);
    if args.view {
        // The Ctrl-C that ended the recording must not end the viewer too.
        stop.store(false, Ordering::Release);
        view::serve(&recording.profile, &args.output, &args.serve, &stop)?;
    }
    Ok(())
}

/// Asks each .NET process among `pids` to write a perf map for the length of the recording, so its
/// JIT-compiled code gets names; says what to do when a runtime can't (older than .NET 8).
fn enable_dotnet_perf_maps(pids: &[u32]) -> Vec<PerfMapGuard> {
    let mut guards = Vec::new();
    for &pid in pids {
        match PerfMapGuard::enable(pid) {
            Outcome::Enabled(guard) => guards.push(guard),
            Outcome::NotDotnet => {}
            Outcome::Unsupported(message) => eprintln!("rootline: note: {message}"),
            Outcome::Failed(e) => eprintln!(
                "rootline: warning: process {pid} looks like .NET but didn't take EnablePerfMap ({e}); \
                 {START_TIME_HINT}"
            ),
        }
    }
    guards
}

/// The environment that makes a launched .NET runtime write its perf map (and the perfinfo file
/// naming its ReadyToRun images) from its start: `DOTNET_PerfMapEnabled=3` (perf map only, no
/// jitdump) for .NET 5 and later, `COMPlus_PerfMapEnabled=1` for .NET Core 3.x, which reads only
/// that prefix. Variables the user set are left as they are.
fn dotnet_perf_map_env() -> Vec<(OsString, OsString)> {
    [
        ("DOTNET_PerfMapEnabled", "3"),
        ("COMPlus_PerfMapEnabled", "1"),
    ]
    .into_iter()
    .filter(|(k, _)| std::env::var_os(k).is_none())
    .map(|(k, v)| (k.into(), v.into()))
    .collect()
}

/// Sets a flag on Ctrl-C and SIGTERM.
pub fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::Release))
        .context("can't install the Ctrl-C handler")?;
    Ok(stop)
}

/// Records with `opts` into `output` (incrementally for `.rlp`, at the end otherwise).
pub fn record_to(
    opts: &RecordOptions,
    stop: &AtomicBool,
    output: &Path,
    format: Format,
) -> Result<Recording> {
    let sink: Option<Box<dyn ChunkSink>> = if format == Format::Rlp {
        let file =
            File::create(output).with_context(|| format!("can't create {}", output.display()))?;
        let writer = RlpWriter::new(BufWriter::new(file))
            .with_context(|| format!("writing {}", output.display()))?;
        Some(Box::new(RlpSink(writer)))
    } else {
        None
    };
    let recording = recorder::record(opts, stop, sink).map_err(|e| {
        // Nothing was recorded unless writing failed part-way: leave no empty profile behind.
        if format == Format::Rlp && !matches!(e, RecordError::Sink(_)) {
            let _ = std::fs::remove_file(output);
        }
        let code = e.exit_code() as u8;
        let message = match &e {
            RecordError::TargetGone(_) => format!("{e}; check the PID with `ps -p`"),
            _ => e.to_string(),
        };
        anyhow::Error::new(Exit { code, message })
    })?;
    if format != Format::Rlp {
        input::write_profile(&recording.profile, output, format)?;
    }
    Ok(recording)
}

/// Prints samples, threads, loss, truncation and the top functions to stderr.
pub fn summarize(recording: &Recording, output: &Path, format: Format) {
    let stats = &recording.stats;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "rootline: wrote {} ({}): {} samples on {} threads ({} event), {} lost, {} truncated",
        output.display(),
        format.name(),
        stats.samples,
        stats.threads,
        recording.event.as_str(),
        stats.lost,
        stats.truncated_total()
    );
    let off = &stats.off_cpu;
    if off.switches > 0 {
        let ms = |ns: u64| ns as f64 / 1e6;
        let _ = writeln!(
            err,
            "rootline: off-CPU: {} switches, {} sampled; {} intervals unwound ({:.1} ms), {} \
             below the minimum counted without stacks ({:.1} ms), {} over the rate cap counted \
             without stacks ({:.1} ms), {} dropped unmatched (thread exited or record lost), {} \
             still off at the end",
            off.switches,
            off.sampled,
            off.unwound,
            ms(off.unwound_ns),
            off.below_min,
            ms(off.below_min_ns),
            off.unsampled,
            ms(off.unsampled_ns),
            off.unmatched,
            off.open_at_end
        );
    }
    if let Some(status) = recording.exit_status {
        let _ = writeln!(err, "rootline: the command {}", how_it_ended(status));
    }
    let mut reasons: Vec<_> = stats.truncated.iter().collect();
    reasons.sort();
    for (reason, n) in reasons {
        let _ = writeln!(err, "  truncated: {n} × {}", reason.frame_name());
    }
    for note in &stats.jit_notes {
        let _ = writeln!(err, "  note: {note}");
    }
    let unnamed: u64 = stats.jit_unnamed.values().sum();
    if unnamed > 0 {
        let _ = writeln!(err, "  {unnamed} distinct JIT frames stayed unnamed:");
        for (why, n) in &stats.jit_unnamed {
            let _ = writeln!(err, "    {n} × {why}");
        }
    }
    let cc = &stats.callchain;
    if cc.capped > 0 {
        let hint = if cc.max_entries < rootline_capture::recorder::MAX_USER_CALLCHAIN {
            format!(
                "; `sysctl kernel.perf_event_max_stack={}` lets the kernel walk deeper",
                rootline_capture::recorder::MAX_USER_CALLCHAIN
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            err,
            "  note: {} samples had stacks deeper than the {} entries of the kernel's frame-pointer \
             callchain (kernel.perf_event_max_stack), so only their innermost frames were \
             cross-checked against it{hint}",
            cc.capped, cc.max_entries
        );
    }
    let column = input::default_column(&recording.profile);
    let _ = report::write_report(&recording.profile, column, 10, false, &mut err);
}

/// How a recorded command ended, for the summary: `exited with status N` or `was killed by signal N
/// (NAME)`.
fn how_it_ended(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return format!("exited with status {code}");
    }
    match status.signal() {
        Some(signal) => {
            let name = signal_hook::low_level::signal_name(signal)
                .map(|name| format!(" ({name})"))
                .unwrap_or_default();
            format!("was killed by signal {signal}{name}")
        }
        None => format!("ended ({status})"),
    }
}
