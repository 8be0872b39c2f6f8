//! Asking a running HotSpot JVM to write its perf map (`/tmp/perf-PID.map`) over HotSpot's
//! dynamic attach protocol — what `jcmd PID Compiler.perfmap` does, with no JDK tool.
//!
//! What the caller does: for a process [`is_hotspot`] says is a JVM, call [`ask_perf_map`] (one
//! blocking request), or keep a [`PerfMapAsker`], which asks on its own thread whenever
//! [`PerfMapAsker::want`] is called (at most once per second) and counts the answers; after a new
//! answer the whole perf map is read again (each answer rewrites it whole).
//!
//! What this does: the JVM starts its attach listener when it gets SIGQUIT while a file
//! `.attach_pidNSPID` (owned by its user or root) lies in its working directory or `/tmp`; the
//! listener then serves the socket `/tmp/.java_pidNSPID`. Everything is reached through
//! `/proc/PID/cwd` and `/proc/PID/root` under the JVM's own namespace PID, so a JVM in a container
//! works too. SIGQUIT is sent only to a JVM that handles it (a process without a handler would
//! dump core; `-Xrs` removes the handler). The JVM accepts a peer with its own effective uid and
//! gid, or root of its user namespace: when we are root and the JVM is not, the connection is
//! made from a short-lived thread that takes the JVM's uid and gid first (credentials are per
//! thread in the kernel; the thread's end drops them). A request is `1\0jcmd\0Compiler.perfmap\0\0\0`
//! (protocol version, command, three arguments); the answer is a status line (`0`: done) and the
//! command's output.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::files::namespace_pid;

/// How long a JVM gets to start its attach listener after SIGQUIT.
pub const LISTENER_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a JVM gets to write its perf map and answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests to one JVM are at least this far apart.
const ASK_INTERVAL: Duration = Duration::from_secs(1);
/// How often a starting JVM (no SIGQUIT handler yet, listener not answering) is tried, at most.
const STARTING_TRIES: u32 = 30;
/// The request: protocol version 1, `jcmd` with one argument (the command line) and two empty.
const REQUEST: &[u8] = b"1\0jcmd\0Compiler.perfmap\0\0\0";

/// Why a JVM was not asked or did not write its perf map.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The process is gone or its `/proc` entry unreadable.
    #[error("process {0} is gone")]
    Gone(u32),
    /// It runs as another user and we are not root.
    #[error("process {pid} runs as uid {uid}; only that user or root may ask it for its perf map")]
    NotPermitted {
        /// The process.
        pid: u32,
        /// Its effective uid.
        uid: u32,
    },
    /// It does not handle SIGQUIT: still starting, or started with `-Xrs`.
    #[error(
        "the JVM does not handle SIGQUIT (still starting, or started with -Xrs), so its attach \
         listener cannot be started"
    )]
    NoQuitHandler(u32),
    /// No attach socket appeared after SIGQUIT.
    #[error(
        "no attach socket within {} s of SIGQUIT: the JVM was started with \
         -XX:+DisableAttachMechanism (or is too busy to answer); run it without that flag, or \
         with -XX:+DumpPerfMapAtExit, to get names for its JIT-compiled code",
        LISTENER_TIMEOUT.as_secs()
    )]
    NoListener {
        /// The process.
        pid: u32,
    },
    /// The trigger file could not be made in the JVM's working directory nor its `/tmp`.
    #[error("can't create {path}: {source}")]
    Trigger {
        /// The last path tried.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Connecting to, writing to or reading from the attach socket failed.
    #[error("talking to {path}: {source}")]
    Socket {
        /// The socket.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The JVM answered with an error (an older JVM without `Compiler.perfmap`).
    #[error("the JVM answered status {status} to Compiler.perfmap: {message}")]
    Refused {
        /// The status line.
        status: String,
        /// The first line of its output.
        message: String,
    },
}

impl AttachError {
    /// Whether asking again later may work (a JVM still starting).
    pub fn may_pass_later(&self) -> bool {
        matches!(
            self,
            AttachError::NoQuitHandler(_) | AttachError::Socket { .. }
        )
    }
}

/// What `/proc/PID/status` says about a process.
#[derive(Debug, Clone, Copy)]
struct Status {
    nspid: u32,
    euid: u32,
    egid: u32,
    catches_quit: bool,
}

fn status(pid: u32) -> Result<Status, AttachError> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|_| AttachError::Gone(pid))?;
    let field = |name: &str, index: usize| -> Option<u64> {
        let line = text.lines().find_map(|l| l.strip_prefix(name))?;
        line.split_whitespace().nth(index)?.parse().ok()
    };
    let sigcgt = text
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let (Some(euid), Some(egid)) = (field("Uid:", 1), field("Gid:", 1)) else {
        return Err(AttachError::Gone(pid));
    };
    Ok(Status {
        nspid: namespace_pid(pid),
        euid: euid as u32,
        egid: egid as u32,
        catches_quit: sigcgt & (1 << (libc::SIGQUIT - 1)) != 0,
    })
}

/// Whether process `pid` runs HotSpot: it maps `libjvm.so` (and not OpenJ9's VM, which has a
/// `libjvm.so` too but another attach protocol).
pub fn is_hotspot(pid: u32) -> bool {
    let Ok(maps) = crate::process::read_maps(pid) else {
        return false;
    };
    let jvm = maps.iter().any(|m| m.path.ends_with("/libjvm.so"));
    jvm && !maps.iter().any(|m| m.path.contains("/libj9vm"))
}

/// Asks HotSpot JVM `pid` to write its perf map, starting its attach listener first when needed
/// (waiting at most [`LISTENER_TIMEOUT`] for it). Returns the JVM's output.
pub fn ask_perf_map(pid: u32) -> Result<String, AttachError> {
    let st = status(pid)?;
    let me_start = start_time(pid);
    let given_up = || GIVEN_UP.lock().unwrap_or_else(|p| p.into_inner());
    if given_up().contains(&(pid, me_start)) {
        // Attach is off: another SIGQUIT would only print another thread dump.
        return Err(AttachError::NoListener { pid });
    }
    let result = ask_perf_map_of(pid, st);
    if let Err(AttachError::NoListener { .. }) = result {
        given_up().insert((pid, me_start));
    }
    result
}

/// JVMs (pid, start time) that opened no attach socket after SIGQUIT: not signalled again.
static GIVEN_UP: Mutex<std::collections::BTreeSet<(u32, u64)>> =
    Mutex::new(std::collections::BTreeSet::new());

/// The process's start time (field 22 of `/proc/PID/stat`), telling a reused pid apart.
fn start_time(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let (_, rest) = s.rsplit_once(')')?;
            rest.split_whitespace().nth(19)?.parse().ok()
        })
        .unwrap_or(0)
}

fn ask_perf_map_of(pid: u32, st: Status) -> Result<String, AttachError> {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if me != 0 && me != st.euid {
        return Err(AttachError::NotPermitted { pid, uid: st.euid });
    }
    let tmp = format!("/proc/{pid}/root/tmp");
    let socket = PathBuf::from(format!("{tmp}/.java_pid{}", st.nspid));
    let listening = std::fs::symlink_metadata(&socket).is_ok_and(|m| m.file_type().is_socket());
    let stream = match listening.then(|| connect(pid, st, &socket)) {
        Some(Ok(s)) => s,
        // No listener yet, or a socket left behind by an earlier process with this pid.
        _ => {
            start_listener(pid, st, &socket)?;
            connect(pid, st, &socket)?
        }
    };
    exchange(stream, &socket)
}

/// Sends the request and reads the answer.
fn exchange(mut stream: UnixStream, socket: &Path) -> Result<String, AttachError> {
    let err = |source| AttachError::Socket {
        path: socket.to_path_buf(),
        source,
    };
    stream.set_read_timeout(Some(ANSWER_TIMEOUT)).map_err(err)?;
    stream
        .set_write_timeout(Some(ANSWER_TIMEOUT))
        .map_err(err)?;
    stream.write_all(REQUEST).map_err(err)?;
    let mut answer = Vec::new();
    stream.take(1 << 20).read_to_end(&mut answer).map_err(err)?;
    let answer = String::from_utf8_lossy(&answer);
    let (status, output) = answer.split_once('\n').unwrap_or((&answer, ""));
    if status.trim() != "0" {
        return Err(AttachError::Refused {
            status: status.trim().to_string(),
            message: output.lines().next().unwrap_or("").to_string(),
        });
    }
    // A jcmd failure inside the command (an unknown command on an older JVM) is reported in the
    // output with status 0 on some versions.
    if let Some(line) = output.lines().find(|l| l.contains("Exception")) {
        return Err(AttachError::Refused {
            status: "0".into(),
            message: line.to_string(),
        });
    }
    Ok(output.to_string())
}

/// Makes the trigger file, sends SIGQUIT and waits for the socket.
fn start_listener(pid: u32, st: Status, socket: &Path) -> Result<(), AttachError> {
    if !st.catches_quit {
        return Err(AttachError::NoQuitHandler(pid));
    }
    let name = format!(".attach_pid{}", st.nspid);
    let mut last_error = None;
    let mut trigger = None;
    for dir in [format!("/proc/{pid}/cwd"), format!("/proc/{pid}/root/tmp")] {
        let path = Path::new(&dir).join(&name);
        match create_trigger(&path, st) {
            Ok(()) => {
                trigger = Some(path);
                break;
            }
            Err(source) => last_error = Some(AttachError::Trigger { path, source }),
        }
    }
    let Some(trigger) = trigger else {
        return Err(last_error.unwrap_or(AttachError::Gone(pid)));
    };
    // SAFETY: kill with a valid signal number; at worst the pid is gone (ESRCH).
    let sent = unsafe { libc::kill(pid as i32, libc::SIGQUIT) } == 0;
    let deadline = Instant::now() + LISTENER_TIMEOUT;
    let mut up = false;
    while sent && Instant::now() < deadline {
        if std::fs::symlink_metadata(socket).is_ok_and(|m| m.file_type().is_socket()) {
            up = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(&trigger);
    match (sent, up) {
        (false, _) => Err(AttachError::Gone(pid)),
        (true, false) => Err(AttachError::NoListener { pid }),
        (true, true) => Ok(()),
    }
}

/// Creates the trigger file without following a symlink, owned by the JVM's user (HotSpot
/// ignores a trigger file owned by anyone but its user or root, as seen in its namespace).
fn create_trigger(path: &Path, st: Status) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // SAFETY: fchown on a file descriptor we own.
        if unsafe { libc::fchown(file.as_raw_fd(), st.euid, st.egid) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Connects to the attach socket, as the JVM's user when we are root and it is not.
fn connect(pid: u32, st: Status, socket: &Path) -> Result<UnixStream, AttachError> {
    let err = |source| AttachError::Socket {
        path: socket.to_path_buf(),
        source,
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || st.euid == 0 {
        return UnixStream::connect(socket).map_err(err);
    }
    // The target's /tmp, opened while we are root: after the switch the path through
    // /proc/PID/root might not be ours to follow.
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(format!("/proc/{pid}/root/tmp"))
        .map_err(err)?;
    let name = socket.file_name().unwrap_or_default().to_owned();
    let via = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
    let (uid, gid) = (st.euid, st.egid);
    let stream = std::thread::scope(|s| {
        s.spawn(move || -> std::io::Result<UnixStream> {
            // SAFETY: raw setresgid/setresuid change only this thread's credentials (the libc
            // wrappers would change every thread's); the thread ends right after the connect,
            // dropping them. Group first: after the uid switch we could no longer set it.
            let switched = unsafe {
                libc::syscall(libc::SYS_setresgid, -1i64, i64::from(gid), -1i64) == 0
                    && libc::syscall(libc::SYS_setresuid, -1i64, i64::from(uid), -1i64) == 0
            };
            if !switched {
                return Err(std::io::Error::last_os_error());
            }
            UnixStream::connect(&via)
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the connecting thread panicked")))
    });
    drop(dir);
    stream.map_err(err)
}

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

/// Asks every HotSpot JVM among `pids` for its perf map before a recording starts (all at once,
/// each bounded by [`LISTENER_TIMEOUT`] plus its answer). Returns one note per JVM that did not
/// write one.
pub fn ask_at_attach(pids: &[u32]) -> Vec<String> {
    let jvms: Vec<u32> = pids.iter().copied().filter(|&p| is_hotspot(p)).collect();
    std::thread::scope(|s| {
        let asks: Vec<_> = jvms
            .iter()
            .map(|&pid| (pid, s.spawn(move || ask_perf_map(pid))))
            .collect();
        asks.into_iter()
            .filter_map(|(pid, h)| match h.join() {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => Some(format!("JVM {pid}: {e}")),
                Err(_) => Some(format!("JVM {pid}: the thread asking it panicked")),
            })
            .collect()
    })
}

/// Most code addresses remembered per JVM as missing from its perf map.
const MISSES_KEPT: usize = 1 << 14;

/// The perf-map asking of one process's JIT state: whether it is a JVM, its asker, and which
/// code addresses were missing.
#[derive(Debug, Default)]
pub struct JvmPerfMap {
    checked: bool,
    asker: Option<PerfMapAsker>,
    /// Answers already read.
    seen: u64,
    /// Answers after which samples set aside for this JVM were unwound again.
    replayed: u64,
    /// Code addresses missing from the perf map, with the answers received when first missed.
    misses: std::collections::HashMap<u64, u64>,
}

impl JvmPerfMap {
    /// Asking state for a process not seen yet; with `ask` false, no JVM is asked.
    pub fn new(ask: bool) -> JvmPerfMap {
        JvmPerfMap {
            checked: !ask,
            ..JvmPerfMap::default()
        }
    }

    /// A code address of process `pid` has no symbol: the first time, find out whether it is a
    /// HotSpot JVM and start asking it; later, ask again — unless an answer asked for after the
    /// address was first missed did not name it either (then it never will).
    pub fn missed(&mut self, pid: u32, addr: u64) {
        if !self.checked {
            self.checked = true;
            if is_hotspot(pid) {
                self.asker = Some(PerfMapAsker::start(pid));
            }
            return;
        }
        let Some(asker) = &self.asker else {
            return;
        };
        let answers = asker.answers();
        if self.misses.len() >= MISSES_KEPT {
            self.misses.clear();
        }
        let first = *self.misses.entry(addr).or_insert(answers);
        // The answer in flight when the address was first missed may predate its code.
        if answers < first + 2 {
            asker.want();
        }
    }

    /// The asker, when a fresh answer may still name `addr`: no answer asked for after the
    /// address was first missed has arrived yet.
    fn may_still_name(&self, addr: u64) -> Option<&PerfMapAsker> {
        let asker = self.asker.as_ref().filter(|a| a.stopped().is_none())?;
        let answers = asker.answers();
        let first = self.misses.get(&addr).copied().unwrap_or(answers);
        (answers < first + 2).then_some(asker)
    }

    /// Whether the process is a JVM being asked: its perf map changes only with an answer.
    pub fn asking(&self) -> bool {
        self.asker.is_some()
    }

    /// Whether a new answer arrived since the last call (the perf map was rewritten whole).
    pub fn rewritten(&mut self) -> bool {
        let answers = self.asker.as_ref().map_or(0, PerfMapAsker::answers);
        let new = answers > self.seen;
        self.seen = answers;
        new
    }

    /// The asker, for a JVM.
    pub fn asker(&self) -> Option<&PerfMapAsker> {
        self.asker.as_ref()
    }
}

impl super::JitProcess {
    /// Whether a fresh perf map of this JVM may still name `addr`, which has no symbol now; if
    /// so, the JVM is asked at once.
    pub fn jvm_may_name(&mut self, addr: u64) -> bool {
        if self.symbol(addr).is_some() {
            return false;
        }
        self.jvm
            .may_still_name(addr)
            .map(PerfMapAsker::ask_now)
            .is_some()
    }

    /// The symbol at `addr`, for naming a frame: when a JVM's perf map misses it and a fresh
    /// answer may still name it, asks the JVM at once and waits for the answer until `deadline`.
    pub fn symbol_or_ask(&mut self, addr: u64, deadline: Instant) -> Option<&super::JitSymbol> {
        if self.symbol(addr).is_none()
            && Instant::now() < deadline
            && let Some(asker) = self.jvm.may_still_name(addr)
        {
            asker.wait(asker.ask_now(), deadline);
            self.refresh();
        }
        self.symbol(addr)
    }

    /// Why a JIT address of this process has no name, for the record summary.
    pub fn unnamed_reason(&self) -> String {
        if let Some(why) = self.jvm.asker().and_then(PerfMapAsker::stopped) {
            return why;
        }
        if self.jvm.asking() {
            return "JVM code missing from its perf map (freed, or compiled after the last answer)"
                .into();
        }
        if let Some(why) = &self.refused {
            return why.clone();
        }
        if self.map.is_none() && self.dump.is_none() {
            return "no perf map or jitdump file (the runtime was not asked or told to write one)"
                .into();
        }
        "code missing from the runtime's perf map or jitdump file".into()
    }
}

impl super::JitMaps {
    /// Asks every JVM being asked for a last perf map, waiting for the answers until
    /// `deadline` (the end of a recording, before its last frames are named).
    pub fn ask_jvms_again(&mut self, deadline: Instant) {
        let asked: Vec<(&PerfMapAsker, Ticket)> = self
            .procs
            .values()
            .filter_map(|p| p.jvm.asker())
            .filter(|a| a.stopped().is_none())
            .map(|a| (a, a.ask_now()))
            .collect();
        for (asker, answers) in asked {
            asker.wait(answers, deadline);
        }
    }

    /// The JVMs that answered since the last call.
    pub fn answered_jvms(&mut self) -> Vec<u32> {
        self.procs
            .iter_mut()
            .filter_map(|(&pid, p)| {
                let answers = p.jvm.asker()?.answers();
                let new = answers > p.jvm.replayed;
                p.jvm.replayed = answers;
                new.then_some(pid)
            })
            .collect()
    }

    /// Why JVMs are not asked for perf maps, one line each.
    pub fn jvm_notes(&self) -> Vec<String> {
        let mut notes: Vec<String> = self
            .procs
            .iter()
            .filter_map(|(pid, p)| Some(format!("JVM {pid}: {}", p.jvm.asker()?.note()?)))
            .collect();
        notes.sort();
        notes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    /// Plays the JVM's side of one exchange: checks the request, sends `answer`.
    fn exchange_with(answer: &'static str) -> Result<String, AttachError> {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let jvm = std::thread::spawn(move || {
            let mut request = vec![0u8; REQUEST.len()];
            theirs.read_exact(&mut request).unwrap();
            assert_eq!(request, REQUEST);
            theirs.write_all(answer.as_bytes()).unwrap();
        });
        let result = exchange(ours, Path::new("/tmp/.java_pid1"));
        jvm.join().unwrap();
        result
    }

    #[test]
    fn the_answer_says_whether_the_perf_map_was_written() {
        assert_eq!(exchange_with("0\n").unwrap(), "");
        let refused =
            exchange_with("-1\njava.lang.IllegalArgumentException: Unknown diagnostic command\n");
        assert!(
            matches!(&refused, Err(AttachError::Refused { status, message })
                if status == "-1" && message.contains("Unknown diagnostic command")),
            "{refused:?}"
        );
        let inside = exchange_with("0\njava.lang.IllegalArgumentException: Unknown command\n");
        assert!(
            matches!(inside, Err(AttachError::Refused { .. })),
            "{inside:?}"
        );
        assert!(matches!(
            exchange_with(""),
            Err(AttachError::Refused { .. })
        ));
    }

    #[test]
    fn a_perf_map_rewritten_whole_is_read_again_and_merged() {
        use super::super::PerfMap;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("perf-1.map");
        std::fs::write(
            &path,
            "0x7f0000001000 0x100 int A.a()\n0x7f0000002000 0x100 int A.b()\n",
        )
        .unwrap();
        let mut map = PerfMap::new(File::open(&path).unwrap());
        map.read_more().unwrap();
        // The JVM's next answer: A.a freed, A.b kept, A.c new, longer lines before the old end.
        std::fs::write(
            &path,
            "0x00007f0000002000 0x0000000000000100 int A.b()\n\
             0x00007f0000003000 0x0000000000000100 int A.c()\n",
        )
        .unwrap();
        map.rewind();
        map.read_more().unwrap();
        assert!(map.bad_lines.is_empty(), "{:?}", map.bad_lines);
        let names: Vec<String> = [0x7f00_0000_1010, 0x7f00_0000_2010, 0x7f00_0000_3010]
            .iter()
            .map(|&a| map.symbols.lookup(a).unwrap().name.name.clone())
            .collect();
        // Frames already sampled in freed code keep their names.
        assert_eq!(names, ["A.a()", "A.b()", "A.c()"]);
        assert_eq!(map.symbols.len(), 3);
    }

    #[test]
    fn a_process_without_a_sigquit_handler_is_never_signalled() {
        // `sleep` does not handle SIGQUIT: it would dump core.
        let mut sleep = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = sleep.id();
        assert!(!is_hotspot(pid));
        let result = ask_perf_map(pid);
        assert!(
            matches!(result, Err(AttachError::NoQuitHandler(p)) if p == pid),
            "{result:?}"
        );
        assert!(sleep.try_wait().unwrap().is_none(), "sleep was signalled");
        let trigger = format!("/proc/{pid}/cwd/.attach_pid{}", namespace_pid(pid));
        assert!(!Path::new(&trigger).exists(), "{trigger} was left behind");
        let _ = sleep.kill();
        let _ = sleep.wait();
    }
}
