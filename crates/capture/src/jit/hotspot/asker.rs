//! The thread that asks one JVM for its perf map: on request, at most once per interval, retrying
//! a JVM still starting, and counting the answers.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::{ASK_INTERVAL, AttachError, STARTING_TRIES, ask_perf_map};

/// What [`PerfMapAsker::wait`] waits for.
#[derive(Debug, Clone, Copy)]
pub struct Ticket {
    answers: u64,
    failed: u64,
}

/// What the asking thread and its owner share.
#[derive(Debug, Default)]
struct State {
    /// A request is wanted.
    wanted: bool,
    /// The next request should not wait for the interval (the end of a recording).
    urgent: bool,
    /// A request is being made.
    in_flight: bool,
    /// Requests that failed (a starting JVM), in all.
    failed: u64,
    /// Answers received (each rewrote the perf map).
    answers: u64,
    /// Why the JVM will not be asked again.
    stopped: Option<String>,
    /// It is not asked because it ended: nothing to note.
    ended: bool,
    /// The owner is gone.
    closed: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Asks one JVM for its perf map from a thread of its own, at most once per [`ASK_INTERVAL`]
/// (a starting JVM is retried until it answers; one with attach off is asked once).
#[derive(Debug)]
pub struct PerfMapAsker {
    shared: Arc<Shared>,
}

impl PerfMapAsker {
    /// Starts the thread for JVM `pid` and asks at once.
    pub fn start(pid: u32) -> PerfMapAsker {
        let shared = Arc::new(Shared::default());
        shared.lock().wanted = true;
        let theirs = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("rootline-jvm-{pid}"))
            .spawn(move || ask_loop(pid, &theirs));
        if let Err(e) = spawned {
            shared.lock().stopped = Some(format!("can't start a thread to ask it: {e}"));
        }
        PerfMapAsker { shared }
    }

    /// Asks for a fresh perf map (soon: at most once per interval).
    pub fn want(&self) {
        let mut st = self.shared.lock();
        if !st.wanted && st.stopped.is_none() {
            st.wanted = true;
            self.shared.changed.notify_all();
        }
    }

    /// Answers received so far: when it grows, the perf map was rewritten.
    pub fn answers(&self) -> u64 {
        self.shared.lock().answers
    }

    /// Why the JVM is not asked any more, if it is not.
    pub fn stopped(&self) -> Option<String> {
        self.shared.lock().stopped.clone()
    }

    /// Why the JVM is not asked any more, if it is not and that is worth a note (not when it
    /// ended).
    pub fn note(&self) -> Option<String> {
        let st = self.shared.lock();
        st.stopped.clone().filter(|_| !st.ended)
    }

    /// Asks now, without waiting for the interval (after a failure the interval is kept).
    /// Returns what [`PerfMapAsker::wait`] waits for.
    pub fn ask_now(&self) -> Ticket {
        let mut st = self.shared.lock();
        st.wanted = true;
        st.urgent = true;
        self.shared.changed.notify_all();
        Ticket {
            // A request being made may have started before the code in question was compiled.
            answers: st.answers + if st.in_flight { 2 } else { 1 },
            failed: st.failed,
        }
    }

    /// Waits until the answer `ticket` waits for has arrived, a request failed since, the JVM is
    /// given up on, or `deadline`.
    pub fn wait(&self, ticket: Ticket, deadline: Instant) {
        let mut st = self.shared.lock();
        while st.answers < ticket.answers && st.failed == ticket.failed && st.stopped.is_none() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Drop for PerfMapAsker {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.changed.notify_all();
    }
}

/// The asking thread: waits for a request, asks, and rests for the interval.
fn ask_loop(pid: u32, shared: &Shared) {
    let mut failures = 0;
    loop {
        {
            let mut st = shared.lock();
            while !st.wanted && !st.closed {
                st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.closed {
                return;
            }
            st.wanted = false;
            st.urgent = false;
            st.in_flight = true;
        }
        let result = ask_perf_map(pid);
        let rested = Instant::now() + ASK_INTERVAL;
        {
            let mut st = shared.lock();
            st.in_flight = false;
            match result {
                Ok(_) => {
                    st.answers += 1;
                    failures = 0;
                }
                Err(e) if e.may_pass_later() && failures < STARTING_TRIES => {
                    failures += 1;
                    st.failed += 1;
                    // Urgency does not cut the rest after a failure: a starting JVM gets its
                    // tries spread over STARTING_TRIES intervals.
                    st.urgent = false;
                    st.wanted = true;
                }
                Err(e) => {
                    st.ended = matches!(e, AttachError::Gone(_));
                    st.stopped = Some(e.to_string());
                    shared.changed.notify_all();
                    return;
                }
            }
            shared.changed.notify_all();
            // An urgent request cuts the rest short, unless the last try failed.
            let cut = |st: &State| st.closed || st.urgent && failures == 0;
            while !cut(&st) {
                let now = Instant::now();
                if now >= rested {
                    break;
                }
                st = shared
                    .changed
                    .wait_timeout(st, rested - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
    }
}
