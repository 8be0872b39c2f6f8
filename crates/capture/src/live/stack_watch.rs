//! A hardware write watchpoint on one stack slot of another thread: the proof that the outer part
//! of a deep stack has not changed since it was read.
//!
//! The unwound frames above a stack address `S` depend only on the unwinder's state at `S` and
//! on the words it reads at or above `S` (return addresses, saved frame pointers, saved
//! registers). Those words are written by the calls and prologues of the frames that own them,
//! so for them to change, the thread must return past `S` and call down again; a frame whose
//! stack pointer is `S` is entered only by a `call` that writes its return address at `S - 8`.
//! A write watchpoint on `[S - 8, S)` therefore fires before any later sample can reach `S` with
//! different frames above it. (Writes to return-address slots through pointers, or by other
//! threads or processes, are outside this argument, as they are outside every unwinder's.)
//!
//! The watchpoint is a `PERF_TYPE_BREAKPOINT` event on the thread, counting user and kernel
//! writes, armed for a single hit (`PERF_EVENT_IOC_REFRESH` 1): after the first write the kernel
//! disables it, so the target takes at most one debug trap per arming and is never stopped. A
//! watched thread that exits hangs the event up, which [`StackWatch::untouched`] also reports,
//! so a later thread reusing the id is never taken for the watched one.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use perf_event_open_sys as sys;
use sys::bindings as b;

/// An armed watchpoint on the 8 bytes at one address of one thread's stack.
#[derive(Debug)]
pub struct StackWatch {
    fd: OwnedFd,
    /// The event's control page: without a ring buffer the kernel reports every event as hung
    /// up, so this one page (no data pages) makes `poll` tell a live thread from an exited one.
    page: *mut libc::c_void,
    /// CLOCK_MONOTONIC time (ns) at which the watchpoint was in place.
    armed_at: u64,
}

impl StackWatch {
    /// Arms a write watchpoint on `[addr, addr + 8)` of thread `tid`. Fails when the kernel
    /// refuses (no free debug register, no permission, unaligned address).
    pub fn arm(tid: u32, addr: u64) -> io::Result<StackWatch> {
        if !addr.is_multiple_of(8) {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let mut attr = b::perf_event_attr {
            size: std::mem::size_of::<b::perf_event_attr>() as u32,
            type_: b::PERF_TYPE_BREAKPOINT,
            bp_type: b::HW_BREAKPOINT_W,
            ..Default::default()
        };
        attr.__bindgen_anon_3.bp_addr = addr;
        attr.__bindgen_anon_4.bp_len = u64::from(b::HW_BREAKPOINT_LEN_8);
        attr.__bindgen_anon_1.sample_period = 1;
        attr.set_disabled(1);
        attr.set_exclude_hv(1);
        // SAFETY: `attr` is a valid, initialised perf_event_attr whose `size` matches the struct;
        // the returned descriptor is checked before being owned.
        let fd = unsafe {
            sys::perf_event_open(
                &mut attr,
                tid as libc::pid_t,
                -1,
                -1,
                b::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor returned by the kernel, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let len = page_size();
        // SAFETY: maps the control page of a perf event descriptor we own, shared and read-only;
        // the result is checked, and unmapped exactly once in `Drop`.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if page == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut watch = StackWatch {
            fd,
            page,
            armed_at: 0,
        };
        // SAFETY: REFRESH takes an integer argument (the number of overflows before the event
        // disables itself) on a perf event descriptor we own.
        if unsafe { sys::ioctls::REFRESH(watch.fd.as_raw_fd(), 1) } < 0 {
            return Err(io::Error::last_os_error());
        }
        watch.armed_at = crate::perf_event::monotonic_ns();
        Ok(watch)
    }

    /// CLOCK_MONOTONIC time (ns) from which writes are seen: only samples taken after it are
    /// covered.
    pub fn armed_at(&self) -> u64 {
        self.armed_at
    }

    /// Whether the slot has not been written since arming and the thread still exists.
    pub fn untouched(&self) -> bool {
        let mut count = [0u8; 8];
        // SAFETY: reading 8 bytes (the counter) into a buffer of exactly that size from a perf
        // event descriptor we own.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
        if n != 8 || u64::from_ne_bytes(count) != 0 {
            return false;
        }
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for a descriptor we own; a zero timeout never blocks.
        let r = unsafe { libc::poll(&mut pfd, 1, 0) };
        r >= 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR) == 0
    }
}

impl Drop for StackWatch {
    fn drop(&mut self) {
        // SAFETY: `page` was mapped with this length in `arm` and is unmapped only here.
        unsafe { libc::munmap(self.page, page_size()) };
    }
}

// SAFETY: the control page is never dereferenced (it only keeps the kernel's ring buffer
// allocated), so moving the watch to another thread is sound.
unsafe impl Send for StackWatch {}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gettid() -> u32 {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::gettid() as u32 }
    }

    #[test]
    fn a_write_to_the_slot_is_seen_and_reads_are_not() {
        let slot = Box::new(std::sync::atomic::AtomicU64::new(5));
        let addr = &*slot as *const _ as u64;
        let watch = StackWatch::arm(gettid(), addr).expect("breakpoint events work");
        assert!(watch.armed_at() > 0);
        assert_eq!(slot.load(std::sync::atomic::Ordering::SeqCst), 5);
        assert!(watch.untouched(), "a read is not a write");
        slot.store(5, std::sync::atomic::Ordering::SeqCst);
        assert!(!watch.untouched(), "even a write of the same value is seen");
    }

    #[test]
    fn an_exited_thread_hangs_the_watch_up() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let slot = Box::new(0u64);
        let addr = &*slot as *const u64 as u64;
        let t = std::thread::spawn(move || {
            tx.send(gettid()).unwrap();
            let _ = go_rx.recv();
        });
        let tid = rx.recv().unwrap();
        let watch = StackWatch::arm(tid, addr).expect("breakpoint events work");
        assert!(watch.untouched());
        go_tx.send(()).unwrap();
        t.join().unwrap();
        assert!(!watch.untouched(), "the watched thread is gone");
    }
}
