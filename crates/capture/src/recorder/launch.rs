//! Starting the command `record` launches: checked first, then started stopped just before its
//! exec so its events are attached before its first instruction; and the small process checks
//! and signals the recorder sends.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::RecordError;

/// Whether process `pid` exists and has not exited (a zombie, exited but not yet reaped by its
/// parent, is not alive).
pub(super) fn process_alive(pid: u32) -> bool {
    crate::process::life_stat(pid).is_some_and(|s| !s.exited())
}

/// Whether `/proc/PID/stat` shows the process stopped (`T`).
fn is_stopped(pid: u32) -> bool {
    crate::process::life_stat(pid).is_some_and(|s| s.state == 'T')
}

pub(super) fn send_signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) with a pid we spawned and a valid signal number; no memory is involved.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// Checks that `program` names a file execve(2) would run, looked up in `PATH` as execvp(3) does
/// when it has no `/`; the error is the one exec would give (`ENOENT`, `EACCES`, …).
fn check_runnable(program: &OsStr) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    let candidates: Vec<PathBuf> = if program.is_empty() {
        Vec::new()
    } else if program.as_bytes().contains(&b'/') {
        vec![PathBuf::from(program)]
    } else {
        let path =
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .collect()
    };
    let mut error = std::io::Error::from_raw_os_error(libc::ENOENT);
    for candidate in candidates {
        match std::fs::metadata(&candidate) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => return Ok(()),
            // A directory or a file without execute permission.
            Ok(_) => error = std::io::Error::from_raw_os_error(libc::EACCES),
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => error = e,
            Err(_) => {}
        }
    }
    Err(error)
}

/// Launches `argv` stopped just before its exec: a shell stops itself, then execs the command
/// when continued, so the event (enable-on-exec) is attached before the first instruction. A
/// program that cannot run is an error here, before any shell starts.
pub(super) fn launch(
    argv: &[OsString],
    env: &[(OsString, OsString)],
) -> Result<Child, RecordError> {
    let program = argv
        .first()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    check_runnable(argv.first().map_or(OsStr::new(""), OsString::as_os_str)).map_err(|source| {
        RecordError::Launch {
            command: program.clone(),
            source,
        }
    })?;
    let child = Command::new("/bin/sh")
        .arg("-c")
        .arg("kill -STOP $$; exec \"$0\" \"$@\"")
        .args(argv)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .spawn()
        .map_err(|source| RecordError::Launch {
            command: program.clone(),
            source,
        })?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !is_stopped(child.id()) {
        if Instant::now() > deadline {
            return Err(RecordError::Launch {
                command: program,
                source: std::io::Error::other("the launcher shell did not start"),
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(child)
}
