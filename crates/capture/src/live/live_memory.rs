//! Reading a sampled thread's stack from the live process, past the bytes the kernel copied with
//! the sample: the outer frames of a deep stack are the long-lived ones, so they are still there
//! when the sample is unwound a few milliseconds later.
//!
//! The caller starts one [`LiveMemory`] session per sample ([`LiveMemory::start`]) with the end
//! of the copy and the copy's last bytes, and hands the reader to the unwinder as the
//! [`SampleStack`](super::SampleStack) fallback. This module:
//! - reads with `process_vm_readv`, whole pages at a time in batches that grow as the unwind
//!   climbs (stack reads go upwards), and serves later reads from those pages;
//! - stops at a per-sample byte budget ([`ReadFailure::Budget`]);
//! - checks the splice before serving the first read past the copy: the live bytes just below
//!   the copy's end must equal the copy's, otherwise the thread has moved on since the sample and
//!   nothing past the copy is trusted ([`ReadFailure::StackChanged`]); with no copy at all there is
//!   nothing to splice to and nothing live is read ([`ReadFailure::BeyondCopy`], which the
//!   unwinder reports as `stack-not-copied`);
//! - tells a vanished thread ([`ReadFailure::ThreadExited`]) from unreadable memory.
//!
//! The splice check is a cheap sanity check, not a proof: a thread that returned past the copy
//! and called down again the same way leaves identical bytes there above different outer frames.
//! The proof that live memory still holds the sampled stack is the caller's: the recorder lets
//! the unwinder read past the copy only after it has passed a frame whose return-address slot a
//! hardware watchpoint has guarded since before the sample (see `recorder::outer_cache` and
//! [`super::stack_watch`]).
//!
//! The frame-level checks (stack pointer strictly increasing, return addresses right after a
//! call) stay in the unwinder and apply to live frames exactly as to copied ones.

use crate::unwind::{MemoryReader, ReadFailure};

const PAGE: u64 = 4096;
/// First batch read past a miss; doubled on each further miss up to [`MAX_BATCH`].
const FIRST_BATCH: usize = 64 * 1024;
/// Largest single read.
const MAX_BATCH: usize = 1024 * 1024;
/// How many of the copy's last bytes must match the live stack at the splice.
pub const SPLICE_CHECK_BYTES: usize = 256;

/// Counters over all sessions of one reader.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LiveStats {
    /// Sessions (samples) that read live memory at all.
    pub samples: u64,
    /// `process_vm_readv` calls.
    pub reads: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Largest number of bytes read for one sample.
    pub max_sample_bytes: u64,
}

/// A live stack reader for one sample at a time, reusing its buffers across samples.
#[derive(Debug)]
pub struct LiveMemory {
    pid: u32,
    tid: u32,
    budget: usize,
    used: usize,
    batch: usize,
    /// Pages read this session: (start address, offset in `buf`, length), in read order.
    segments: Vec<(u64, usize, usize)>,
    buf: Vec<u8>,
    copy_end: u64,
    copy_tail: Vec<u8>,
    splice_checked: bool,
    failure: Option<ReadFailure>,
    stats: LiveStats,
}

impl LiveMemory {
    /// A reader that reads at most `budget` bytes per sample.
    pub fn new(budget: usize) -> LiveMemory {
        LiveMemory {
            pid: 0,
            tid: 0,
            budget,
            used: 0,
            batch: FIRST_BATCH,
            segments: Vec::new(),
            buf: Vec::new(),
            copy_end: 0,
            copy_tail: Vec::new(),
            splice_checked: false,
            failure: None,
            stats: LiveStats::default(),
        }
    }

    /// Starts a sample of thread `tid` of process `pid` whose copied stack ends (exclusive) at
    /// `copy_end` with the bytes `copy_tail` just below it.
    pub fn start(&mut self, pid: u32, tid: u32, copy_end: u64, copy_tail: &[u8]) {
        self.pid = pid;
        self.tid = tid;
        self.used = 0;
        self.batch = FIRST_BATCH;
        self.segments.clear();
        self.buf.clear();
        self.copy_end = copy_end;
        self.copy_tail.clear();
        let keep = copy_tail.len().min(SPLICE_CHECK_BYTES);
        self.copy_tail
            .extend_from_slice(&copy_tail[copy_tail.len() - keep..]);
        self.splice_checked = false;
        self.failure = None;
    }

    /// Counters so far.
    pub fn stats(&self) -> LiveStats {
        self.stats
    }

    /// Bytes read for the current sample.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Whether the sampled thread still exists. Checked after an unwind that used live memory:
    /// a thread that exited (or is exiting) while its stack was read may have had its outer
    /// frames overwritten on the way out, so its live frames cannot be trusted.
    pub fn thread_alive(&self) -> bool {
        thread_alive(self.pid, self.tid)
    }

    /// Copies `buf.len()` bytes at `addr` from pages already read; false if any is missing.
    fn cached(&self, addr: u64, out: &mut [u8]) -> bool {
        let end = addr.saturating_add(out.len() as u64);
        // Reads climb, so the newest segments are the likeliest.
        self.segments.iter().rev().any(|&(start, off, len)| {
            if addr >= start && end <= start + len as u64 {
                let from = off + (addr - start) as usize;
                out.copy_from_slice(&self.buf[from..from + out.len()]);
                true
            } else {
                false
            }
        })
    }

    /// Reads pages from the page holding `addr` on, at least through `need_end`. Sets
    /// `self.failure` and returns false when that cannot be done.
    fn fetch(&mut self, addr: u64, need_end: u64) -> bool {
        let start = addr & !(PAGE - 1);
        let need = usize::try_from(need_end.saturating_sub(start)).unwrap_or(usize::MAX);
        let left = self.budget.saturating_sub(self.used);
        if need > left {
            self.failure = Some(ReadFailure::Budget);
            return false;
        }
        if self.used == 0 && self.segments.is_empty() {
            self.stats.samples += 1;
        }
        let len = self.batch.max(need).min(left) & !(PAGE as usize - 1);
        let len = len.max(need);
        self.batch = (self.batch * 2).min(MAX_BATCH);
        let off = self.buf.len();
        self.buf.resize(off + len, 0);
        let got = read_process(self.pid, start, &mut self.buf[off..]);
        self.stats.reads += 1;
        let got = match got {
            Ok(n) => n,
            Err(e) => {
                self.buf.truncate(off);
                self.failure = Some(self.classify(e));
                return false;
            }
        };
        self.buf.truncate(off + got);
        self.used += got;
        self.stats.bytes += got as u64;
        if got > 0 {
            self.segments.push((start, off, got));
        }
        if (got as u64) < need_end - start {
            self.failure = Some(self.classify(libc::EFAULT));
            return false;
        }
        true
    }

    /// A failed read: the thread gone, or memory that cannot be read.
    fn classify(&self, errno: i32) -> ReadFailure {
        if errno == libc::ESRCH || !thread_alive(self.pid, self.tid) {
            ReadFailure::ThreadExited
        } else {
            ReadFailure::Unreadable
        }
    }

    /// Compares the live bytes just below the copy's end with the copy's own.
    fn check_splice(&mut self) -> bool {
        self.splice_checked = true;
        if self.copy_tail.is_empty() {
            // The kernel copied nothing (the page at the stack pointer was not resident: typically
            // a new thread's first instructions in `clone3`, whose fresh stack page is untouched).
            // There is nothing to splice to, so nothing live can be proven to belong to this
            // sample: the stack ends as it would without a live reader (`stack-not-copied`), not
            // as a changed stack.
            self.failure = Some(ReadFailure::BeyondCopy);
            return false;
        }
        let from = self.copy_end - self.copy_tail.len() as u64;
        if !self.fetch(from, self.copy_end) {
            return false;
        }
        let mut live = [0u8; SPLICE_CHECK_BYTES];
        let live = &mut live[..self.copy_tail.len()];
        if !self.cached(from, live) || live != &self.copy_tail[..] {
            self.failure = Some(ReadFailure::StackChanged);
            return false;
        }
        true
    }
}

impl MemoryReader for LiveMemory {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> bool {
        if self.failure.is_some() {
            return false;
        }
        let Some(end) = addr.checked_add(buf.len() as u64) else {
            self.failure = Some(ReadFailure::Unreadable);
            return false;
        };
        if self.cached(addr, buf) {
            return true;
        }
        let past_copy = addr >= self.copy_end;
        if past_copy && !self.splice_checked && !self.check_splice() {
            return false;
        }
        if self.cached(addr, buf) {
            return true;
        }
        if !self.fetch(addr, end) || !self.cached(addr, buf) {
            self.failure.get_or_insert(ReadFailure::Unreadable);
            self.stats.max_sample_bytes = self.stats.max_sample_bytes.max(self.used as u64);
            return false;
        }
        self.stats.max_sample_bytes = self.stats.max_sample_bytes.max(self.used as u64);
        true
    }

    fn failure(&self) -> Option<ReadFailure> {
        self.failure
    }
}

/// Reads `buf.len()` bytes at `addr` of process `pid`; the count read (short at the first
/// unreadable page) or the errno.
fn read_process(pid: u32, addr: u64, buf: &mut [u8]) -> Result<usize, i32> {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: one local iovec covering exactly `buf`, which we borrow mutably for the call; the
    // remote iovec is only read by the kernel (in the other process), never dereferenced here.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n < 0 {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EFAULT))
    } else {
        Ok(n as usize)
    }
}

/// Whether thread `tid` of process `pid` still exists.
fn thread_alive(pid: u32, tid: u32) -> bool {
    std::fs::metadata(format!("/proc/{pid}/task/{tid}")).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> (u32, u32) {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        (std::process::id(), tid)
    }

    #[test]
    fn reads_past_the_copy_when_the_splice_matches() {
        let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 251) as u8).collect();
        let base = data.as_ptr() as u64;
        let (pid, tid) = me();
        let mut live = LiveMemory::new(1 << 20);
        // The "copy" is the first 1000 bytes.
        live.start(pid, tid, base + 1000, &data[..1000]);
        let mut word = [0u8; 8];
        assert!(live.read(base + 40_000, &mut word));
        assert_eq!(&word, &data[40_000..40_008]);
        assert!(live.read(base + 1000, &mut word));
        assert_eq!(&word, &data[1000..1008]);
        assert!(live.used() > 0);
    }

    #[test]
    fn a_changed_splice_refuses_every_read() {
        let data = vec![7u8; 16 * 1024];
        let base = data.as_ptr() as u64;
        let (pid, tid) = me();
        let mut live = LiveMemory::new(1 << 20);
        let mut copy = data[..2000].to_vec();
        copy[1990] ^= 1;
        live.start(pid, tid, base + 2000, &copy);
        let mut word = [0u8; 8];
        assert!(!live.read(base + 4000, &mut word));
        assert_eq!(live.failure(), Some(ReadFailure::StackChanged));
    }

    #[test]
    fn nothing_is_read_when_nothing_was_copied() {
        let data = vec![7u8; 16 * 1024];
        let base = data.as_ptr() as u64;
        let (pid, tid) = me();
        let mut live = LiveMemory::new(1 << 20);
        live.start(pid, tid, base, &[]);
        let mut word = [0u8; 8];
        assert!(!live.read(base + 64, &mut word));
        assert_eq!(live.failure(), Some(ReadFailure::BeyondCopy));
        assert_eq!(live.used(), 0);
        assert_eq!(live.stats().reads, 0);
    }

    #[test]
    fn the_budget_is_enforced() {
        let data = vec![1u8; 256 * 1024];
        let base = (data.as_ptr() as u64 + PAGE - 1) & !(PAGE - 1);
        let (pid, tid) = me();
        let mut live = LiveMemory::new(3 * PAGE as usize);
        live.start(
            pid,
            tid,
            base + 8,
            &data[(base - data.as_ptr() as u64) as usize..][..8],
        );
        let mut word = [0u8; 8];
        assert!(live.read(base + 16, &mut word));
        assert!(!live.read(base + 100 * 1024, &mut word));
        assert_eq!(live.failure(), Some(ReadFailure::Budget));
        assert!(live.used() <= 3 * PAGE as usize);
    }

    #[test]
    fn unmapped_memory_and_exited_threads_are_told_apart() {
        let (pid, tid) = me();
        let mut live = LiveMemory::new(1 << 20);
        let copy = [0u8; 8];
        live.start(pid, tid, 8, &copy);
        let mut word = [0u8; 8];
        // Page zero is never mapped.
        assert!(!live.read(16, &mut word));
        assert_eq!(live.failure(), Some(ReadFailure::Unreadable));

        let child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        let mut child = child;
        child.wait().unwrap();
        let mut live = LiveMemory::new(1 << 20);
        live.start(gone, gone, 0x10_0008, &copy);
        assert!(!live.read(0x10_0010, &mut word));
        assert_eq!(live.failure(), Some(ReadFailure::ThreadExited));
    }
}
