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
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::files::namespace_pid;

mod asker;
mod process;

pub use asker::{PerfMapAsker, Ticket};
pub use process::JvmPerfMap;

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
    /// Its options switch attach off: it is not signalled.
    #[error(
        "the JVM was started with -XX:+DisableAttachMechanism, so it cannot be asked for its perf \
         map; run it without that flag to get names for its JIT-compiled code"
    )]
    AttachOff,
    /// No attach socket appeared after SIGQUIT.
    #[error(
        "no attach socket within {} s of SIGQUIT: the JVM was started with \
         -XX:+DisableAttachMechanism (or is too busy to answer); run it without that flag to get \
         names for its JIT-compiled code",
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
    // A JVM that ends while it is asked (its last unnamed samples come as it exits) fails the
    // asking with whatever step met its end: its trigger file's directory gone, no socket, a
    // broken connection. That is its end, not a refusal.
    let result = match result {
        Err(e) if !matches!(e, AttachError::Gone(_)) && !running_since(pid, me_start) => {
            Err(AttachError::Gone(pid))
        }
        result => result,
    };
    if let Err(AttachError::NoListener { .. }) = result {
        given_up().insert((pid, me_start));
    }
    result
}

/// Whether process `pid` still runs, started at `start` (not a zombie, not a reused pid).
fn running_since(pid: u32, start: u64) -> bool {
    crate::process::life_stat(pid).is_some_and(|s| !s.exited() && s.start_time == start)
}

/// JVMs (pid, start time) that opened no attach socket after SIGQUIT: not signalled again.
static GIVEN_UP: Mutex<std::collections::BTreeSet<(u32, u64)>> =
    Mutex::new(std::collections::BTreeSet::new());

/// The process's start time (0 when it is gone), telling a reused pid apart.
fn start_time(pid: u32) -> u64 {
    crate::process::life_stat(pid).map_or(0, |s| s.start_time)
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
            if attach_off_by_option(pid) {
                // SIGQUIT would only print a thread dump on its output.
                return Err(AttachError::AttachOff);
            }
            start_listener(pid, st, &socket)?;
            connect(pid, st, &socket)?
        }
    };
    exchange(stream, &socket)
}

/// Whether the JVM's options, on its command line or in the variables the launcher and the JVM
/// read, switch its attach mechanism off (the last `±DisableAttachMechanism` wins; the command
/// line comes after `JDK_JAVA_OPTIONS` and `JAVA_TOOL_OPTIONS`, `_JAVA_OPTIONS` after it).
fn attach_off_by_option(pid: u32) -> bool {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let var = |name: &str| -> Vec<u8> {
        environ
            .split(|&b| b == 0)
            .find_map(|v| v.strip_prefix(format!("{name}=").as_bytes()))
            .unwrap_or_default()
            .to_vec()
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let mut off = false;
    for options in [
        var("JDK_JAVA_OPTIONS"),
        var("JAVA_TOOL_OPTIONS"),
        cmdline,
        var("_JAVA_OPTIONS"),
    ] {
        let text = String::from_utf8_lossy(&options);
        for word in text.split(|c: char| c == '\0' || c.is_whitespace()) {
            match word {
                "-XX:+DisableAttachMechanism" => off = true,
                "-XX:-DisableAttachMechanism" => off = false,
                _ => {}
            }
        }
    }
    off
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_that_ended_is_not_running_though_its_entry_stays() {
        let me = std::process::id();
        assert!(running_since(me, start_time(me)));
        assert!(
            !running_since(me, start_time(me) + 1),
            "another start: a reused pid"
        );
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("run true");
        let pid = child.id();
        let start = start_time(pid);
        // Not reaped yet: a zombie, whose /proc entry (and start time) stays.
        let deadline = Instant::now() + Duration::from_secs(10);
        while running_since(pid, start) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(start_time(pid), start, "the zombie's entry is still there");
        assert!(!running_since(pid, start));
        child.wait().expect("reap");
        assert!(!running_since(pid, start));
    }

    #[test]
    fn a_process_that_ends_while_asked_is_gone_not_refusing() {
        // Handles SIGQUIT, as a JVM does, but ends at it instead of opening a socket.
        let dir = tempfile::tempdir().expect("temp dir");
        let mut child = std::process::Command::new("sh")
            .args(["-c", "trap 'exit 0' QUIT; while :; do sleep 0.05; done"])
            .current_dir(dir.path())
            .spawn()
            .expect("run sh");
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !status(pid).is_ok_and(|s| s.catches_quit) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let result = ask_perf_map(pid);
        assert!(
            matches!(result, Err(AttachError::Gone(p)) if p == pid),
            "{result:?}"
        );
        child.wait().expect("reap");
    }

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
    fn attach_switched_off_by_options_is_seen_without_asking() {
        let run = |env: &str, arg: &str| {
            let mut sh = std::process::Command::new("sh")
                .args(["-c", "sleep 30; true", arg])
                .env("JAVA_TOOL_OPTIONS", env)
                .spawn()
                .unwrap();
            // Until the exec, /proc shows this test's command line and environment.
            let cmdline = format!("/proc/{}/cmdline", sh.id());
            while !std::fs::read(&cmdline)
                .unwrap_or_default()
                .starts_with(b"sh\0")
            {
                std::thread::yield_now();
            }
            let off = attach_off_by_option(sh.id());
            let _ = sh.kill();
            let _ = sh.wait();
            off
        };
        assert!(run("-Xmx1g -XX:+DisableAttachMechanism", "x"));
        assert!(run("", "-XX:+DisableAttachMechanism"));
        // The command line comes after JAVA_TOOL_OPTIONS.
        assert!(!run(
            "-XX:+DisableAttachMechanism",
            "-XX:-DisableAttachMechanism"
        ));
        assert!(!run("-XX:+DisableAttachMechanismX", "x"));
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
