//! A small OTLP/HTTP profiles receiver on 127.0.0.1 for tests. It decodes every request with the
//! official protos (the `opentelemetry-proto` crate, proto v1.10) and counts samples per process.
//! It can be told to stall (sleep past the client's timeout, then hang up without counting) or to
//! be down (refuse connections), or to throttle (503 with `Retry-After`), and comes back when told. [`Receiver::start_tls`] serves HTTPS
//! with a rustls server configuration instead (its handshakes are counted).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flate2::read::GzDecoder;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;

/// What the receiver got.
#[derive(Debug, Default, Clone)]
pub struct Received {
    /// `samples`-typed values per `process.pid` resource attribute.
    pub samples_by_pid: BTreeMap<i64, u64>,
    /// Requests decoded and counted.
    pub requests: u64,
    /// Resource attributes of the last request per pid (string form).
    pub resources: BTreeMap<i64, BTreeMap<String, String>>,
    /// Leaf function names seen, with sample counts.
    pub leaves: BTreeMap<String, u64>,
    /// Requests whose body did not decode (must stay 0).
    pub bad_requests: u64,
    /// Sum of every value per `process.pid` and profile sample type (`type/unit`).
    pub totals: BTreeMap<(i64, String), i64>,
    /// Leaf function names of `off_cpu` profiles, with their nanoseconds.
    pub off_cpu_leaves: BTreeMap<String, i64>,
}

impl Received {
    pub fn total(&self) -> u64 {
        self.samples_by_pid.values().sum()
    }
}

/// Switches and results of a running receiver.
#[derive(Debug, Default)]
pub struct ReceiverState {
    pub received: Mutex<Received>,
    /// Sleep this long before answering, then hang up without counting (stalled receiver).
    pub stall_ms: AtomicU64,
    /// Refuse connections and close open ones (dead receiver).
    pub down: AtomicBool,
    /// Requests that arrived while stalled.
    pub stalled_requests: AtomicU64,
    /// Throttle: answer 503 with `Retry-After: N` during N seconds from the first request.
    pub throttle_secs: AtomicU64,
    throttle_until: Mutex<Option<std::time::Instant>>,
    /// Requests answered 503 by the throttle.
    pub throttled_requests: AtomicU64,
    /// TLS handshakes completed (HTTPS receivers only).
    pub handshakes: AtomicU64,
    /// TLS handshakes that failed, with the last error.
    pub handshake_failures: AtomicU64,
    pub last_handshake_error: Mutex<String>,
    stop: AtomicBool,
}

/// A receiver running on a thread; stops when dropped.
pub struct Receiver {
    pub addr: SocketAddr,
    pub state: Arc<ReceiverState>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    pub fn start() -> Receiver {
        Receiver::start_with(None)
    }

    /// An HTTPS receiver using `tls` (certificate, and client verification if any).
    pub fn start_tls(tls: Arc<rustls::ServerConfig>) -> Receiver {
        Receiver::start_with(Some(tls))
    }

    fn start_with(tls: Option<Arc<rustls::ServerConfig>>) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ReceiverState::default());
        let s = Arc::clone(&state);
        let thread = std::thread::spawn(move || serve(listener, addr, s, tls));
        Receiver {
            addr,
            state,
            thread: Some(thread),
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The endpoint with the `https` scheme.
    pub fn https_endpoint(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub fn received(&self) -> Received {
        self.state.received.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.state.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(
    listener: TcpListener,
    addr: SocketAddr,
    state: Arc<ReceiverState>,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    let mut listener = Some(listener);
    while !state.stop.load(Relaxed) {
        if state.down.load(Relaxed) {
            listener = None; // connections are now refused
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        let l = match &listener {
            Some(l) => l,
            None => {
                // Back up on the same port (std sets SO_REUSEADDR on Unix).
                match TcpListener::bind(addr) {
                    Ok(l) => listener.insert(l),
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                }
            }
        };
        l.set_nonblocking(true).unwrap();
        match l.accept() {
            Ok((stream, _)) => {
                let s = Arc::clone(&state);
                let tls = tls.clone();
                std::thread::spawn(move || {
                    stream.set_nonblocking(false).unwrap();
                    stream
                        .set_read_timeout(Some(Duration::from_millis(100)))
                        .unwrap();
                    match tls {
                        None => handle(stream, s),
                        Some(config) => {
                            if let Some(tls_stream) = handshake(stream, config, &s) {
                                handle(tls_stream, s);
                            }
                        }
                    }
                });
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Completes the server side of a TLS handshake on `tcp`, counting successes and failures.
fn handshake(
    mut tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
    state: &ReceiverState,
) -> Option<rustls::StreamOwned<rustls::ServerConnection, TcpStream>> {
    let mut conn = rustls::ServerConnection::new(config).unwrap();
    let mut idle = 0;
    while conn.is_handshaking() {
        match conn.complete_io(&mut tcp) {
            Ok((0, 0)) => {
                // The client hung up before finishing.
                state.handshake_failures.fetch_add(1, Relaxed);
                *state.last_handshake_error.lock().unwrap() = "client closed".into();
                return None;
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) && idle < 50 =>
            {
                idle += 1;
            }
            Err(e) => {
                // Send our alert, then close gracefully: drain what the client still sends, so
                // that it reads the alert rather than a connection reset.
                let _ = conn.write_tls(&mut tcp);
                let _ = tcp.shutdown(std::net::Shutdown::Write);
                let mut sink = [0u8; 4096];
                for _ in 0..20 {
                    match tcp.read(&mut sink) {
                        Ok(0) => break,
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                        Err(_) => break,
                    }
                }
                state.handshake_failures.fetch_add(1, Relaxed);
                *state.last_handshake_error.lock().unwrap() = e.to_string();
                return None;
            }
        }
    }
    state.handshakes.fetch_add(1, Relaxed);
    Some(rustls::StreamOwned::new(conn, tcp))
}

fn handle<S: Read + Write>(stream: S, state: Arc<ReceiverState>) {
    let mut reader = BufReader::new(stream);
    loop {
        if state.stop.load(Relaxed) || state.down.load(Relaxed) {
            return;
        }
        let mut head = String::new();
        // Request line and headers.
        let mut content_length = 0usize;
        let mut gzip = false;
        let mut path = String::new();
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if head.is_empty() && line.is_empty() {
                        if state.stop.load(Relaxed) || state.down.load(Relaxed) {
                            return;
                        }
                        continue;
                    }
                    head.push_str(&line);
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    // Not HTTP (e.g. a TLS ClientHello): answer as HTTP servers do, then close.
                    let _ = reader.get_mut().write_all(
                        b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n\
                          400 Bad Request: malformed HTTP request",
                    );
                    return;
                }
                Err(_) => return,
            }
            if head.is_empty() {
                path = line.split_whitespace().nth(1).unwrap_or("").to_string();
            }
            head.push_str(&line);
            let lower = line.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                content_length = v.trim().parse().unwrap_or(0);
            }
            if lower.starts_with("content-encoding:") && lower.contains("gzip") {
                gzip = true;
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0u8; content_length];
        let mut read = 0;
        while read < content_length {
            match reader.read(&mut body[read..]) {
                Ok(0) => return,
                Ok(n) => read += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return,
            }
        }
        let stall = state.stall_ms.load(Relaxed);
        if stall > 0 {
            state.stalled_requests.fetch_add(1, Relaxed);
            std::thread::sleep(Duration::from_millis(stall));
            return; // hang up without answering or counting
        }
        if state.down.load(Relaxed) {
            return;
        }
        if let Some(retry_after) = throttled(&state) {
            let response = format!(
                "HTTP/1.1 503 Service Unavailable\r\nRetry-After: {retry_after}\r\n\
                 Content-Length: 0\r\n\r\n"
            );
            if reader.get_mut().write_all(response.as_bytes()).is_err() {
                return;
            }
            continue;
        }
        let status = if path == "/v1development/profiles" && count(&body, gzip, &state) {
            "200 OK"
        } else {
            "400 Bad Request"
        };
        let response = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"
        );
        if reader.get_mut().write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

/// When throttling is on (`throttle_secs` > 0): the first request opens a window of that many
/// seconds, and every request inside it is answered 503 with `Retry-After` of the same value.
fn throttled(state: &ReceiverState) -> Option<u64> {
    let secs = state.throttle_secs.load(Relaxed);
    if secs == 0 {
        return None;
    }
    let mut until = state.throttle_until.lock().unwrap();
    let now = std::time::Instant::now();
    let end = *until.get_or_insert(now + Duration::from_secs(secs));
    (now < end).then(|| {
        state.throttled_requests.fetch_add(1, Relaxed);
        secs
    })
}

fn count(body: &[u8], gzip: bool, state: &ReceiverState) -> bool {
    let raw = if gzip {
        let mut out = Vec::new();
        if GzDecoder::new(body).read_to_end(&mut out).is_err() {
            state.received.lock().unwrap().bad_requests += 1;
            return false;
        }
        out
    } else {
        body.to_vec()
    };
    let Ok(request) = ExportProfilesServiceRequest::decode(raw.as_slice()) else {
        state.received.lock().unwrap().bad_requests += 1;
        return false;
    };
    let dict = request.dictionary.clone().unwrap_or_default();
    let mut received = state.received.lock().unwrap();
    received.requests += 1;
    for rp in &request.resource_profiles {
        let mut attrs = BTreeMap::new();
        let mut pid = -1;
        for kv in rp.resource.iter().flat_map(|r| &r.attributes) {
            let text = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(n)) => {
                    if kv.key == "process.pid" {
                        pid = *n;
                    }
                    n.to_string()
                }
                other => format!("{other:?}"),
            };
            attrs.insert(kv.key.clone(), text);
        }
        for sp in &rp.scope_profiles {
            for profile in &sp.profiles {
                let type_name = profile
                    .sample_type
                    .as_ref()
                    .and_then(|t| dict.string_table.get(t.type_strindex as usize))
                    .cloned()
                    .unwrap_or_default();
                let unit = profile
                    .sample_type
                    .as_ref()
                    .and_then(|t| dict.string_table.get(t.unit_strindex as usize))
                    .cloned()
                    .unwrap_or_default();
                let leaf_of =
                    |sample: &opentelemetry_proto::tonic::profiles::v1development::Sample| {
                        dict.stack_table
                            .get(sample.stack_index as usize)
                            .and_then(|s| s.location_indices.first())
                            .and_then(|&l| dict.location_table.get(l as usize))
                            .and_then(|l| l.lines.first())
                            .and_then(|line| dict.function_table.get(line.function_index as usize))
                            .and_then(|f| dict.string_table.get(f.name_strindex as usize))
                            .cloned()
                            .unwrap_or_default()
                    };
                for sample in &profile.samples {
                    let n: i64 = sample.values.iter().sum();
                    *received
                        .totals
                        .entry((pid, format!("{type_name}/{unit}")))
                        .or_default() += n;
                    if type_name == "off_cpu" {
                        *received.off_cpu_leaves.entry(leaf_of(sample)).or_default() += n;
                    }
                }
                if type_name != "samples" {
                    continue;
                }
                for sample in &profile.samples {
                    let n: i64 = sample.values.iter().sum();
                    *received.samples_by_pid.entry(pid).or_default() += n as u64;
                    let leaf = dict
                        .stack_table
                        .get(sample.stack_index as usize)
                        .and_then(|s| s.location_indices.first())
                        .and_then(|&l| dict.location_table.get(l as usize))
                        .and_then(|l| l.lines.first())
                        .and_then(|line| dict.function_table.get(line.function_index as usize))
                        .and_then(|f| dict.string_table.get(f.name_strindex as usize))
                        .cloned()
                        .unwrap_or_default();
                    *received.leaves.entry(leaf).or_default() += n as u64;
                }
            }
        }
        received.resources.insert(pid, attrs);
    }
    true
}
