//! `record --alloc`: which allocation source records which process, and the .NET one.
//!
//! Native allocations (malloc and friends) are sampled by the recorder itself
//! ([`RecordOptions::alloc_rate`]); a .NET process's managed allocations never reach malloc (the
//! GC hands out memory from its own heap), so for them an EventPipe session per .NET process
//! collects GC allocation ticks while perf samples the CPU; when recording ends, each tick becomes
//! a sample of its thread with the stack EventPipe walked for it (named as `dotnet collect` names
//! it, ending in `[alloc: TYPE]`) and its bytes and count in the same `alloc-bytes` and
//! `alloc-count` columns.
//!
//! Which source: a `-p` process with a .NET diagnostics socket gets the ticks, any other `-p`
//! process the native sampler. A launched command gets the native sampler from its first
//! instruction (its sampler library is preloaded) and, once it has started a .NET runtime, the
//! ticks too: the runtime's own native allocations are real allocations as well, and the two
//! sources do not overlap.
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
use rootline_dotnet::alloc_ticks::{AllocTicks, append_ticks};
use rootline_dotnet::discover::{find_socket, find_socket_by_start_key};
use rootline_profile::{Profile, SampleType};
use rootline_repair::RepairOptions;

/// The runtime's buffer for each session, in MB.
const BUFFER_MB: u32 = 256;
/// How often a launched command is looked at for its diagnostics socket: often at first (the
/// ticks before the session starts are not seen), then less.
const SOCKET_POLL: Duration = Duration::from_millis(2);
const SOCKET_POLL_LATER: Duration = Duration::from_millis(50);
/// Polls between listings of the socket directories (see `wait_for_runtime`).
const FULL_SCAN_EVERY: u64 = 50;
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

/// Prepares `opts` to record allocations, natively sampled at a mean of `rate` bytes where
/// the native sampler applies, and starts the .NET sessions; the .NET side, if any, is returned
/// to be finished once recording ends.
pub fn start(opts: &mut RecordOptions, rate: u64) -> Result<Option<DotnetAlloc>> {
    match &opts.target {
        Target::Pids(pids) => {
            let (dotnet, native): (Vec<u32>, Vec<u32>) =
                pids.iter().partition(|&&pid| find_socket(pid).is_ok());
            if !native.is_empty() {
                opts.alloc_rate = Some(rate);
                opts.alloc_skip_pids = dotnet.clone();
            }
            if dotnet.is_empty() {
                return Ok(None);
            }
            DotnetAlloc::start_pids(opts, &dotnet).map(Some)
        }
        Target::Command(_) => {
            opts.alloc_rate = Some(rate);
            DotnetAlloc::start_launched(opts).map(Some)
        }
        Target::System => {
            bail!("--alloc follows a command or -p processes, not the whole host")
        }
    }
}

impl DotnetAlloc {
    /// Starts a session on each of the .NET processes `pids` and adds the columns
    /// `alloc-bytes` and `alloc-count` to `opts`.
    fn start_pids(opts: &mut RecordOptions, pids: &[u32]) -> Result<DotnetAlloc> {
        let mut sessions = Vec::new();
        for &pid in pids {
            match AllocTicks::start(pid, BUFFER_MB, RUNDOWN_TIMEOUT) {
                Ok(s) => sessions.push(s),
                Err(e) => {
                    return Err(anyhow::Error::new(e).context(format!(
                        "--alloc: tracing .NET process {pid} (its diagnostics socket is there,                          but the runtime did not start an EventPipe session)"
                    )));
                }
            }
        }
        opts.extra_columns = vec![SampleType::alloc_bytes(), SampleType::alloc_count()];
        Ok(DotnetAlloc {
            sessions,
            launched: None,
        })
    }

    /// Watches the launched command for a .NET runtime: the session starts as soon as its
    /// runtime opens its diagnostics socket.
    fn start_launched(opts: &mut RecordOptions) -> Result<DotnetAlloc> {
        let pid = Arc::new(AtomicU32::new(0));
        let done = Arc::new(AtomicBool::new(false));
        opts.launched_pid = Some(Arc::clone(&pid));
        let flag = Arc::clone(&done);
        let waiter = std::thread::Builder::new()
            .name("rootline-alloc-wait".into())
            .spawn(move || wait_for_runtime(&pid, &flag))?;
        opts.extra_columns = vec![SampleType::alloc_bytes(), SampleType::alloc_count()];
        Ok(DotnetAlloc {
            sessions: Vec::new(),
            launched: Some((waiter, done)),
        })
    }

    /// Stops the sessions and appends their ticks to `profile` (the recording's).
    pub fn finish(mut self, profile: &mut Profile) -> AllocSummary {
        let mut summary = AllocSummary::default();
        if let Some((waiter, done)) = self.launched.take() {
            done.store(true, Ordering::Release);
            match waiter.join() {
                Ok(Some(s)) => self.sessions.push(s),
                // No .NET runtime: its allocations are all native, sampled by the recorder.
                Ok(None) => {}
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
    for poll in 0u64.. {
        if done.load(Ordering::Acquire) {
            return None;
        }
        let p = pid.load(Ordering::Acquire);
        if p != 0 {
            if !std::path::Path::new(&format!("/proc/{p}")).exists() {
                return None;
            }
            // Each poll looks for the socket's usual name; listing the socket directory (a
            // busy /tmp holds thousands of entries) waits for every FULL_SCAN_EVERY-th.
            if find_socket_by_start_key(p).is_some()
                || (poll % FULL_SCAN_EVERY == 0 && find_socket(p).is_ok())
            {
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
    None
}
