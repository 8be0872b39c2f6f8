//! The context-switch event of off-CPU recording: an event sampled at every switch-out of the
//! watched threads (their user registers and stack as they leave the CPU), and beside it a dummy
//! event for the `PERF_RECORD_SWITCH` side-band records, whose switch-ins end each off-CPU
//! interval: those go on while the sampling event is disabled (the rate cap).
//!
//! The event is the `sched:sched_switch` tracepoint when tracefs gives its id: its raw payload
//! carries `prev_state`, the state the thread left in (sleeping, uninterruptible, stopped, or
//! still runnable: preempted). Without tracefs it is the `context-switches` software event, which
//! fires at the same point but says nothing of the state (the switch records still tell a
//! preempted thread from one that left of its own accord).

use std::sync::OnceLock;

use perf_event_open_sys as sys;
use sys::bindings as b;

use super::{
    EventConfig, EventKind, EventTarget, OpenError, PerfEvent, attr, open_error, open_raw,
    ring_or_output, without_side_band,
};

/// Switch-out samples that fit below a context-switch ring's wake-up watermark.
const SWITCHES_PER_WAKEUP: usize = 16;

/// Where tracefs is looked for, in order (the second is the debugfs mount of older systems).
const TRACEFS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The `sched:sched_switch` tracepoint: its id and where its raw payload keeps `prev_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedSwitch {
    /// The tracepoint id (the event's `config`).
    pub id: u64,
    /// Byte offset of `prev_state` in the raw payload.
    pub state_offset: usize,
    /// Its size in bytes (4 or 8).
    pub state_size: usize,
}

/// The state a thread left the CPU in, as `sched:sched_switch` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SwitchState {
    /// Still runnable: preempted, or it yielded.
    Runnable,
    /// Asleep, to be woken by a signal or an event (`TASK_INTERRUPTIBLE`, `S`): sleeps, waits
    /// on pipes, sockets, futexes (locks), poll.
    Sleeping,
    /// In an uninterruptible wait (`TASK_UNINTERRUPTIBLE`, `D`): disk I/O, page faults being
    /// read in, `vfork` waiting for the child, some kernel locks.
    Uninterruptible,
    /// Stopped by a signal or a tracer (`T`, `t`).
    Stopped,
    /// Anything else (exiting, parked, idle).
    Other,
}

impl SchedSwitch {
    /// The tracepoint of this kernel, from tracefs (mounted at `/sys/kernel/tracing` first if it
    /// is not, as perf does); None when there is no tracefs to read.
    pub fn find() -> Option<SchedSwitch> {
        static FOUND: OnceLock<Option<SchedSwitch>> = OnceLock::new();
        *FOUND.get_or_init(|| {
            let read = || {
                TRACEFS.iter().find_map(|dir| {
                    let path = format!("{dir}/events/sched/sched_switch/format");
                    SchedSwitch::parse(&std::fs::read_to_string(path).ok()?)
                })
            };
            read().or_else(|| {
                mount_tracefs();
                read()
            })
        })
    }

    /// Reads the tracepoint's `format` file: its `ID:` line and the `prev_state` field.
    pub fn parse(format: &str) -> Option<SchedSwitch> {
        let mut id = None;
        let mut state = None;
        for line in format.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("ID:") {
                id = rest.trim().parse().ok();
            } else if line.starts_with("field:") && line.contains(" prev_state;") {
                let value = |key: &str| -> Option<usize> {
                    let at = line.find(key)? + key.len();
                    line[at..].split(';').next()?.trim().parse().ok()
                };
                state = Some((value("offset:")?, value("size:")?));
            }
        }
        let (state_offset, state_size) = state?;
        (state_size == 4 || state_size == 8).then_some(SchedSwitch {
            id: id?,
            state_offset,
            state_size,
        })
    }

    /// The state in a sample's raw payload (None when the payload is too short).
    pub fn state(&self, raw: &[u8]) -> Option<SwitchState> {
        let bytes = raw.get(self.state_offset..self.state_offset + self.state_size)?;
        let mut v = [0u8; 8];
        v[..bytes.len()].copy_from_slice(bytes);
        Some(SwitchState::from_report(u64::from_le_bytes(v)))
    }
}

impl SwitchState {
    /// Decodes `prev_state` as the kernel reports it (since Linux 4.14): one `TASK_REPORT` bit
    /// (`S` 0x1, `D` 0x2, `T` 0x4, `t` 0x8, `X` 0x10, `Z` 0x20, `P` 0x40, `I` 0x80), 0 for a
    /// runnable thread, `TASK_REPORT_MAX` (0x100) when it was preempted.
    pub fn from_report(state: u64) -> SwitchState {
        match state & 0xff {
            0 => SwitchState::Runnable,
            s if s & 0x2 != 0 => SwitchState::Uninterruptible,
            s if s & 0x1 != 0 => SwitchState::Sleeping,
            s if s & 0xc != 0 => SwitchState::Stopped,
            _ => SwitchState::Other,
        }
    }
}

/// Mounts tracefs at its usual place when nothing is mounted there (root only; failure is fine:
/// the software event is used instead).
fn mount_tracefs() {
    let Ok(entries) = std::fs::read_dir(TRACEFS[0]) else {
        return;
    };
    if entries.count() > 0 {
        return;
    }
    // SAFETY: mount(2) with NUL-terminated constant strings and no data; it changes nothing when
    // it fails.
    unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            c"/sys/kernel/tracing".as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        );
    }
}

/// A switch-out sample's record with its raw payload (`PERF_SAMPLE_RAW`) cut out, so that it
/// has the layout of every other sample, and that payload. `callchain` as for
/// [`super::parse_record`]. None when the record is malformed.
pub fn strip_raw(data: &[u8], callchain: bool) -> Option<(Vec<u8>, &[u8])> {
    // header, ip, pid/tid, time, cpu/res, period
    let mut at = 8 + 5 * 8;
    if callchain {
        let nr = u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?);
        at = at
            .checked_add(8)?
            .checked_add(usize::try_from(nr).ok()?.checked_mul(8)?)?;
    }
    let size = u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?) as usize;
    let end = at.checked_add(4)?.checked_add(size)?;
    let raw = data.get(at + 4..end)?;
    let mut out = Vec::with_capacity(data.len() - (end - at));
    out.extend_from_slice(&data[..at]);
    out.extend_from_slice(data.get(end..)?);
    let len = u16::try_from(out.len()).ok()?;
    out[6..8].copy_from_slice(&len.to_le_bytes());
    Some((out, raw))
}

impl PerfEvent {
    /// Opens the context-switch event on `target` (every switch sampled): `sched:sched_switch`
    /// with its raw payload when `tracepoint` is given, else `PERF_COUNT_SW_CONTEXT_SWITCHES`;
    /// with the same sample layout as [`PerfEvent::open`] (plus the payload); when the tracepoint
    /// is refused, the software event. The switch records come from
    /// [`PerfEvent::open_switch_records`]. With
    /// `output`, it writes into that context-switch event's ring (same CPU), opened alike.
    ///
    /// The sample fires in the scheduler, in kernel mode, so kernel-mode events must be allowed
    /// (the kernel's own frames are still only recorded with `cfg.kernel`). Mappings, names and
    /// exits come from the sampling event on the same threads, not from this one.
    pub fn open_switches(
        target: EventTarget,
        cfg: &EventConfig,
        tracepoint: Option<SchedSwitch>,
        output: Option<&PerfEvent>,
    ) -> Result<PerfEvent, OpenError> {
        // Events writing into one ring share its layout: the ring's owner chose it.
        let tracepoint = match output {
            Some(out) => out.switches.flatten(),
            None => tracepoint,
        };
        match Self::open_switches_as(target, cfg, tracepoint, output) {
            // Tracepoints refused (e.g. not allowed to this user): the software event.
            Err(OpenError::Permission { .. } | OpenError::Other(_))
                if tracepoint.is_some() && output.is_none() =>
            {
                Self::open_switches_as(target, cfg, None, None)
            }
            r => r,
        }
    }

    fn open_switches_as(
        target: EventTarget,
        cfg: &EventConfig,
        tracepoint: Option<SchedSwitch>,
        output: Option<&PerfEvent>,
    ) -> Result<PerfEvent, OpenError> {
        let mut a = attr(EventKind::CpuClock, cfg, target, false);
        match tracepoint {
            Some(tp) => {
                a.type_ = b::PERF_TYPE_TRACEPOINT;
                a.config = tp.id;
                a.sample_type |= u64::from(b::PERF_SAMPLE_RAW);
            }
            None => {
                a.type_ = b::PERF_TYPE_SOFTWARE;
                a.config = b::PERF_COUNT_SW_CONTEXT_SWITCHES as u64;
            }
        }
        a.__bindgen_anon_1.sample_period = 1;
        // Wake the reader after a few switch-outs: it counts them against the rate cap.
        let few = SWITCHES_PER_WAKEUP * (cfg.stack_bytes as usize + 512);
        let half = cfg.ring_pages * super::page_size() / 2;
        a.__bindgen_anon_2.wakeup_watermark = half.min(few) as u32;
        without_side_band(&mut a);
        let fd = open_raw(&mut a, target).map_err(|e| open_error(e, target, OpenError::Other))?;
        let ring = ring_or_output(&fd, output, cfg.ring_pages)?;
        Ok(PerfEvent {
            fd,
            ring,
            kind: EventKind::CpuClock,
            switches: Some(tracepoint),
            alloc: false,
        })
    }

    /// Opens the event that writes the `PERF_RECORD_SWITCH` records of `target` into the ring
    /// of `output` (a context-switch event on the same CPU): a dummy software event, so that the
    /// records go on while the sampling event is disabled for the rate cap.
    pub fn open_switch_records(
        target: EventTarget,
        cfg: &EventConfig,
        output: &PerfEvent,
    ) -> Result<PerfEvent, OpenError> {
        let mut a = attr(EventKind::CpuClock, cfg, target, false);
        a.type_ = b::PERF_TYPE_SOFTWARE;
        a.config = b::PERF_COUNT_SW_DUMMY as u64;
        a.__bindgen_anon_1.sample_period = 0;
        without_side_band(&mut a);
        a.set_context_switch(1);
        let fd = open_raw(&mut a, target).map_err(|e| match e.raw_os_error() {
            Some(libc::ESRCH) => match target {
                EventTarget::Thread { tid, .. } => OpenError::NoSuchThread(tid),
                EventTarget::Cpu(_) => OpenError::Other(e),
            },
            _ => OpenError::Other(e),
        })?;
        ring_or_output(&fd, Some(output), cfg.ring_pages)?;
        Ok(PerfEvent {
            fd,
            ring: None,
            kind: EventKind::CpuClock,
            switches: None,
            alloc: false,
        })
    }

    /// For a context-switch event ([`PerfEvent::open_switches`]), whose samples are taken as a
    /// thread leaves the CPU: `Some`, with the tracepoint when its samples carry the state.
    pub fn switches(&self) -> Option<Option<SchedSwitch>> {
        self.switches
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The format file of Linux 6.x.
    const FORMAT: &str = "name: sched_switch
ID: 372
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;
\tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;
\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;
\tfield:int next_prio;\toffset:60;\tsize:4;\tsigned:1;
";

    #[test]
    fn the_format_file_gives_the_id_and_where_prev_state_is() {
        let tp = SchedSwitch::parse(FORMAT).unwrap();
        assert_eq!(
            tp,
            SchedSwitch {
                id: 372,
                state_offset: 32,
                state_size: 8
            }
        );
        let mut raw = vec![0u8; 68];
        for (state, want) in [
            (0u64, SwitchState::Runnable),
            (0x100, SwitchState::Runnable),
            (0x1, SwitchState::Sleeping),
            (0x2, SwitchState::Uninterruptible),
            (0x4, SwitchState::Stopped),
            (0x8, SwitchState::Stopped),
            (0x80, SwitchState::Other),
        ] {
            raw[32..40].copy_from_slice(&state.to_le_bytes());
            assert_eq!(tp.state(&raw), Some(want), "{state:#x}");
        }
        assert_eq!(tp.state(&raw[..36]), None);
        assert_eq!(SchedSwitch::parse("ID: 5\n"), None);
    }

    #[test]
    fn the_raw_payload_is_cut_out_of_a_sample() {
        // header, ip, pid/tid, time, cpu/res, period; callchain of 1; raw of 12 bytes; then the
        // registers' ABI word.
        let mut rec = vec![9u8, 0, 0, 0, 0, 0, 0, 0];
        for v in 1u64..=5 {
            rec.extend_from_slice(&v.to_le_bytes());
        }
        rec.extend_from_slice(&1u64.to_le_bytes());
        rec.extend_from_slice(&0xabcu64.to_le_bytes());
        rec.extend_from_slice(&12u32.to_le_bytes());
        rec.extend_from_slice(&[7u8; 12]);
        rec.extend_from_slice(&0u64.to_le_bytes());
        let len = rec.len() as u16;
        rec[6..8].copy_from_slice(&len.to_le_bytes());
        let (out, raw) = strip_raw(&rec, true).unwrap();
        assert_eq!(raw, &[7u8; 12]);
        assert_eq!(out.len(), rec.len() - 16);
        assert_eq!(u16::from_le_bytes([out[6], out[7]]) as usize, out.len());
        assert_eq!((&out[..6], &out[8..64]), (&rec[..6], &rec[8..64]));
        assert_eq!(&out[64..], &rec[80..]);
        // Cut short inside the payload: not a record.
        assert!(strip_raw(&rec[..70], true).is_none());
    }
}
