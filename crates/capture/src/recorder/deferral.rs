//! Samples set aside until a binary they need is parsed.
//!
//! Binaries are parsed on a loader thread ([`Processes::with_loader`]). A sample whose unwind
//! touched a region still waiting for its binary (or ended early in a process with such regions)
//! is kept as its raw record and unwound again once the parse arrives, so it is never unwound
//! without its unwind tables; later samples of the same address space wait behind it, so each
//! process's samples are still unwound in time order. When a mapping change, exec or exit alters
//! a process whose samples wait, its address space as it was is kept aside for them
//! ([`Processes::retire`]). Past [`DEFER_BUDGET`] bytes of waiting samples the reader waits for
//! the loader instead of setting more aside.

use foldhash::{HashMap as FastMap, HashMapExt};

use crate::process::{FileKey, Processes};

/// Bytes of raw sample records that may wait for their binaries' parses (about 4,000 samples with
/// 16 KiB stacks); past it the reader waits for the loader.
pub(crate) const DEFER_BUDGET: usize = 64 * 1024 * 1024;

/// A sample set aside until a binary it needs is parsed.
pub(crate) struct Deferred {
    pub raw: Vec<u8>,
    /// The address space it is unwound in: its process's, or that space as it was before an
    /// exec or a mapping change (kept aside under a key of its own, see [`Processes::retire`]).
    pub space: u32,
    /// What it waits for.
    pub wait: Wait,
    /// The weight of an off-CPU sample (None for a CPU sample).
    pub off_cpu: Option<super::off_cpu::OffWeight>,
    /// The weight of an allocation sample (None for others).
    pub alloc: Option<super::alloc::AllocWeight>,
}

/// What a set-aside sample waits for.
pub(crate) enum Wait {
    /// A binary's parse: this file's; None: any file arriving in its process (its stack ended
    /// early and the region to blame is not known).
    File(Option<FileKey>),
    /// The rest of the in-kernel walk of thread `tid`'s sample at `time` (going on as task
    /// work).
    Walk { tid: u32, time: u64 },
    /// Only an earlier sample of its space, which waits (it is due whenever that one is).
    Behind,
}

/// The waiting samples, in arrival order. See the module documentation.
pub(crate) struct Deferrals {
    deferred: Vec<Deferred>,
    bytes: usize,
    /// Waiting samples per address space.
    per_space: FastMap<u32, usize>,
    /// Keys of address spaces kept aside for waiting samples.
    retired: Vec<u32>,
    /// Unwind without checking for pending binaries (nothing more will arrive).
    pub force: bool,
}

impl Deferrals {
    /// Nothing waiting.
    pub fn new() -> Deferrals {
        Deferrals {
            deferred: Vec::new(),
            bytes: 0,
            per_space: FastMap::new(),
            retired: Vec::new(),
            force: false,
        }
    }

    /// Whether no sample waits.
    pub fn is_empty(&self) -> bool {
        self.deferred.is_empty()
    }

    /// Whether samples of address space `space` wait.
    pub fn waiting(&self, space: u32) -> bool {
        self.per_space.contains_key(&space)
    }

    /// Whether a record of `len` bytes may still be set aside.
    pub fn has_room(&self, len: usize) -> bool {
        self.bytes + len <= DEFER_BUDGET
    }

    /// Sets a sample aside (after those already waiting).
    pub fn defer(&mut self, d: Deferred) {
        self.bytes += d.raw.len();
        *self.per_space.entry(d.space).or_default() += 1;
        self.deferred.push(d);
    }

    /// The `(tid, time)` of every sample that waits for its in-kernel walk.
    pub fn walks_awaited(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.deferred.iter().filter_map(|d| match d.wait {
            Wait::Walk { tid, time } => Some((tid, time)),
            _ => None,
        })
    }

    /// Whether any waiting sample is one that `due` picks.
    pub fn any(&self, due: impl Fn(&Deferred) -> bool) -> bool {
        self.deferred.iter().any(due)
    }

    /// Takes every waiting sample out, in order (those that must wait on go back through
    /// [`Deferrals::defer`]).
    pub fn take_all(&mut self) -> Vec<Deferred> {
        self.bytes = 0;
        self.per_space.clear();
        std::mem::take(&mut self.deferred)
    }

    /// Before `pid`'s address space changes (exec, a replacing mapping, exit): if samples of it
    /// wait for binaries, keeps the space as it is under a new key for them (no waiting).
    /// Returns that key.
    pub fn retire_space(&mut self, processes: &mut Processes, pid: u32) -> Option<u32> {
        let n = self.per_space.remove(&pid)?;
        let key = processes.retire(pid)?;
        for d in &mut self.deferred {
            if d.space == pid {
                d.space = key;
            }
        }
        self.per_space.insert(key, n);
        self.retired.push(key);
        Some(key)
    }

    /// Moves `pid`'s address space aside (see [`Processes::retire`]) for samples that may still
    /// come, though none waits yet; it goes at the next [`Deferrals::release_retired`] unless
    /// one is set aside in it by then.
    pub fn keep_aside(&mut self, processes: &mut Processes, pid: u32) -> Option<u32> {
        let key = processes.retire(pid)?;
        self.retired.push(key);
        Some(key)
    }

    /// Drops the address spaces kept aside for samples that no longer wait.
    pub fn release_retired(&mut self, processes: &mut Processes) {
        let per_space = &self.per_space;
        self.retired.retain(|&key| {
            let keep = per_space.contains_key(&key);
            if !keep {
                processes.remove(key);
            }
            keep
        });
    }
}
