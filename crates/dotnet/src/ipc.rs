//! The .NET diagnostics IPC protocol: message framing, the EventPipe commands
//! (`CollectTracing`, `CollectTracing2`, `StopTracing`), and provider configurations.
//!
//! Every command uses a fresh connection: the client sends one message, the runtime answers with
//! one message, and for `CollectTracing*` the connection then carries the `.nettrace` stream until
//! the session stops.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

const MAGIC: &[u8; 14] = b"DOTNET_IPC_V1\0";
const HEADER_SIZE: usize = 20;
const SET_EVENTPIPE: u8 = 0x02;
const SET_SERVER: u8 = 0xff;
const EVENTPIPE_STOP: u8 = 0x01;
const EVENTPIPE_COLLECT: u8 = 0x02;
const EVENTPIPE_COLLECT2: u8 = 0x03;
const SET_PROCESS: u8 = 0x04;
const PROCESS_ENABLE_PERFMAP: u8 = 0x05;
const PROCESS_DISABLE_PERFMAP: u8 = 0x06;
const SERVER_OK: u8 = 0x00;
const SERVER_ERROR: u8 = 0xff;
/// The runtime does not know the command (an older runtime).
pub const E_UNKNOWN_COMMAND: u32 = 0x8013_1385;

/// Errors talking to a runtime's diagnostics server.
#[derive(Debug, thiserror::Error)]
pub enum IpcError {
    /// No diagnostics socket was found for the process.
    #[error(
        "process {pid} has no .NET diagnostics socket (looked for dotnet-diagnostic-{pid}-*-socket \
         in {searched}); is it a .NET Core 3.0+ process with diagnostics enabled \
         (DOTNET_EnableDiagnostics is not 0)?"
    )]
    NoSocket {
        /// The process id.
        pid: u32,
        /// The directories searched.
        searched: String,
    },
    /// The process does not exist.
    #[error("process {pid} does not exist")]
    NoProcess {
        /// The process id.
        pid: u32,
    },
    /// An I/O operation on the socket failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: io::Error,
    },
    /// The runtime answered with an error code.
    #[error("the runtime refused {command}: HRESULT 0x{hresult:08x}{}", hresult_text(*.hresult))]
    Server {
        /// The command sent.
        command: &'static str,
        /// The HRESULT the runtime returned.
        hresult: u32,
    },
    /// The runtime's answer did not follow the protocol.
    #[error("unexpected answer to {command}: {detail}")]
    Protocol {
        /// The command sent.
        command: &'static str,
        /// What was wrong.
        detail: String,
    },
}

fn hresult_text(h: u32) -> &'static str {
    match h {
        0x8013_1384 => " (bad encoding)",
        E_UNKNOWN_COMMAND => " (unknown command)",
        0x8013_1386 => " (unknown magic)",
        0x8013_1515 => " (not supported)",
        0x8013_135b => " (not yet available)",
        0x8000_4005 => " (failure)",
        0x8007_0057 => " (invalid argument)",
        _ => "",
    }
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> IpcError {
    let context = context.into();
    move |source| IpcError::Io { context, source }
}

/// One EventPipe provider to enable: name, keywords, level and optional `key=value;…` arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provider {
    /// Provider name, e.g. `Microsoft-Windows-DotNETRuntime`.
    pub name: String,
    /// Keyword mask.
    pub keywords: u64,
    /// Level: 1 critical … 5 verbose.
    pub level: u32,
    /// Filter arguments (`key=value;…`), if any.
    pub arguments: Option<String>,
}

impl Provider {
    /// dotnet-trace's `cpu-sampling` profile: thread samples every millisecond, and the runtime
    /// events that name JIT-compiled code (loader, JIT, GC allocation ticks…).
    pub fn cpu_sampling() -> Vec<Provider> {
        vec![
            Provider {
                name: crate::events::SAMPLE_PROFILER.into(),
                keywords: 0xF000_0000_0000,
                level: 4,
                arguments: None,
            },
            Provider {
                name: crate::events::RUNTIME.into(),
                keywords: 0x14_C14F_CCBD,
                level: 4,
                arguments: None,
            },
        ]
    }

    /// The runtime's GC keyword (`GCKeyword`, 0x1).
    pub const GC_KEYWORD: u64 = 0x1;
    /// The level the runtime sends `GCAllocationTick` at: verbose.
    pub const VERBOSE: u32 = 5;

    /// Adds GC allocation ticks (runtime event 10, about one per 100 KB allocated, each with its
    /// stack, amount and type) to `providers`: the runtime provider's GC keyword at verbose level,
    /// merged into the runtime provider's entry when there is one (its keywords ORed, its level
    /// raised), else a new entry.
    pub fn add_allocation_ticks(providers: &mut Vec<Provider>) {
        match providers
            .iter_mut()
            .find(|p| p.name == crate::events::RUNTIME)
        {
            Some(p) => {
                p.keywords |= Provider::GC_KEYWORD;
                p.level = p.level.max(Provider::VERBOSE);
            }
            None => providers.push(Provider {
                name: crate::events::RUNTIME.into(),
                keywords: Provider::GC_KEYWORD,
                level: Provider::VERBOSE,
                arguments: None,
            }),
        }
    }

    /// Parses dotnet-trace's `--providers` syntax: `Name[:Keywords[:Level[:Args]]]`, comma-separated.
    /// Keywords are hexadecimal (`0x` optional); a missing keyword mask enables all keywords, a
    /// missing level is 4 (informational).
    pub fn parse_list(text: &str) -> Result<Vec<Provider>, String> {
        let mut out = Vec::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let mut parts = item.splitn(4, ':');
            let name = parts.next().unwrap_or_default().to_string();
            if name.is_empty() {
                return Err(format!("provider {item:?} has no name"));
            }
            let keywords = match parts.next().filter(|s| !s.is_empty()) {
                None => u64::MAX,
                Some(k) => {
                    let hex = k.trim_start_matches("0x").trim_start_matches("0X");
                    u64::from_str_radix(hex, 16).map_err(|_| {
                        format!("provider {name}: keywords {k:?} are not hexadecimal")
                    })?
                }
            };
            let level = match parts.next().filter(|s| !s.is_empty()) {
                None => 4,
                Some(l) => match l.to_ascii_lowercase().as_str() {
                    "critical" => 1,
                    "error" => 2,
                    "warning" => 3,
                    "informational" => 4,
                    "verbose" => 5,
                    n => n.parse().map_err(|_| {
                        format!("provider {name}: level {l:?} is not 0-5 or a name")
                    })?,
                },
            };
            if level > 5 {
                return Err(format!("provider {name}: level {level} is above 5"));
            }
            out.push(Provider {
                name,
                keywords,
                level,
                arguments: parts.next().map(str::to_string),
            });
        }
        if out.is_empty() {
            return Err("no providers given".into());
        }
        Ok(out)
    }
}

/// How to start an EventPipe session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionConfig {
    /// The runtime's buffer for the session, in MB.
    pub circular_buffer_mb: u32,
    /// Ask the runtime for rundown events (method and module names) when the session stops.
    pub request_rundown: bool,
    /// The providers to enable.
    pub providers: Vec<Provider>,
}

impl Default for SessionConfig {
    fn default() -> SessionConfig {
        SessionConfig {
            circular_buffer_mb: 256,
            request_rundown: true,
            providers: Provider::cpu_sampling(),
        }
    }
}

fn put_string(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        None => out.extend_from_slice(&0u32.to_le_bytes()),
        Some(s) => {
            let units: Vec<u16> = s.encode_utf16().chain(std::iter::once(0)).collect();
            out.extend_from_slice(&(units.len() as u32).to_le_bytes());
            for u in units {
                out.extend_from_slice(&u.to_le_bytes());
            }
        }
    }
}

/// Encodes a whole IPC message: header plus payload.
pub fn encode_message(command_set: u8, command_id: u8, payload: &[u8]) -> Vec<u8> {
    let size = u16::try_from(HEADER_SIZE + payload.len()).unwrap_or(u16::MAX);
    let mut out = Vec::with_capacity(HEADER_SIZE + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&size.to_le_bytes());
    out.push(command_set);
    out.push(command_id);
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Encodes a `CollectTracing2` (with the rundown flag) or `CollectTracing` (without) message.
pub fn encode_collect(config: &SessionConfig, version2: bool) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&config.circular_buffer_mb.to_le_bytes());
    p.extend_from_slice(&1u32.to_le_bytes()); // format: NetTrace
    if version2 {
        p.push(u8::from(config.request_rundown));
    }
    p.extend_from_slice(&(config.providers.len() as u32).to_le_bytes());
    for provider in &config.providers {
        p.extend_from_slice(&provider.keywords.to_le_bytes());
        p.extend_from_slice(&provider.level.to_le_bytes());
        put_string(&mut p, Some(&provider.name));
        put_string(&mut p, provider.arguments.as_deref());
    }
    let id = if version2 {
        EVENTPIPE_COLLECT2
    } else {
        EVENTPIPE_COLLECT
    };
    encode_message(SET_EVENTPIPE, id, &p)
}

/// Reads one answer; returns its payload on OK, the HRESULT as an error otherwise.
fn read_answer(stream: &mut UnixStream, command: &'static str) -> Result<Vec<u8>, IpcError> {
    let mut header = [0u8; HEADER_SIZE];
    stream
        .read_exact(&mut header)
        .map_err(io_err(format!("reading the runtime's answer to {command}")))?;
    if &header[..14] != MAGIC {
        return Err(IpcError::Protocol {
            command,
            detail: "answer does not start with DOTNET_IPC_V1".into(),
        });
    }
    let size = usize::from(u16::from_le_bytes([header[14], header[15]]));
    if size < HEADER_SIZE {
        return Err(IpcError::Protocol {
            command,
            detail: format!("answer size {size} is below the header size"),
        });
    }
    let mut payload = vec![0u8; size - HEADER_SIZE];
    stream
        .read_exact(&mut payload)
        .map_err(io_err(format!("reading the runtime's answer to {command}")))?;
    match (header[16], header[17]) {
        (SET_SERVER, SERVER_OK) => Ok(payload),
        (SET_SERVER, SERVER_ERROR) => {
            let hresult = payload
                .get(..4)
                .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            Err(IpcError::Server { command, hresult })
        }
        (set, id) => Err(IpcError::Protocol {
            command,
            detail: format!("command 0x{set:02x}{id:02x} in the answer"),
        }),
    }
}

fn session_id(payload: &[u8], command: &'static str) -> Result<u64, IpcError> {
    payload
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
        .ok_or_else(|| IpcError::Protocol {
            command,
            detail: format!(
                "{} payload bytes where a session id (8) was expected",
                payload.len()
            ),
        })
}

/// A connection to one runtime's diagnostics socket.
#[derive(Debug, Clone)]
pub struct DiagnosticsClient {
    socket: PathBuf,
}

/// A started EventPipe session: its id and the connection carrying its `.nettrace` stream.
#[derive(Debug)]
pub struct Session {
    /// The runtime's session id (for `StopTracing`).
    pub id: u64,
    /// The command that started it: `CollectTracing2` or `CollectTracing`.
    pub command: &'static str,
    /// The stream; read it to the end to get the whole trace.
    pub stream: UnixStream,
}

impl DiagnosticsClient {
    /// A client for the socket at `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> DiagnosticsClient {
        DiagnosticsClient {
            socket: socket.into(),
        }
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    fn connect(&self) -> Result<UnixStream, IpcError> {
        let stream = UnixStream::connect(&self.socket).map_err(io_err(format!(
            "connecting to the diagnostics socket {}",
            self.socket.display()
        )))?;
        // Answers come promptly; a silent runtime must not hang the caller forever.
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(io_err("setting a socket timeout"))?;
        Ok(stream)
    }

    /// Starts a session with `CollectTracing2`, falling back to `CollectTracing` when the runtime
    /// does not know that command. The returned stream has no read timeout.
    pub fn start_session(&self, config: &SessionConfig) -> Result<Session, IpcError> {
        match self.start_with(config, true) {
            Err(IpcError::Server {
                hresult: E_UNKNOWN_COMMAND,
                ..
            }) => self.start_with(config, false),
            other => other,
        }
    }

    fn start_with(&self, config: &SessionConfig, version2: bool) -> Result<Session, IpcError> {
        let command = if version2 {
            "CollectTracing2"
        } else {
            "CollectTracing"
        };
        let mut stream = self.connect()?;
        stream
            .write_all(&encode_collect(config, version2))
            .map_err(io_err(format!("sending {command}")))?;
        let payload = read_answer(&mut stream, command)?;
        let id = session_id(&payload, command)?;
        stream
            .set_read_timeout(None)
            .map_err(io_err("clearing the socket timeout"))?;
        Ok(Session {
            id,
            command,
            stream,
        })
    }

    /// Stops session `id` (on a new connection, as the protocol asks). The runtime then sends the
    /// rundown and closes the session's stream.
    pub fn stop_session(&self, id: u64) -> Result<(), IpcError> {
        let mut stream = self.connect()?;
        let msg = encode_message(SET_EVENTPIPE, EVENTPIPE_STOP, &id.to_le_bytes());
        stream
            .write_all(&msg)
            .map_err(io_err("sending StopTracing"))?;
        let payload = read_answer(&mut stream, "StopTracing")?;
        let stopped = session_id(&payload, "StopTracing")?;
        if stopped != id {
            return Err(IpcError::Protocol {
                command: "StopTracing",
                detail: format!("stopped session {stopped}, asked for {id}"),
            });
        }
        Ok(())
    }
}

/// What `EnablePerfMap` turns on (.NET 8+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum PerfMapType {
    /// Both `/tmp/perf-PID.map` and jitdump.
    All = 1,
    /// Only jitdump (`jit-PID.dump`).
    JitDump = 2,
    /// Only the perf map (`/tmp/perf-PID.map`).
    PerfMap = 3,
}

impl DiagnosticsClient {
    /// Asks the runtime to start writing perf maps and/or jitdump files (.NET 8 and later; older
    /// runtimes answer [`E_UNKNOWN_COMMAND`]).
    pub fn enable_perf_map(&self, kind: PerfMapType) -> Result<(), IpcError> {
        self.process_command(
            "EnablePerfMap",
            PROCESS_ENABLE_PERFMAP,
            &(kind as u32).to_le_bytes(),
        )
    }

    /// Asks the runtime to stop writing perf maps and jitdump files (.NET 8 and later).
    pub fn disable_perf_map(&self) -> Result<(), IpcError> {
        self.process_command("DisablePerfMap", PROCESS_DISABLE_PERFMAP, &[])
    }

    fn process_command(
        &self,
        command: &'static str,
        id: u8,
        payload: &[u8],
    ) -> Result<(), IpcError> {
        let mut stream = self.connect()?;
        stream
            .write_all(&encode_message(SET_PROCESS, id, payload))
            .map_err(io_err(format!("sending {command}")))?;
        let answer = read_answer(&mut stream, command)?;
        let hresult = answer
            .get(..4)
            .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        if hresult != 0 {
            return Err(IpcError::Server { command, hresult });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_ticks_merge_into_the_runtime_provider() {
        let mut cpu = Provider::cpu_sampling();
        Provider::add_allocation_ticks(&mut cpu);
        assert_eq!(cpu.len(), 2);
        assert_eq!(cpu[1].name, crate::events::RUNTIME);
        assert_eq!(cpu[1].keywords, 0x14_C14F_CCBD | 0x1);
        assert_eq!(cpu[1].level, 5);
        assert_eq!(cpu[0], Provider::cpu_sampling()[0]);
        let mut only_samples = vec![Provider::cpu_sampling().remove(0)];
        Provider::add_allocation_ticks(&mut only_samples);
        assert_eq!(only_samples.len(), 2);
        assert_eq!((only_samples[1].keywords, only_samples[1].level), (1, 5));
    }

    #[test]
    fn collect_message_matches_the_protocol_example() {
        // The protocol document's CollectTracing example: 250 MB, NetTrace, one provider
        // "MyEventSource" with keywords 100 and level 2, no arguments; 80 bytes in all.
        let config = SessionConfig {
            circular_buffer_mb: 250,
            request_rundown: true,
            providers: vec![Provider {
                name: "MyEventSource".into(),
                keywords: 100,
                level: 2,
                arguments: None,
            }],
        };
        let msg = encode_collect(&config, false);
        assert_eq!(msg.len(), 80);
        assert_eq!(&msg[..14], b"DOTNET_IPC_V1\0");
        assert_eq!(&msg[14..20], &[80, 0, 2, 2, 0, 0]);
        assert_eq!(&msg[20..24], &250u32.to_le_bytes());
        assert_eq!(&msg[28..32], &1u32.to_le_bytes());
        assert_eq!(&msg[44..48], &14u32.to_le_bytes());
        assert_eq!(&msg[76..80], &0u32.to_le_bytes());
        let msg2 = encode_collect(&config, true);
        assert_eq!(msg2.len(), 81);
        assert_eq!(&msg2[16..18], &[2, 3]);
        assert_eq!(msg2[28], 1);
    }

    #[test]
    fn parses_dotnet_trace_provider_syntax() {
        let p = Provider::parse_list(
            "Microsoft-Windows-DotNETRuntime:0x14C14FCCBD:4,My-Source::verbose:k=v,Other",
        )
        .unwrap();
        assert_eq!(p[0].keywords, 0x14_C14F_CCBD);
        assert_eq!(p[0].level, 4);
        assert_eq!(p[1].keywords, u64::MAX);
        assert_eq!(p[1].level, 5);
        assert_eq!(p[1].arguments.as_deref(), Some("k=v"));
        assert_eq!(p[2].level, 4);
        assert!(Provider::parse_list("X:zz").is_err());
        assert!(Provider::parse_list("X:1:9").is_err());
        assert!(Provider::parse_list(" , ").is_err());
    }
}
