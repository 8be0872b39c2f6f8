//! The uprobe event of allocation recording: a sample at every hit of a probe placed on an
//! instruction of a file (the `uprobe` PMU), with the same registers and user stack as CPU
//! samples, so the same unwinder walks it.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{
    EventConfig, EventKind, EventTarget, OpenError, PerfEvent, attr, open_error, open_raw,
    ring_or_output, without_side_band,
};

/// Where a uprobe sits: an instruction at `offset` bytes into the file `path`.
#[derive(Debug, Clone)]
pub struct UprobeSite {
    /// The file (a binary or shared library).
    pub path: std::path::PathBuf,
    /// File offset of the probed instruction.
    pub offset: u64,
}

/// The `uprobe` PMU's event type, from `/sys/bus/event_source/devices/uprobe/type`.
pub fn uprobe_pmu_type() -> io::Result<u32> {
    let text = std::fs::read_to_string("/sys/bus/event_source/devices/uprobe/type")?;
    text.trim()
        .parse()
        .map_err(|_| io::Error::other(format!("unexpected uprobe PMU type {text:?}")))
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::other("a uprobe path holds a NUL byte"))
}

impl PerfEvent {
    /// Opens a uprobe event at `site` on `target` (uprobe PMU type `pmu`), sampling every hit
    /// with the sample layout of [`PerfEvent::open`]; with `output`, it writes into that event's
    /// ring (same CPU). Mappings, names and exits come from the sampling event on the same
    /// threads, not from this one.
    pub fn open_uprobe(
        target: EventTarget,
        cfg: &EventConfig,
        output: Option<&PerfEvent>,
        pmu: u32,
        site: &UprobeSite,
    ) -> Result<PerfEvent, OpenError> {
        let path = c_path(&site.path).map_err(OpenError::Other)?;
        let mut a = attr(EventKind::CpuClock, cfg, target, false);
        a.type_ = pmu;
        a.config = 0;
        a.__bindgen_anon_3.config1 = path.as_ptr() as u64;
        a.__bindgen_anon_4.config2 = site.offset;
        a.__bindgen_anon_1.sample_period = 1;
        a.set_freq(0);
        without_side_band(&mut a);
        let fd = open_raw(&mut a, target).map_err(|e| {
            open_error(e, target, |e| {
                OpenError::Other(io::Error::new(
                    e.kind(),
                    format!("uprobe at {}+0x{:x}: {e}", site.path.display(), site.offset),
                ))
            })
        })?;
        drop(path);
        let ring = ring_or_output(&fd, output, cfg.ring_pages)?;
        Ok(PerfEvent {
            fd,
            ring,
            kind: EventKind::CpuClock,
            switches: None,
            alloc: true,
        })
    }

    /// Whether this is an allocation uprobe event ([`PerfEvent::open_uprobe`]).
    pub fn is_alloc(&self) -> bool {
        self.alloc
    }

    /// The event's descriptor, e.g. to attach a BPF program to it.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
