//! The kernel edge of sampling: `perf_event_open` and the mmap ring buffer; `record` parses
//! the records it carries (samples, MMAP2, COMM, FORK, EXIT, LOST); [`Poller`] blocks until a
//! ring has a batch (its wake-up watermark) instead of waking on a timer.

mod record;
mod switches;
mod uprobe;
mod wait;

pub use record::{Record, Sample, is_sample, parse_record, side_band_time};
pub use switches::{SchedSwitch, SwitchState, strip_raw};
pub use uprobe::{UprobeSite, uprobe_pmu_type};
pub use wait::{Poller, Waker, Woken, pidfd};

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{Ordering, fence};

use perf_event_open_sys as sys;
use sys::bindings as b;

/// What to sample and how much to copy per sample.
#[derive(Debug, Clone, Copy)]
pub struct EventConfig {
    /// Samples per second of CPU time.
    pub frequency_hz: u32,
    /// Bytes of user stack copied with each sample (multiple of 8).
    pub stack_bytes: u32,
    /// Also record the kernel callchain.
    pub kernel: bool,
    /// Entries of the kernel's frame-pointer walk of the user stack to request with each sample
    /// (`sample_max_stack`; at most `kernel.perf_event_max_stack`); 0 for none.
    pub user_callchain: u16,
    /// Data pages of the ring buffer (a power of two).
    pub ring_pages: usize,
    /// Wake the reader after every few samples instead of when half the ring is full (more
    /// wake-ups, but samples are handled right after they are taken: live stack reads need that).
    pub prompt: bool,
}

/// Which clock drives sampling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Hardware CPU cycles (needs a PMU).
    Cycles,
    /// The `cpu-clock` software timer (always available; period in nanoseconds).
    CpuClock,
}

impl EventKind {
    /// The perf name of the event.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Cycles => "cycles",
            EventKind::CpuClock => "cpu-clock",
        }
    }
}

/// What one event watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventTarget {
    /// One thread on one CPU (and, with `inherit`, the threads and children it creates later;
    /// the kernel refuses ring buffers for inherited events not bound to a CPU).
    Thread {
        /// Thread id.
        tid: u32,
        /// CPU.
        cpu: u32,
        /// Follow threads/processes created later by this thread.
        inherit: bool,
        /// Start disabled and enable when the thread calls `exec`.
        enable_on_exec: bool,
    },
    /// Every task on one CPU.
    Cpu(u32),
}

/// Why an event could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The kernel refused for lack of privilege.
    #[error(
        "permission denied opening perf events (kernel.perf_event_paranoid = {paranoid}); run as root, \
         grant CAP_PERFMON (setcap cap_perfmon,cap_sys_ptrace+ep), or lower the setting with \
         `sysctl kernel.perf_event_paranoid=1` (-1 for system-wide -a)"
    )]
    Permission {
        /// Current value of `kernel.perf_event_paranoid` (as text; `?` when unreadable).
        paranoid: String,
    },
    /// The thread does not exist (or exited).
    #[error("thread {0} does not exist")]
    NoSuchThread(u32),
    /// Any other failure.
    #[error("perf_event_open failed: {0}")]
    Other(#[source] io::Error),
}

/// The user registers requested: every general-purpose register and IP (CFI may base a frame on
/// any callee-saved register, e.g. rbx in ld.so's lazy-binding trampoline).
const REGS_MASK: u64 = crate::unwind::regs::PERF_MASK;
/// Callchain entries at or above this are context markers (`PERF_CONTEXT_*`), not addresses.
const PERF_CONTEXT_MAX: u64 = (-4095i64) as u64;

fn sample_type(callchain: bool) -> u64 {
    let mut t = b::PERF_SAMPLE_IP
        | b::PERF_SAMPLE_TID
        | b::PERF_SAMPLE_TIME
        | b::PERF_SAMPLE_CPU
        | b::PERF_SAMPLE_PERIOD
        | b::PERF_SAMPLE_REGS_USER
        | b::PERF_SAMPLE_STACK_USER;
    if callchain {
        t |= b::PERF_SAMPLE_CALLCHAIN;
    }
    t as u64
}

impl EventConfig {
    /// Whether samples carry a callchain (kernel frames, the user frame-pointer walk, or both).
    pub fn callchain(&self) -> bool {
        self.kernel || self.user_callchain > 0
    }
}

/// `kernel.perf_event_max_stack`: the most callchain entries a sample may request (None when
/// unreadable).
pub fn max_callchain_entries() -> Option<u16> {
    let text = std::fs::read_to_string("/proc/sys/kernel/perf_event_max_stack").ok()?;
    let n: u64 = text.trim().parse().ok()?;
    Some(n.min(u64::from(u16::MAX)) as u16)
}

fn attr(
    kind: EventKind,
    cfg: &EventConfig,
    target: EventTarget,
    exclude_kernel: bool,
) -> b::perf_event_attr {
    let mut a = b::perf_event_attr {
        size: std::mem::size_of::<b::perf_event_attr>() as u32,
        sample_type: sample_type(cfg.callchain()),
        sample_regs_user: REGS_MASK,
        sample_stack_user: cfg.stack_bytes,
        clockid: libc::CLOCK_MONOTONIC,
        ..Default::default()
    };
    let hz = u64::from(cfg.frequency_hz.max(1));
    match kind {
        EventKind::Cycles => {
            a.type_ = b::PERF_TYPE_HARDWARE;
            a.config = b::PERF_COUNT_HW_CPU_CYCLES as u64;
            a.set_freq(1);
            a.__bindgen_anon_1.sample_freq = hz;
        }
        EventKind::CpuClock => {
            a.type_ = b::PERF_TYPE_SOFTWARE;
            a.config = b::PERF_COUNT_SW_CPU_CLOCK as u64;
            // A fixed period in nanoseconds of CPU time: exact, and no frequency throttling.
            a.__bindgen_anon_1.sample_period = (1_000_000_000 / hz).max(10_000);
        }
    }
    a.set_disabled(1);
    a.set_exclude_hv(1);
    a.set_exclude_kernel(u64::from(exclude_kernel));
    if cfg.user_callchain > 0 {
        a.sample_max_stack = cfg.user_callchain;
        a.set_exclude_callchain_kernel(u64::from(!cfg.kernel));
    } else {
        a.set_exclude_callchain_user(1);
    }
    a.set_mmap(1);
    a.set_mmap2(1);
    a.set_comm(1);
    a.set_comm_exec(1);
    a.set_task(1);
    a.set_sample_id_all(1);
    a.set_use_clockid(1);
    a.set_watermark(1);
    // Wake the reader when half the ring is full: one wake-up per large batch, with the other
    // half (an eighth of a second or more at full rate) as slack while it drains.
    let half = cfg.ring_pages * page_size() / 2;
    let watermark = if cfg.prompt {
        half.min(4 * (cfg.stack_bytes as usize + 512))
    } else {
        half
    };
    a.__bindgen_anon_2.wakeup_watermark = watermark as u32;
    if let EventTarget::Thread {
        inherit,
        enable_on_exec,
        ..
    } = target
    {
        a.set_inherit(u64::from(inherit));
        a.set_enable_on_exec(u64::from(enable_on_exec));
    }
    a
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

fn paranoid() -> String {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The ring `fd`'s event writes to: a ring of its own of `ring_pages` pages, or with `output`
/// that event's (linked by `PERF_EVENT_IOC_SET_OUTPUT`, and then None).
fn ring_or_output(
    fd: &OwnedFd,
    output: Option<&PerfEvent>,
    ring_pages: usize,
) -> Result<Option<Ring>, OpenError> {
    let Some(out) = output else {
        return Ring::new(fd, ring_pages)
            .map(Some)
            .map_err(OpenError::Other);
    };
    // SAFETY: both descriptors are live perf events; SET_OUTPUT only links the new event's
    // output to the other's ring.
    let rc = unsafe { sys::ioctls::SET_OUTPUT(fd.as_raw_fd(), out.fd.as_raw_fd()) };
    if rc < 0 {
        return Err(OpenError::Other(io::Error::last_os_error()));
    }
    Ok(None)
}

/// Turns off the side-band records (mappings, names, forks and exits) of an event beside the
/// sampling event, which writes them for the same threads.
fn without_side_band(a: &mut b::perf_event_attr) {
    a.set_mmap(0);
    a.set_mmap2(0);
    a.set_comm(0);
    a.set_comm_exec(0);
    a.set_task(0);
}

/// The error of a failed open of an event on `target`: the thread gone, no permission, or
/// `other` (given the error).
fn open_error(
    e: io::Error,
    target: EventTarget,
    other: impl FnOnce(io::Error) -> OpenError,
) -> OpenError {
    match e.raw_os_error() {
        Some(libc::ESRCH) => match target {
            EventTarget::Thread { tid, .. } => OpenError::NoSuchThread(tid),
            EventTarget::Cpu(_) => OpenError::Other(e),
        },
        Some(libc::EACCES | libc::EPERM) => OpenError::Permission {
            paranoid: paranoid(),
        },
        _ => other(e),
    }
}

fn open_raw(attr: &mut b::perf_event_attr, target: EventTarget) -> io::Result<OwnedFd> {
    let (pid, cpu) = match target {
        EventTarget::Thread { tid, cpu, .. } => (tid as i32, cpu as i32),
        EventTarget::Cpu(cpu) => (-1, cpu as i32),
    };
    // SAFETY: `attr` is a valid, initialised perf_event_attr whose `size` field matches the
    // struct; the returned descriptor is checked before being owned.
    let fd = unsafe {
        sys::perf_event_open(attr, pid, cpu, -1, b::PERF_FLAG_FD_CLOEXEC as libc::c_ulong)
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor returned by the kernel, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An open sampling event with its ring buffer.
pub struct PerfEvent {
    fd: OwnedFd,
    ring: Option<Ring>,
    kind: EventKind,
    /// A context-switch event ([`PerfEvent::open_switches`]): its samples are switch-outs, with
    /// the thread's state when it is the tracepoint.
    switches: Option<Option<SchedSwitch>>,
    /// An allocation uprobe event ([`PerfEvent::open_uprobe`]): its samples are allocations.
    alloc: bool,
}

impl PerfEvent {
    /// Opens an event on `target`: hardware cycles when a PMU exists, else `cpu-clock` (a missing
    /// PMU answers ENOENT/ENODEV/EOPNOTSUPP and is not a permission problem). Kernel-mode time is
    /// included when permitted; without `--kernel` a refusal falls back to user-only sampling.
    ///
    /// With `output`, the event writes into that event's ring (same CPU) instead of its own.
    pub fn open(
        target: EventTarget,
        cfg: &EventConfig,
        output: Option<&PerfEvent>,
    ) -> Result<PerfEvent, OpenError> {
        let mut last = None;
        for kind in [EventKind::Cycles, EventKind::CpuClock] {
            for exclude_kernel in [false, true] {
                if exclude_kernel && cfg.kernel {
                    continue;
                }
                let mut a = attr(kind, cfg, target, exclude_kernel);
                match open_raw(&mut a, target) {
                    Ok(fd) => {
                        let ring = ring_or_output(&fd, output, cfg.ring_pages)?;
                        return Ok(PerfEvent {
                            fd,
                            ring,
                            kind,
                            switches: None,
                            alloc: false,
                        });
                    }
                    Err(e) => {
                        let errno = e.raw_os_error().unwrap_or(0);
                        match errno {
                            libc::ESRCH => {
                                if let EventTarget::Thread { tid, .. } = target {
                                    return Err(OpenError::NoSuchThread(tid));
                                }
                                return Err(OpenError::Other(e));
                            }
                            libc::EACCES | libc::EPERM => {
                                last = Some(OpenError::Permission {
                                    paranoid: paranoid(),
                                });
                            }
                            libc::ENOENT | libc::ENODEV | libc::EOPNOTSUPP | libc::EINVAL
                                if kind == EventKind::Cycles =>
                            {
                                last = Some(OpenError::Other(e));
                                break;
                            }
                            _ => last = Some(OpenError::Other(e)),
                        }
                    }
                }
            }
        }
        Err(last.unwrap_or_else(|| OpenError::Other(io::Error::other("no event could be opened"))))
    }

    /// The event that was opened.
    pub fn kind(&self) -> EventKind {
        self.kind
    }

    /// Starts counting and sampling.
    pub fn enable(&self) -> io::Result<()> {
        // SAFETY: the descriptor is a live perf event owned by `self`.
        let rc = unsafe { sys::ioctls::ENABLE(self.fd.as_raw_fd(), 0) };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Stops sampling (the ring keeps what it has).
    pub fn disable(&self) -> io::Result<()> {
        // SAFETY: the descriptor is a live perf event owned by `self`.
        let rc = unsafe { sys::ioctls::DISABLE(self.fd.as_raw_fd(), 0) };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Runs the BPF program `prog` (a loaded `perf_event` program) at each of this event's
    /// samples, before the sample is written.
    pub fn set_bpf(&self, prog: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
        // SAFETY: both descriptors are live for the call; the kernel takes its own reference
        // to the program.
        let rc = unsafe { sys::ioctls::SET_BPF(self.fd.as_raw_fd(), prog.as_raw_fd() as u32) };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// The descriptor, for `poll`.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The ring buffer, unless this event writes into another event's ring.
    pub fn ring(&mut self) -> Option<&mut Ring> {
        self.ring.as_mut()
    }
}

/// A perf mmap ring buffer: one metadata page followed by a power-of-two data area.
pub struct Ring {
    base: *mut u8,
    map_len: usize,
    data_offset: usize,
    data_size: usize,
    scratch: Vec<u8>,
}

// SAFETY: the mapping is owned by the Ring and only accessed through `&mut self`.
unsafe impl Send for Ring {}

impl Ring {
    fn new(fd: &OwnedFd, pages: usize) -> io::Result<Ring> {
        let page = page_size();
        let pages = pages.max(1).next_power_of_two();
        let map_len = page * (pages + 1);
        // SAFETY: mapping a perf event descriptor with a length of 1 + 2^n pages is the documented
        // interface; the result is checked for MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = base.cast::<u8>();
        let meta = base.cast::<b::perf_event_mmap_page>();
        // SAFETY: the first page of the mapping is the kernel's perf_event_mmap_page.
        let (off, size) = unsafe {
            (
                std::ptr::read_volatile(&raw const (*meta).data_offset),
                std::ptr::read_volatile(&raw const (*meta).data_size),
            )
        };
        let (data_offset, data_size) = if size == 0 {
            (page, page * pages)
        } else {
            (off as usize, size as usize)
        };
        Ok(Ring {
            base,
            map_len,
            data_offset,
            data_size,
            scratch: Vec::new(),
        })
    }

    fn meta(&self) -> *mut b::perf_event_mmap_page {
        self.base.cast()
    }

    /// The kernel's write position (acquire-ordered: records before it are complete).
    pub fn head(&self) -> u64 {
        let meta = self.meta();
        // SAFETY: data_head lives in the metadata page; the acquire fence orders the data reads
        // that follow after it, as the perf ABI requires.
        unsafe {
            let head = std::ptr::read_volatile(&raw const (*meta).data_head);
            fence(Ordering::Acquire);
            head
        }
    }

    /// Calls `f` on every complete record between the reader's position and `head` (from
    /// [`Ring::head`]) without consuming them; returns the position reached. Call
    /// [`Ring::consume`] with it once every pass over the records is done.
    pub fn peek(&mut self, head: u64, mut f: impl FnMut(&[u8])) -> u64 {
        let meta = self.meta();
        // SAFETY: data_tail lives in the metadata page and is only written by us.
        let tail = unsafe { std::ptr::read_volatile(&raw const (*meta).data_tail) };
        let size = self.data_size as u64;
        // SAFETY: the data area is `data_size` bytes at `data_offset` inside the mapping.
        let data =
            unsafe { std::slice::from_raw_parts(self.base.add(self.data_offset), self.data_size) };
        let mut pos = tail;
        while pos + 8 <= head {
            let at = (pos % size) as usize;
            let len = u16::from_le_bytes([data[at + 6], data[at + 7]]) as usize;
            if len < 8 || pos + len as u64 > head {
                break;
            }
            if at + len <= data.len() {
                f(&data[at..at + len]);
            } else {
                self.scratch.clear();
                self.scratch.extend_from_slice(&data[at..]);
                self.scratch
                    .extend_from_slice(&data[..len - (data.len() - at)]);
                f(&self.scratch);
            }
            pos += len as u64;
        }
        pos
    }

    /// Hands the space up to `pos` (from [`Ring::peek`]) back to the kernel.
    pub fn consume(&mut self, pos: u64) {
        let meta = self.meta();
        // SAFETY: the release fence orders our reads of the data before the tail update.
        unsafe {
            fence(Ordering::Release);
            std::ptr::write_volatile(&raw mut (*meta).data_tail, pos);
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: `base`/`map_len` describe the mapping created in `Ring::new`, unmapped once.
        unsafe {
            libc::munmap(self.base.cast(), self.map_len);
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds (the clock the samples use).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the valid timespec we pass.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Opens a counting event on thread `tid` that the threads and children it creates do not
/// inherit, and that never counts (disabled). Its presence alone matters: a task whose events
/// are not all inherited gives each child a context of its own rather than a clone of its own,
/// and the kernel swaps the events of cloned contexts between tasks at context switches instead
/// of switching them. Swapped so, the events opened (with the walk program attached) can end up
/// in a child, and end with it; children forked after that went without the program.
pub fn open_clone_guard(tid: u32) -> io::Result<OwnedFd> {
    let mut a = b::perf_event_attr {
        size: std::mem::size_of::<b::perf_event_attr>() as u32,
        type_: b::PERF_TYPE_SOFTWARE,
        config: b::PERF_COUNT_SW_DUMMY as u64,
        ..Default::default()
    };
    a.set_disabled(1);
    let target = EventTarget::Thread {
        tid,
        cpu: u32::MAX, // any CPU
        inherit: false,
        enable_on_exec: false,
    };
    open_raw(&mut a, target)
}
