//! The lifetime of the recorded threads and processes: which threads are alive and their names,
//! when each process last exec'd, how often its executable mappings changed, and when threads
//! that exited may be forgotten.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use foldhash::{HashMap as FastMap, HashMapExt};

use crate::process::thread_name;

/// How long after its exit record a thread (and, once gone, its process) is forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(2);

/// The same when the memory its binaries hold is wanted (the module budget was over-committed):
/// long enough for every ring to have been read past its last samples (a round is at most a
/// flush interval, 200 ms in the agent).
const FORGET_URGENTLY_AFTER: Duration = Duration::from_millis(200);

/// Most names held for threads not sampled yet (every `exec` on the host reports one).
const MAX_EARLY_NAMES: usize = 4096;

/// Shortest time between two re-reads of a process's `/proc/PID/maps`.
const REFRESH_EVERY: Duration = Duration::from_millis(100);

/// Threads and processes seen while recording. See the module documentation.
pub(crate) struct Lifetimes {
    /// Live threads and their names (re-sent after the tables start over).
    threads: FastMap<(u32, u32), Option<Box<str>>>,
    /// Thread names `(pid, tid, name)` not yet handed to the builder.
    names: Vec<(u32, u32, String)>,
    /// Names the kernel reported (an `exec`, a rename) for threads not sampled yet: a process
    /// that lives a few milliseconds may be gone from `/proc` when its first sample is read.
    /// At most [`MAX_EARLY_NAMES`]; forgotten with the thread.
    early_names: FastMap<(u32, u32), Box<str>>,
    /// Threads first seen since the tables last started over.
    new_threads: usize,
    /// Threads `(pid, tid)` that exited and when their exit was seen; forgotten after
    /// [`FORGET_AFTER`] (a sample of theirs may still sit in another CPU's ring), a process only
    /// once it is gone from `/proc` (its main thread may exit before the others).
    exited: VecDeque<(u32, u32, Instant)>,
    /// When each process last exec'd (sample time).
    exec_times: FastMap<u32, u64>,
    /// Per process: bumped whenever its executable mappings change.
    space_gen: HashMap<u32, u64>,
    /// When each process's mappings were last re-read from `/proc`.
    refreshed: FastMap<u32, Instant>,
}

impl Lifetimes {
    /// Nothing seen yet.
    pub fn new() -> Lifetimes {
        Lifetimes {
            threads: FastMap::new(),
            names: Vec::new(),
            early_names: FastMap::new(),
            new_threads: 0,
            exited: VecDeque::new(),
            exec_times: FastMap::new(),
            space_gen: HashMap::new(),
            refreshed: FastMap::new(),
        }
    }

    /// Notes a sample of thread `(pid, tid)`; true when the thread is new (its name is the one
    /// the kernel reported for it before, else read from `/proc` then).
    pub fn sampled(&mut self, pid: u32, tid: u32) -> bool {
        let std::collections::hash_map::Entry::Vacant(e) = self.threads.entry((pid, tid)) else {
            return false;
        };
        let name = self
            .early_names
            .remove(&(pid, tid))
            .map(String::from)
            .or_else(|| thread_name(pid, tid));
        e.insert(name.as_deref().map(Into::into));
        if let Some(name) = name {
            self.names.push((pid, tid, name));
        }
        self.new_threads += 1;
        true
    }

    /// A thread changed its name (a `comm` record, an `exec` among them): a sampled thread's new
    /// name goes to the builder; a thread not sampled yet keeps it for its first sample.
    pub fn renamed(&mut self, pid: u32, tid: u32, name: &str) {
        if let Some(known) = self.threads.get_mut(&(pid, tid)) {
            *known = Some(name.into());
            self.names.push((pid, tid, name.to_string()));
        } else {
            if self.early_names.len() >= MAX_EARLY_NAMES {
                self.early_names.clear();
            }
            self.early_names.insert((pid, tid), name.into());
        }
    }

    /// `pid` exec'd at sample time `time`.
    pub fn exec(&mut self, pid: u32, time: u64) {
        self.mapped(pid);
        self.exec_times.insert(pid, time);
    }

    /// `pid`'s executable mappings changed.
    pub fn mapped(&mut self, pid: u32) {
        *self.space_gen.entry(pid).or_default() += 1;
    }

    /// The generation of `pid`'s executable mappings.
    pub fn space_gen(&self, pid: u32) -> u64 {
        self.space_gen.get(&pid).copied().unwrap_or(0)
    }

    /// Whether a sample of `pid` taken at `time` may have caught it inside an `execve` seen in
    /// this recording (the exec record's time may trail the exec by up to a millisecond).
    pub fn may_be_in_exec(&self, pid: u32, time: u64) -> bool {
        self.exec_times
            .get(&pid)
            .is_some_and(|&t| time >= t.saturating_sub(1_000_000))
    }

    /// Whether `pid`'s `/proc/PID/maps` may be re-read now (at most every [`REFRESH_EVERY`]);
    /// when it may, the re-read is counted as a mapping change.
    pub fn refresh_due(&mut self, pid: u32) -> bool {
        let now = Instant::now();
        let due = self
            .refreshed
            .get(&pid)
            .is_none_or(|t| now.duration_since(*t) >= REFRESH_EVERY);
        if due {
            self.refreshed.insert(pid, now);
            self.mapped(pid);
        }
        due
    }

    /// Thread `(pid, tid)` exited.
    pub fn exited(&mut self, pid: u32, tid: u32) {
        self.exited.push_back((pid, tid, Instant::now()));
    }

    /// Forgets the threads that exited a while ago (`urgent`: a moment ago, when the memory
    /// their binaries hold is wanted), and returns the processes among them that are gone from
    /// `/proc` (their state is to be dropped).
    pub fn forget_exited(&mut self, urgent: bool) -> Vec<u32> {
        let mut gone = Vec::new();
        let now = Instant::now();
        let after = if urgent {
            FORGET_URGENTLY_AFTER
        } else {
            FORGET_AFTER
        };
        while let Some(&(pid, tid, at)) = self.exited.front() {
            if now.duration_since(at) < after {
                break;
            }
            self.exited.pop_front();
            self.threads.remove(&(pid, tid));
            self.early_names.remove(&(pid, tid));
            if pid == tid {
                if std::fs::metadata(format!("/proc/{pid}")).is_ok() {
                    // Still there (other threads run on, or not yet reaped): look again later.
                    self.exited.push_back((pid, tid, now));
                    break;
                }
                self.refreshed.remove(&pid);
                self.exec_times.remove(&pid);
                gone.push(pid);
            }
        }
        gone
    }

    /// Threads first seen since the tables last started over.
    pub fn new_threads(&self) -> usize {
        self.new_threads
    }

    /// The thread names not yet handed over.
    pub fn take_names(&mut self) -> Vec<(u32, u32, String)> {
        std::mem::take(&mut self.names)
    }

    /// The tables started over: every live thread's name goes out again.
    pub fn start_over(&mut self) {
        self.new_threads = self.threads.len();
        for (&(pid, tid), name) in &self.threads {
            if let Some(name) = name {
                self.names.push((pid, tid, name.to_string()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_reported_before_a_threads_first_sample_names_it_once_proc_has_no_trace() {
        // No such process: `/proc` cannot name it when it is first sampled.
        let (pid, tid) = (u32::MAX - 7, u32::MAX - 7);
        let mut lifetimes = Lifetimes::new();
        lifetimes.renamed(pid, tid, "brief");
        assert!(lifetimes.take_names().is_empty(), "not sampled yet");
        assert!(lifetimes.sampled(pid, tid));
        assert_eq!(
            lifetimes.take_names(),
            vec![(pid, tid, "brief".to_string())]
        );
        // Renamed once known: the new name goes out.
        lifetimes.renamed(pid, tid, "later");
        assert_eq!(
            lifetimes.take_names(),
            vec![(pid, tid, "later".to_string())]
        );
        // A thread never sampled leaves nothing behind past the bound.
        for i in 0..MAX_EARLY_NAMES as u32 + 10 {
            lifetimes.renamed(i + 1_000_000_000, i + 1_000_000_000, "x");
        }
        assert!(lifetimes.early_names.len() <= MAX_EARLY_NAMES);
        // Without a reported name, `/proc` has none either.
        assert!(lifetimes.sampled(pid - 1, tid - 1));
        assert!(lifetimes.take_names().is_empty());
    }
}
