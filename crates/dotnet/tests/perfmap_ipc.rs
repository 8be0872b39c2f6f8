//! EnablePerfMap / DisablePerfMap against a Unix-socket peer that speaks the diagnostics IPC
//! framing (`DOTNET_IPC_V1\0`, u16 size, u8 command set, u8 command id, u16 reserved): the bytes
//! sent, and the handling of OK, error and "unknown command" answers.

#![cfg(unix)]

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::thread::JoinHandle;

use rootline_dotnet::ipc::{DiagnosticsClient, E_UNKNOWN_COMMAND, IpcError, PerfMapType};
use rootline_dotnet::perfmap::{Outcome, PerfMapGuard};

/// A server answer: (command set, command id, payload).
type Answer = (u8, u8, Vec<u8>);

fn answer(set: u8, id: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = b"DOTNET_IPC_V1\0".to_vec();
    out.extend_from_slice(&(20 + payload.len() as u16).to_le_bytes());
    out.extend_from_slice(&[set, id, 0, 0]);
    out.extend_from_slice(payload);
    out
}

fn ok() -> Answer {
    (0xff, 0x00, 0u32.to_le_bytes().to_vec())
}

fn error(hresult: u32) -> Answer {
    (0xff, 0xff, hresult.to_le_bytes().to_vec())
}

/// Serves one connection per answer; returns every request it read.
fn peer(socket: &Path, answers: Vec<Answer>) -> JoinHandle<Vec<Vec<u8>>> {
    let listener = UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        let mut requests = Vec::new();
        for (set, id, payload) in answers {
            let (mut conn, _) = listener.accept().unwrap();
            let mut header = [0u8; 20];
            conn.read_exact(&mut header).unwrap();
            let size = u16::from_le_bytes([header[14], header[15]]) as usize;
            let mut request = header.to_vec();
            request.resize(size, 0);
            conn.read_exact(&mut request[20..]).unwrap();
            requests.push(request);
            conn.write_all(&answer(set, id, &payload)).unwrap();
        }
        requests
    })
}

#[test]
fn enable_and_disable_send_the_documented_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("dotnet-diagnostic-1-1-socket");
    let server = peer(&socket, vec![ok(), ok()]);
    let client = DiagnosticsClient::new(&socket);
    client.enable_perf_map(PerfMapType::PerfMap).unwrap();
    client.disable_perf_map().unwrap();
    let requests = server.join().unwrap();
    let mut enable = b"DOTNET_IPC_V1\0".to_vec();
    enable.extend_from_slice(&[24, 0, 0x04, 0x05, 0, 0, 3, 0, 0, 0]);
    assert_eq!(requests[0], enable);
    let mut disable = b"DOTNET_IPC_V1\0".to_vec();
    disable.extend_from_slice(&[20, 0, 0x04, 0x06, 0, 0]);
    assert_eq!(requests[1], disable);
}

#[test]
fn error_and_unknown_command_answers_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s");
    let server = peer(&socket, vec![error(0x8000_4005), error(E_UNKNOWN_COMMAND)]);
    let client = DiagnosticsClient::new(&socket);
    match client.enable_perf_map(PerfMapType::All) {
        Err(IpcError::Server { hresult, command }) => {
            assert_eq!(hresult, 0x8000_4005);
            assert_eq!(command, "EnablePerfMap");
        }
        other => panic!("{other:?}"),
    }
    // The guard turns "unknown command" into advice for older runtimes.
    match PerfMapGuard::enable_at(std::process::id(), client) {
        Outcome::Unsupported(msg) => {
            assert!(msg.contains("unknown command"), "{msg}");
            assert!(msg.contains("DOTNET_PerfMapEnabled=1"), "{msg}");
            assert!(msg.contains("COMPlus_PerfMapEnabled=1"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    let requests = server.join().unwrap();
    assert_eq!(&requests[0][20..], &1u32.to_le_bytes());
}

#[test]
fn the_guard_disables_what_it_enabled_when_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s");
    let server = peer(&socket, vec![ok(), ok()]);
    // This test process writes no perf map, so the guard switches it off again.
    let guard = match PerfMapGuard::enable_at(std::process::id(), DiagnosticsClient::new(&socket)) {
        Outcome::Enabled(g) => g,
        other => panic!("{other:?}"),
    };
    assert!(guard.will_disable());
    drop(guard);
    let requests = server.join().unwrap();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1][16..18], [0x04, 0x06]);
}

#[test]
fn a_process_without_a_socket_is_not_dotnet() {
    assert!(matches!(
        PerfMapGuard::enable(std::process::id()),
        Outcome::NotDotnet
    ));
}
