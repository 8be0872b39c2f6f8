//! .NET allocation ticks for the agent (`dotnet.allocation_ticks`): an EventPipe session on every
//! .NET process among the targets, each tick appended to the capture profile as a sample of its
//! thread (EventPipe's managed stack, ending in `[alloc: TYPE]`), so it travels the same cache,
//! double buffers and escape hatch as the CPU samples and is counted the same way.
//!
//! The runtime names the methods of a session's stacks at the session's end (its rundown), so a
//! session runs for `dotnet.session_length` and is then replaced: the next session starts first,
//! the old one is stopped after, and each keeps the ticks on its side of the moment the new one
//! started, so no tick is lost or counted twice at the handover (up to the few microseconds the
//! two clocks' conversion may differ). Finished sessions are read on this module's thread; the
//! capture profile only takes their ticks, on the recorder's builder thread.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rootline_capture::recorder::{SampleInjector, monotonic_ns};
use rootline_dotnet::alloc_ticks::{AllocTicks, Collected, append_ticks};
use rootline_profile::Profile;

/// How often the .NET processes among the targets are looked for.
const SCAN_EVERY: Duration = Duration::from_millis(500);
/// The runtime's buffer for each session, in MB.
const BUFFER_MB: u32 = 64;
/// How long a runtime gets to send a stopped session's rundown (the agent must stop within its
/// `shutdown_timeout`).
const RUNDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// A finished session waiting to be appended.
struct Ready {
    pid: u32,
    collected: Collected,
    /// Its ticks from here (CLOCK_MONOTONIC nanoseconds) …
    from: u64,
    /// … to here.
    to: u64,
}

/// A running session.
struct Running {
    ticks: AllocTicks,
    /// Its ticks count from here (CLOCK_MONOTONIC nanoseconds).
    from: u64,
    started: Instant,
}

#[derive(Default)]
struct Shared {
    /// The target pids (None: every process).
    targets: Mutex<Option<Vec<u32>>>,
    ready: Mutex<Vec<Ready>>,
    stop: AtomicBool,
    wake: Condvar,
    lock: Mutex<()>,
}

/// Runs the sessions and hands their ticks to the capture profile (a [`SampleInjector`]).
pub struct DotnetTicks {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Unix time minus monotonic time: trace times are Unix nanoseconds.
    clock_offset: i64,
}

impl std::fmt::Debug for DotnetTicks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DotnetTicks").finish_non_exhaustive()
    }
}

impl DotnetTicks {
    /// Starts looking for .NET processes; each session runs `session_length`.
    pub fn start(session_length: Duration) -> std::io::Result<DotnetTicks> {
        let shared = Arc::new(Shared::default());
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("rootline-dotnet-ticks".into())
                .spawn(move || run(&shared, session_length))?
        };
        Ok(DotnetTicks {
            shared,
            thread: Mutex::new(Some(thread)),
            clock_offset: crate::now_ns() as i64 - monotonic_ns() as i64,
        })
    }

    /// Follows the agent's targets (None: every process).
    pub fn set_targets(&self, pids: Option<&[u32]>) {
        *self
            .shared
            .targets
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = pids.map(<[u32]>::to_vec);
    }

    fn append_ready(&self, profile: &mut Profile) {
        let ready =
            std::mem::take(&mut *self.shared.ready.lock().unwrap_or_else(|e| e.into_inner()));
        for r in ready {
            match append_ticks(
                &r.collected.profile,
                profile,
                r.pid,
                self.clock_offset,
                r.from..r.to,
            ) {
                Ok(a) => tracing::debug!(
                    pid = r.pid,
                    ticks = a.ticks,
                    bytes = a.bytes,
                    dropped_by_runtime = r.collected.stats.dropped_events,
                    "allocation ticks"
                ),
                Err(e) => tracing::warn!(pid = r.pid, "allocation ticks: {e}"),
            }
            if r.collected.stats.dropped_events > 0 {
                tracing::warn!(
                    pid = r.pid,
                    "the runtime dropped {} events of its allocation-tick session (its buffer \
                     was full)",
                    r.collected.stats.dropped_events
                );
            }
        }
    }
}

impl SampleInjector for DotnetTicks {
    fn inject(&self, profile: &mut Profile) {
        self.append_ready(profile);
    }

    fn finish(&self, profile: &mut Profile) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.notify_all();
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
        self.append_ready(profile);
    }
}

impl Drop for DotnetTicks {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.notify_all();
    }
}

/// Ends `session`, keeping its ticks up to `to`.
fn end(shared: &Shared, pid: u32, session: Running, to: u64) {
    match session.ticks.finish() {
        Ok(collected) => shared
            .ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Ready {
                pid,
                collected,
                from: session.from,
                to,
            }),
        Err(e) => tracing::warn!(pid, "ending the allocation-tick session: {e}"),
    }
}

/// The sessions' thread: finds .NET targets, starts, replaces and ends sessions.
fn run(shared: &Shared, session_length: Duration) {
    let me = std::process::id();
    let mut sessions: HashMap<u32, Running> = HashMap::new();
    let mut refused: HashMap<u32, ()> = HashMap::new();
    while !shared.stop.load(Ordering::Acquire) {
        let targets = shared
            .targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let dotnet: Vec<u32> = rootline_dotnet::discover::list_processes()
            .into_iter()
            .map(|p| p.pid)
            .filter(|&p| p != me)
            .filter(|p| targets.as_ref().is_none_or(|t| t.contains(p)))
            .collect();
        // Processes gone or no longer targets: their sessions end.
        let gone: Vec<u32> = sessions
            .keys()
            .copied()
            .filter(|p| !dotnet.contains(p))
            .collect();
        for pid in gone {
            if let Some(s) = sessions.remove(&pid) {
                end(shared, pid, s, u64::MAX);
            }
        }
        refused.retain(|p, ()| dotnet.contains(p));
        for &pid in &dotnet {
            let due = sessions
                .get(&pid)
                .is_none_or(|s| s.started.elapsed() >= session_length);
            if !due || refused.contains_key(&pid) {
                continue;
            }
            // The next session first, then the old one ends: they split the ticks at `now`.
            let now = monotonic_ns();
            match AllocTicks::start(pid, BUFFER_MB, RUNDOWN_TIMEOUT) {
                Ok(ticks) => {
                    let old = sessions.insert(
                        pid,
                        Running {
                            ticks,
                            from: now,
                            started: Instant::now(),
                        },
                    );
                    if let Some(old) = old {
                        end(shared, pid, old, now);
                    } else {
                        tracing::info!(pid, "collecting .NET allocation ticks");
                    }
                }
                Err(e) => {
                    tracing::warn!(pid, "can't collect .NET allocation ticks: {e}");
                    refused.insert(pid, ());
                    if let Some(old) = sessions.remove(&pid) {
                        end(shared, pid, old, u64::MAX);
                    }
                }
            }
        }
        let guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
        if !shared.stop.load(Ordering::Acquire) {
            let _ = shared.wake.wait_timeout(guard, SCAN_EVERY);
        }
    }
    for (pid, s) in sessions {
        end(shared, pid, s, u64::MAX);
    }
}
