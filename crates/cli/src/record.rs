//! `rootline record [-F HZ] [--duration SECS] [-o OUT] [--kernel] (-p PID[,PID…] | -a | -- CMD…)`.
//!
//! `.rlp` output is written incrementally (one chunk per second), so even a killed recorder
//! leaves a readable file; other formats are written when recording ends. Ctrl-C or SIGTERM end
//! the recording cleanly. A summary goes to stderr.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rootline_capture::recorder::{self, ChunkSink, RecordError, RecordOptions, Recording, Target};
use rootline_dotnet::perfmap::{Outcome, PerfMapGuard, START_TIME_HINT};
use rootline_formats::Format;
use rootline_profile::Profile;
use rootline_profile::rlp::RlpWriter;

use crate::exit::Exit;
use crate::{input, record_alloc, report, view};

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
    /// Walk each sample's user stack in the kernel as well, while the thread is stopped (a BPF
    /// program with rules compiled from the binaries' CFI): frames past the stack copy are then
    /// read at the sample's instant instead of live afterwards, so stacks that change between
    /// samples stay whole. `auto` uses it when the kernel loads the program (root or
    /// CAP_BPF+CAP_PERFMON, Linux 5.17+) and says why not otherwise; `on` fails without it.
    #[arg(long, value_enum, default_value_t = KernelWalkArg::Auto, value_name = "WHEN")]
    pub kernel_walk: KernelWalkArg,
    /// Size of the in-kernel walk's rules table (kernel memory, allocated whole at the start),
    /// MiB; default 64 (4 Mi rows: a compiler's libraries and a few dozen programs'), 128 with
    /// -a (every binary mapped on the host has its rows: a build host running rustc, cc1 and
    /// node used 4.6 Mi). When binaries do not fit the summary says how many, and their samples
    /// are unwound the usual way (copy, then live reads with a proof).
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub kernel_walk_mib: Option<u32>,
    /// Also record where memory is allocated, in the value columns alloc-bytes and alloc-count
    /// (pick one with `report/convert --value alloc-bytes`), each sample's stack ending in
    /// [alloc: …]. Native code: malloc, calloc, realloc, posix_memalign, aligned_alloc, memalign,
    /// valloc, pvalloc (C++ operator new through malloc), and mmap of anonymous memory of at least
    /// --alloc-mmap-min bytes (not file mappings, PROT_NONE reservations, nor the mappings malloc
    /// makes for large blocks: those count once, as their malloc), sampled by bytes (--alloc-rate), the leaf naming the
    /// function ([alloc: malloc], [alloc: mmap]); a launched command gets a sampler library in
    /// LD_PRELOAD so only sampled calls trap; with -p, uprobes on the target's libc and a BPF
    /// program keep the count in the kernel (threads the process starts are probed once found,
    /// within a tenth of a second). .NET processes given with -p: the runtime's GC allocation
    /// ticks over EventPipe instead (about one per 100 KB a thread allocates, each with the
    /// managed stack EventPipe walked for it, ending in [alloc: TYPE]). A launched command that
    /// starts a .NET runtime gets both: its ticks and its native allocations. Command or -p only.
    #[arg(long, conflicts_with = "all_cpus")]
    pub alloc: bool,
    /// With --alloc: mean bytes of native allocations between two samples (a Poisson process, as
    /// tcmalloc and Go sample; default 512 KiB). .NET ticks come at the runtime's own pace.
    #[arg(long, default_value_t = rootline_capture::recorder::DEFAULT_ALLOC_RATE, value_name = "BYTES", requires = "alloc")]
    pub alloc_rate: u64,
    /// With --alloc: the smallest anonymous mmap counted as an allocation, in bytes (default 64
    /// KiB, below glibc's 128 KiB mmap threshold, so a program's own arenas and pools are seen
    /// while guard pages and small runtime maps are not). A launched command counts successful
    /// calls only; with -p a call is counted as it starts.
    #[arg(long, default_value_t = rootline_capture::recorder::DEFAULT_ALLOC_MMAP_MIN, value_name = "BYTES", requires = "alloc")]
    pub alloc_mmap_min: u64,
    /// Show the recording in the viewer (as `rootline view` does) once recording ends.
    #[arg(long)]
    pub view: bool,
    #[command(flatten, next_help_heading = "Viewer (with --view)")]
    pub serve: view::ServeArgs,
    /// Launch this command and record it from its first instruction.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// `--kernel-walk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelWalkArg {
    /// When the kernel loads the program.
    Auto,
    /// Always (recording fails without it).
    On,
    /// Never.
    Off,
}

impl From<KernelWalkArg> for rootline_capture::recorder::KernelWalkMode {
    fn from(a: KernelWalkArg) -> Self {
        use rootline_capture::recorder::KernelWalkMode as M;
        match a {
            KernelWalkArg::Auto => M::Auto,
            KernelWalkArg::On => M::On,
            KernelWalkArg::Off => M::Off,
        }
    }
}

/// Writes `.rlp` chunks as the recording goes; shared so that samples added after the
/// recording (allocation ticks) go into a last chunk.
struct RlpSink(Arc<Mutex<RlpWriter<BufWriter<File>>>>);

impl ChunkSink for RlpSink {
    fn write_chunk(&mut self, profile: &Profile) -> std::io::Result<()> {
        // The writer flushes each chunk, so a killed recorder leaves every chunk written so far.
        let mut writer = self
            .0
            .lock()
            .map_err(|_| std::io::Error::other("the profile writer failed earlier"))?;
        writer.write_chunk(profile).map_err(std::io::Error::other)
    }
}

/// What runs once recording ends, before the profile is finished: adds samples from other
/// sources.
pub type AfterRecording<'a> = Option<Box<dyn FnOnce(&mut Profile) + 'a>>;

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
    opts.kernel_walk = args.kernel_walk.into();
    // Else the recorder's table (64 MiB).
    if let Some(mib) = args.kernel_walk_mib.or(args.all_cpus.then_some(128)) {
        opts.kernel_walk_table = recorder::KernelWalkTable::Rows(mib.saturating_mul(1 << 16));
    }
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
    let alloc = if args.alloc {
        if args.alloc_rate == 0 {
            bail!("--alloc-rate must be at least 1 byte");
        }
        opts.alloc_mmap_min = args.alloc_mmap_min;
        record_alloc::start(&mut opts, args.alloc_rate)?
    } else {
        None
    };
    let mut alloc_notes = Vec::new();
    let after: AfterRecording = alloc.map(|a| {
        let notes = &mut alloc_notes;
        Box::new(move |profile: &mut Profile| *notes = a.finish(profile).notes) as Box<_>
    });
    let stop = stop_on_signals()?;
    let perf_maps = if args.no_perfmap {
        Vec::new()
    } else {
        enable_dotnet_perf_maps(&args.pid)
    };
    let recording = record_to(&opts, &stop, &args.output, format, after);
    for note in &alloc_notes {
        eprintln!("rootline: {note}");
    }
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
    after: AfterRecording,
) -> Result<Recording> {
    let mut rlp = None;
    let sink: Option<Box<dyn ChunkSink>> = if format == Format::Rlp {
        let file =
            File::create(output).with_context(|| format!("can't create {}", output.display()))?;
        let writer = RlpWriter::new(BufWriter::new(file))
            .with_context(|| format!("writing {}", output.display()))?;
        let writer = Arc::new(Mutex::new(writer));
        rlp = Some(Arc::clone(&writer));
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
    let mut recording = recording;
    if let Some(after) = after {
        after(&mut recording.profile);
        if let Some(writer) = &rlp {
            writer
                .lock()
                .map_err(|_| anyhow::anyhow!("the profile writer failed earlier"))?
                .write_chunk(&recording.profile)
                .with_context(|| format!("writing {}", output.display()))?;
        }
    }
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
    let alloc = &stats.alloc;
    if alloc.sampled + alloc.unsampled_calls + alloc.unreadable > 0 {
        let _ = writeln!(
            err,
            "rootline: allocations: {} sampled, standing for {:.1} MiB; {} calls trapped between \
             sample points, {} unreadable samples dropped",
            alloc.sampled,
            alloc.estimated_bytes as f64 / (1024.0 * 1024.0),
            alloc.unsampled_calls,
            alloc.unreadable
        );
    }
    if let Some(status) = recording.exit_status {
        let _ = writeln!(err, "rootline: the command {}", how_it_ended(status));
    }
    if let Some(kw) = &stats.kernel_walk {
        let w = &kw.walk;
        let stops: Vec<String> = w
            .stops
            .iter()
            .filter(|(s, _)| **s != rootline_capture::kernel_walk::WalkStop::InCopy)
            .map(|(s, n)| format!("{n} {}", s.name()))
            .collect();
        let _ = writeln!(
            err,
            "rootline: in-kernel stack walk: {} walks, {} frames; {} samples unwound with it, {} \
             needed more and were unwound the usual way, {} found no walk, {} needed none (their \
             copy reached their thread's outermost frame); walks ended: {}; {} chunks lost \
             (ring full), {} walks broken; {} rows in the table{}{}{}{}{}{}",
            w.walks,
            w.frames,
            kw.unwound,
            kw.fell_back,
            kw.no_walk,
            kw.in_copy,
            if stops.is_empty() {
                "-".to_string()
            } else {
                stops.join(", ")
            },
            w.lost_chunks,
            w.join.broken,
            w.rows_used,
            if w.binaries_refused > 0 {
                format!(
                    ", {} binaries did not fit (a larger table: --kernel-walk-mib)",
                    w.binaries_refused
                )
            } else {
                String::new()
            },
            if kw.dumps_dropped > 0 {
                format!(
                    ", {} stack dumps dropped (memory bound) while their binaries were read",
                    kw.dumps_dropped
                )
            } else {
                String::new()
            },
            if w.join.dump_bytes > 0 {
                format!(
                    "; {:.1} MB of stack dumps while binaries were read ({:.0}% the same as their \
                     thread's last, held once)",
                    w.join.dump_bytes as f64 / 1e6,
                    100.0 * w.join.dump_bytes_shared as f64 / w.join.dump_bytes as f64
                )
            } else {
                String::new()
            },
            if w.join.continued > 0 {
                format!(
                    "; {} deep walks went on before their threads returned to user space ({} \
                     samples taken meanwhile shared them)",
                    w.join.continued, w.join.shared
                )
            } else {
                String::new()
            },
            if kw.outer_reused > 0 {
                format!(
                    "; {} samples reused {} outer frames of their thread's last whole stack (the \
                     walk read the same words there)",
                    kw.outer_reused, kw.frames_reused
                )
            } else {
                String::new()
            },
            match w.run_time {
                Some((time, runs)) if runs > 0 => format!(
                    "; the program took {:.1} ms of the sampled threads' CPU in {runs} sampling \
                     interrupts ({:.1} µs each)",
                    time.as_secs_f64() * 1e3,
                    time.as_secs_f64() * 1e6 / runs as f64
                ),
                _ => String::new(),
            }
        );
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
