//! Blocking until there is work: an epoll set over perf event descriptors (readable once their
//! ring passes its wake-up watermark, hung up once the watched task and its inherited children are
//! gone) and an eventfd [`Waker`] that other threads use to cut a wait short.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

/// Wakes a thread blocked in [`Poller::wait`] (an eventfd). Cheap to clone and share.
#[derive(Clone)]
pub struct Waker(Arc<OwnedFd>);

impl Waker {
    /// A new waker.
    pub fn new() -> io::Result<Waker> {
        // SAFETY: eventfd(2) with valid flags; the result is checked before being owned.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        Ok(Waker(Arc::new(unsafe { OwnedFd::from_raw_fd(fd) })))
    }

    /// Makes the next (or current) wait on a poller holding this waker return.
    pub fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our eventfd; a full counter (EAGAIN)
        // already means "woken".
        unsafe {
            libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len());
        }
    }

    fn clear(&self) {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live buffer from our non-blocking eventfd.
        unsafe {
            libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len());
        }
    }
}

/// What a wait saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Woken {
    /// Some descriptor was readable (a ring passed its watermark) or the waker fired.
    pub ready: bool,
    /// Descriptors that hung up in this wait (dropped from the set; they never wake again).
    pub hung_up: usize,
}

/// An epoll set of descriptors plus a [`Waker`].
pub struct Poller {
    epoll: OwnedFd,
    waker: Waker,
    events: Vec<libc::epoll_event>,
    watched: usize,
}

/// The token of the waker in the epoll set (descriptors use their own number).
const WAKER_TOKEN: u64 = u64::MAX;

impl Poller {
    /// A poller woken by `waker`.
    pub fn new(waker: Waker) -> io::Result<Poller> {
        // SAFETY: epoll_create1 with a valid flag; the result is checked before being owned.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        let poller = Poller {
            epoll,
            waker,
            events: vec![libc::epoll_event { events: 0, u64: 0 }; 64],
            watched: 0,
        };
        poller.ctl(
            libc::EPOLL_CTL_ADD,
            poller.waker.0.as_raw_fd(),
            WAKER_TOKEN,
            0,
        )?;
        Ok(poller)
    }

    fn ctl(&self, op: i32, fd: RawFd, token: u64, flags: i32) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLHUP | flags) as u32,
            u64: token,
        };
        // SAFETY: both descriptors are open; `ev` is a valid epoll_event for the call.
        let rc = unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut ev) };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Watches `fd` (which must stay open while it is watched, or until it hangs up).
    pub fn add(&mut self, fd: RawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, fd as u64, 0)?;
        self.watched += 1;
        Ok(())
    }

    /// Watches `fd` for one event only (e.g. a pidfd, readable for good once its process
    /// exits): after it fires, it stays in the set but is never reported again.
    pub fn add_once(&mut self, fd: RawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, fd as u64, libc::EPOLLONESHOT)
    }

    /// Descriptors still watched (not hung up).
    pub fn watched(&self) -> usize {
        self.watched
    }

    /// Blocks until a watched descriptor is readable or hangs up, the waker fires, or `timeout`
    /// passes. Hung-up descriptors leave the set.
    pub fn wait(&mut self, timeout: Duration) -> io::Result<Woken> {
        let ms = i32::try_from(timeout.as_millis().saturating_add(1)).unwrap_or(i32::MAX);
        // SAFETY: `events` is a live buffer of `events.len()` epoll_event slots.
        let n = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                self.events.as_mut_ptr(),
                self.events.len() as i32,
                ms,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(Woken {
                    ready: true,
                    hung_up: 0,
                })
            } else {
                Err(e)
            };
        }
        let mut woken = Woken::default();
        for i in 0..n as usize {
            let ev = self.events[i];
            let (flags, token) = (ev.events, ev.u64);
            if token == WAKER_TOKEN {
                self.waker.clear();
                woken.ready = true;
                continue;
            }
            if flags & libc::EPOLLIN as u32 != 0 {
                woken.ready = true;
            }
            if flags & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
                // The task and its inherited children are gone: it will not write again, and a
                // level-triggered hang-up would make every later wait return at once.
                let _ = self.ctl(libc::EPOLL_CTL_DEL, token as RawFd, token, 0);
                self.watched = self.watched.saturating_sub(1);
                woken.hung_up += 1;
            }
        }
        Ok(woken)
    }
}

/// A descriptor that becomes readable when process `pid` exits (`pidfd_open`).
pub fn pidfd(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waker_cuts_a_wait_short_and_is_consumed() {
        let waker = Waker::new().unwrap();
        let mut poller = Poller::new(waker.clone()).unwrap();
        waker.wake();
        let woken = poller.wait(Duration::from_secs(3600)).unwrap();
        assert!(woken.ready);
        // The wake-up was consumed: the next wait runs to its timeout and reports nothing.
        let woken = poller.wait(Duration::ZERO).unwrap();
        assert_eq!(woken, Woken::default());
    }

    #[test]
    fn hung_up_descriptors_leave_the_set() {
        let (read, write) = std::io::pipe().unwrap();
        let mut poller = Poller::new(Waker::new().unwrap()).unwrap();
        poller.add(read.as_raw_fd()).unwrap();
        assert_eq!(poller.watched(), 1);
        drop(write);
        let woken = poller.wait(Duration::from_secs(3600)).unwrap();
        assert_eq!(woken.hung_up, 1);
        assert_eq!(poller.watched(), 0);
        // Gone from the set: no longer reported.
        assert_eq!(poller.wait(Duration::ZERO).unwrap(), Woken::default());
    }

    #[test]
    fn pidfd_fires_once_when_the_process_exits() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let fd = pidfd(child.id()).unwrap();
        let mut poller = Poller::new(Waker::new().unwrap()).unwrap();
        poller.add_once(fd.as_raw_fd()).unwrap();
        assert!(poller.wait(Duration::from_secs(3600)).unwrap().ready);
        assert!(
            child.try_wait().unwrap().is_some(),
            "woken only by the exit"
        );
        assert_eq!(poller.wait(Duration::ZERO).unwrap(), Woken::default());
    }
}
