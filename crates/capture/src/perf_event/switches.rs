//! The context-switch event of off-CPU recording: a software event sampled at every switch-out
//! of the watched threads (their user registers and stack as they leave the CPU), which also
//! asks for `PERF_RECORD_SWITCH` side-band records, whose switch-ins end each off-CPU interval.

use std::io;
use std::os::fd::AsRawFd;

use perf_event_open_sys as sys;
use sys::bindings as b;

use super::{EventConfig, EventKind, EventTarget, OpenError, PerfEvent, Ring, attr, open_raw};

impl PerfEvent {
    /// Opens the context-switch event (`PERF_COUNT_SW_CONTEXT_SWITCHES`, every switch sampled)
    /// on `target`, with the same sample layout as [`PerfEvent::open`] and `PERF_RECORD_SWITCH`
    /// records; with `output`, it writes into that context-switch event's ring (same CPU).
    ///
    /// The sample fires in the scheduler, in kernel mode, so kernel-mode events must be allowed
    /// (the kernel's own frames are still only recorded with `cfg.kernel`). Mappings, names and
    /// exits come from the sampling event on the same threads, not from this one.
    pub fn open_switches(
        target: EventTarget,
        cfg: &EventConfig,
        output: Option<&PerfEvent>,
    ) -> Result<PerfEvent, OpenError> {
        let mut a = attr(EventKind::CpuClock, cfg, target, false);
        a.type_ = b::PERF_TYPE_SOFTWARE;
        a.config = b::PERF_COUNT_SW_CONTEXT_SWITCHES as u64;
        a.__bindgen_anon_1.sample_period = 1;
        a.set_mmap(0);
        a.set_mmap2(0);
        a.set_comm(0);
        a.set_comm_exec(0);
        a.set_task(0);
        a.set_context_switch(1);
        let fd = open_raw(&mut a, target).map_err(|e| match e.raw_os_error() {
            Some(libc::ESRCH) => match target {
                EventTarget::Thread { tid, .. } => OpenError::NoSuchThread(tid),
                EventTarget::Cpu(_) => OpenError::Other(e),
            },
            Some(libc::EACCES | libc::EPERM) => OpenError::Permission {
                paranoid: super::paranoid(),
            },
            _ => OpenError::Other(e),
        })?;
        let ring = match output {
            Some(out) => {
                // SAFETY: both descriptors are live perf events; SET_OUTPUT only links the new
                // event's output to the other's ring.
                let rc = unsafe { sys::ioctls::SET_OUTPUT(fd.as_raw_fd(), out.fd.as_raw_fd()) };
                if rc < 0 {
                    return Err(OpenError::Other(io::Error::last_os_error()));
                }
                None
            }
            None => Some(Ring::new(&fd, cfg.ring_pages).map_err(OpenError::Other)?),
        };
        Ok(PerfEvent {
            fd,
            ring,
            kind: EventKind::CpuClock,
            switches: true,
            alloc: false,
        })
    }
}
