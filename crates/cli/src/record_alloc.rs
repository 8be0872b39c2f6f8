//! `record --alloc` on .NET targets: an EventPipe session per .NET process collects GC allocation
//! ticks while perf samples the CPU; when recording ends, each tick becomes a sample of its thread
//! with the stack EventPipe walked for it (named as `dotnet collect` names it, ending in
//! `[alloc: TYPE]`) and its bytes and count in the `alloc-bytes` and `alloc-count` columns.
//!
//! Why EventPipe's stack and not perf's: the tick is raised inside the runtime's allocator, where
//! no perf event fires; EventPipe walks the allocating thread's managed stack at that moment, from
//! its managed root to the allocating method, and names every frame itself. CPU samples stay
//! perf's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use anyhow::{Result, bail};
use rootline_capture::recorder::{RecordOptions, Target, monotonic_ns};
use rootline_dotnet::alloc_ticks::{AllocTicks, AllocTicksError, append_ticks};
use rootline_dotnet::discover::find_socket;
use rootline_profile::{Profile, SampleType};
use rootline_repair::RepairOptions;

/// The runtime's buffer for each session, in MB.
const BUFFER_MB: u32 = 256;
/// How often a launched command is looked at for its diagnostics socket: often at first (the
/// ticks before the session starts are not seen), then less.
const SOCKET_POLL: Duration = Duration::from_millis(2);
const SOCKET_POLL_LATER: Duration = Duration::from_millis(50);
/// How long the runtime gets to send its rundown once a session is stopped.
const RUNDOWN_TIMEOUT: Duration = Duration::from_secs(60);

/// Allocation-tick sessions running alongside a recording.
pub struct DotnetAlloc {
    sessions: Vec<AllocTicks>,
    /// For a launched command: finds its runtime once it is up and starts the session.
    launched: Option<(JoinHandle<Option<AllocTicks>>, Arc<AtomicBool>)>,
}

/// What the allocation sessions gave, for the summary.
#[derive(Debug, Default)]
pub struct AllocSummary {
    /// Lines to print.
    pub notes: Vec<String>,
}

impl DotnetAlloc {
    /// Prepares `opts` for allocation samples (the columns `alloc-bytes` and `alloc-count`) and
    /// starts a session on every .NET process of its target; for a launched command, the session
    /// starts as soon as its runtime opens its diagnostics socket.
    pub fn start(opts: &mut RecordOptions) -> Result<DotnetAlloc> {
        let mut sessions = Vec::new();
        let mut launched = None;
        match &opts.target {
            Target::Pids(pids) => {
                for &pid in pids {
                    match AllocTicks::start(pid, BUFFER_MB, RUNDOWN_TIMEOUT) {
                        Ok(s) => sessions.push(s),
                        Err(AllocTicksError::Ipc(rootline_dotnet::ipc::IpcError::NoSocket {
                            ..
                        })) => bail!(
                            "--alloc: process {pid} is not a .NET process (it has no diagnostics \
                             socket); --alloc records the GC allocation ticks of .NET processes"
                        ),
                        Err(e) => {
                            return Err(anyhow::Error::new(e)
                                .context(format!("--alloc: tracing process {pid}")));
                        }
                    }
                }
            }
            Target::Command(_) => {
                let pid = Arc::new(AtomicU32::new(0));
                let done = Arc::new(AtomicBool::new(false));
                opts.launched_pid = Some(Arc::clone(&pid));
                let flag = Arc::clone(&done);
                let waiter = std::thread::Builder::new()
                    .name("rootline-alloc-wait".into())
                    .spawn(move || wait_for_runtime(&pid, &flag))?;
                launched = Some((waiter, done));
            }
            Target::System => {
                bail!("--alloc follows a command or -p processes, not the whole host")
            }
        }
        opts.extra_columns = vec![SampleType::alloc_bytes(), SampleType::alloc_count()];
        Ok(DotnetAlloc { sessions, launched })
    }

    /// Stops the sessions and appends their ticks to `profile` (the recording's).
    pub fn finish(mut self, profile: &mut Profile) -> AllocSummary {
        let mut summary = AllocSummary::default();
        if let Some((waiter, done)) = self.launched.take() {
            done.store(true, Ordering::Release);
            match waiter.join() {
                Ok(Some(s)) => self.sessions.push(s),
                Ok(None) => summary.notes.push(
                    "--alloc: the command started no .NET runtime (no diagnostics socket \
                     appeared): no allocation ticks"
                        .into(),
                ),
                Err(_) => summary
                    .notes
                    .push("--alloc: waiting for the command's runtime failed".into()),
            }
        }
        // Trace times are wall-clock; the recording's are CLOCK_MONOTONIC.
        let wall = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        let offset = wall - monotonic_ns() as i64;
        for session in self.sessions {
            let pid = session.pid();
            let mut collected = match session.finish() {
                Ok(c) => c,
                Err(e) => {
                    summary
                        .notes
                        .push(format!("--alloc: process {pid}: no allocation ticks ({e})"));
                    continue;
                }
            };
            let stats = &collected.stats;
            // Stacks EventPipe cut at its depth cap are repaired as `dotnet collect` repairs them.
            let repaired = if stats.allocation_ticks_at_cap > 0 {
                match rootline_repair::repair(&mut collected.profile, &RepairOptions::default()) {
                    Ok(r) => {
                        let t = r.totals();
                        format!(
                            "; repair: {} exact, {} ambiguous, {} unrepairable",
                            t.exact, t.ambiguous, t.unrepairable
                        )
                    }
                    Err(e) => format!("; repair failed: {e}"),
                }
            } else {
                String::new()
            };
            // The ticks of the recording's span: the session opens a little before perf and
            // ends a little after.
            let md = &profile.metadata;
            let window = match md.end_time_ns {
                0 => md.start_time_ns..u64::MAX,
                end => md.start_time_ns..end.max(md.start_time_ns).saturating_add(1),
            };
            match append_ticks(&collected.profile, profile, pid, offset, window) {
                Ok(a) => summary.notes.push(format!(
                    "allocations: process {pid}: {} GC allocation ticks for {:.1} MB allocated \
                     ({} cut at EventPipe's {}-frame limit{repaired}; {} events dropped by the \
                     runtime{})",
                    a.ticks,
                    a.bytes as f64 / 1e6,
                    stats.allocation_ticks_at_cap,
                    rootline_dotnet::EVENTPIPE_DEPTH_CAP,
                    stats.dropped_events,
                    if collected.summary.complete {
                        ""
                    } else {
                        "; the runtime did not finish the trace in time, so some methods may \
                         lack names"
                    }
                )),
                Err(e) => summary.notes.push(format!("--alloc: process {pid}: {e}")),
            }
        }
        summary
    }
}

/// Waits until the launched command's pid is known and its runtime has a diagnostics socket,
/// then starts a session; gives up when the process ends or `done` is set.
fn wait_for_runtime(pid: &AtomicU32, done: &AtomicBool) -> Option<AllocTicks> {
    let started = std::time::Instant::now();
    loop {
        if done.load(Ordering::Acquire) {
            return None;
        }
        let p = pid.load(Ordering::Acquire);
        if p != 0 {
            if !std::path::Path::new(&format!("/proc/{p}")).exists() {
                return None;
            }
            if find_socket(p).is_ok() {
                // The socket can be there a moment before the server listens: try a few times.
                for _ in 0..50 {
                    if let Ok(s) = AllocTicks::start(p, BUFFER_MB, RUNDOWN_TIMEOUT) {
                        return Some(s);
                    }
                    if done.load(Ordering::Acquire) {
                        return None;
                    }
                    std::thread::sleep(SOCKET_POLL * 5);
                }
                return None;
            }
        }
        std::thread::sleep(if started.elapsed() < Duration::from_secs(5) {
            SOCKET_POLL
        } else {
            SOCKET_POLL_LATER
        });
    }
}
