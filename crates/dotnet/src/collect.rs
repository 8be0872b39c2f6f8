//! Collecting a `.nettrace` from a live process: start an EventPipe session over the diagnostics
//! socket, copy its stream to a writer, and stop it at a deadline or on request.
//!
//! The session is always ended cleanly: on the deadline or when the caller's stop flag is set,
//! `StopTracing` goes out on a new connection and the stream is read to its end (the rundown, which
//! names the JIT-compiled methods, comes last). If this process dies instead, the runtime sees its
//! end of the socket close and abandons the session by itself; the target keeps running either way.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::discover::find_socket;
use crate::ipc::{DiagnosticsClient, IpcError, Session, SessionConfig};

/// How long to collect and what.
#[derive(Debug, Clone)]
pub struct CollectOptions {
    /// Session configuration (providers, buffer, rundown).
    pub session: SessionConfig,
    /// Stop after this long; `None` runs until the stop flag is set or the target exits.
    pub duration: Option<Duration>,
    /// After `StopTracing`, how long to wait for the rundown and the end of the stream.
    pub rundown_timeout: Duration,
}

impl Default for CollectOptions {
    fn default() -> CollectOptions {
        CollectOptions {
            session: SessionConfig::default(),
            duration: None,
            rundown_timeout: Duration::from_secs(60),
        }
    }
}

/// Why the collection stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The duration ran out.
    Deadline,
    /// The caller's stop flag was set (e.g. Ctrl-C).
    Requested,
    /// The runtime ended the stream by itself (the target exited or ended the session).
    StreamEnded,
}

/// What a collection did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectSummary {
    /// The runtime's session id.
    pub session_id: u64,
    /// The command that started the session (`CollectTracing2` or `CollectTracing`).
    pub command: &'static str,
    /// Bytes of `.nettrace` written.
    pub bytes: u64,
    /// Why collection stopped.
    pub reason: StopReason,
    /// True when the stream ended by itself after the stop (so the trace is whole, rundown
    /// included); false when it was cut after [`CollectOptions::rundown_timeout`].
    pub complete: bool,
    /// A failure to send `StopTracing` (e.g. the target exited meanwhile), if any.
    pub stop_error: Option<String>,
}

/// Collects from process `pid` into `out` until the duration ends, `stop` becomes true, or the
/// runtime ends the stream. See the [module docs](self).
pub fn collect(
    pid: u32,
    options: &CollectOptions,
    out: &mut (dyn Write + Send),
    stop: &AtomicBool,
) -> Result<CollectSummary, IpcError> {
    let client = DiagnosticsClient::new(find_socket(pid)?);
    let session = client.start_session(&options.session)?;
    collect_session(&client, session, options, out, stop)
}

/// Like [`collect`], for a session already started with `client` (so a caller learns at once
/// whether the runtime took it); `options.session` is not used.
pub fn collect_session(
    client: &DiagnosticsClient,
    session: Session,
    options: &CollectOptions,
    out: &mut (dyn Write + Send),
    stop: &AtomicBool,
) -> Result<CollectSummary, IpcError> {
    let mut stream = session.stream;
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .map_err(|source| IpcError::Io {
            context: "setting a socket timeout".into(),
            source,
        })?;
    let abort = AtomicBool::new(false);
    let ended = AtomicBool::new(false);
    let started = Instant::now();
    std::thread::scope(|scope| {
        let copier = scope.spawn(|| copy_stream(&mut stream, out, &abort, &ended));
        let finished = || ended.load(Ordering::Acquire) || copier.is_finished();
        let reason = loop {
            if finished() {
                break StopReason::StreamEnded;
            }
            if stop.load(Ordering::Acquire) {
                break StopReason::Requested;
            }
            if options.duration.is_some_and(|d| started.elapsed() >= d) {
                break StopReason::Deadline;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stop_error = None;
        if reason != StopReason::StreamEnded {
            if let Err(e) = client.stop_session(session.id) {
                stop_error = Some(e.to_string());
            }
            let waiting = Instant::now();
            while !finished() {
                if waiting.elapsed() >= options.rundown_timeout {
                    abort.store(true, Ordering::Release);
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let bytes = copier
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the stream copier panicked")))
            .map_err(|source| IpcError::Io {
                context: "copying the trace stream".into(),
                source,
            })?;
        Ok(CollectSummary {
            session_id: session.id,
            command: session.command,
            bytes,
            reason,
            complete: ended.load(Ordering::Acquire),
            stop_error,
        })
    })
}

/// Copies the stream to `out` until it ends (sets `ended`) or `abort` is set.
fn copy_stream(
    stream: &mut impl Read,
    out: &mut (dyn Write + Send),
    abort: &AtomicBool,
    ended: &AtomicBool,
) -> io::Result<u64> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        match stream.read(&mut buf) {
            Ok(0) => {
                out.flush()?;
                ended.store(true, Ordering::Release);
                return Ok(total);
            }
            Ok(n) => {
                out.write_all(&buf[..n])?;
                total += n as u64;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if abort.load(Ordering::Acquire) {
                    out.flush()?;
                    return Ok(total);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                // The runtime went away mid-stream: keep what arrived (not a complete trace).
                out.flush()?;
                return Ok(total);
            }
            Err(e) => return Err(e),
        }
    }
}
