//! Native allocation recording (`record --alloc`): what each allocation sample weighs, and which
//! frames of its stack are the sampler's own ([`super::alloc_attach`] attaches the sampling).
//!
//! Allocations are sampled by bytes, a Poisson process as in tcmalloc and Go: each thread draws
//! the distance to its next sample point from an exponential distribution whose mean is the rate,
//! and the allocation that crosses it is sampled, standing for `size / (1 - exp(-size / rate))`
//! bytes (the unbiased estimate) and that many bytes over its size allocations.
//!
//! - A launched command gets the sampler library (`shim/alloc_shim.c`, built by `build.rs`) in
//!   `LD_PRELOAD`: it counts down in a thread-local and calls `rootline_alloc_sampled(size,
//!   weight, kind)` only for sampled calls; a uprobe on that function takes the sample. The
//!   library's own frames are dropped from the stack: its leaf is the caller of `malloc`.
//! - A running process (`-p`) gets uprobes on its libc's allocation functions; every call traps,
//!   and the countdown runs here, per thread, on the size read from the sampled registers. The
//!   probed function's own entry frame is dropped.
//!
//! `mmap` counts only anonymous mappings of at least the recording's minimum, not `PROT_NONE`
//! (address space reserved, not memory), that the program asked for itself ([`mmap_counts`]): the ones glibc's malloc makes for large blocks are that
//! malloc's (the library never sees them, as glibc calls its internal `__mmap`; a uprobe on libc's
//! `mmap` sees them, and they are told apart by their return address, inside libc).

use foldhash::{HashMap as FastMap, HashMapExt};
use rootline_profile::pseudo::{NATIVE_ALLOC_FUNCTIONS, alloc_frame_name};

use crate::perf_event::Sample;
use crate::process::Processes;
use crate::unwind::Registers;
use crate::unwind::regs::{RCX, RDI, RDX, RSI};

/// Default mean bytes between allocation samples (as Go's `MemProfileRate` and tcmalloc).
pub const DEFAULT_ALLOC_RATE: u64 = 512 * 1024;

/// Default smallest anonymous `mmap` counted as an allocation: below glibc's default mmap
/// threshold (128 KiB), so a program that maps its own arenas of that order is seen, while the
/// few pages runtimes map for guard pages and metadata are not.
pub const DEFAULT_ALLOC_MMAP_MIN: u64 = 64 * 1024;

/// `MAP_ANONYMOUS` (x86-64 Linux).
const MAP_ANONYMOUS: u64 = 0x20;

/// The arguments of a call to `mmap` that say whether it allocates.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MmapCall {
    /// `prot`: `PROT_NONE` (0) reserves address space only.
    pub prot: u64,
    /// `flags`: only `MAP_ANONYMOUS` mappings are memory rather than a file's.
    pub flags: u64,
    /// Bytes mapped.
    pub length: u64,
    /// Its return address lies in libc's code: libc's own call (malloc mapping a block).
    pub from_libc: bool,
}

/// Whether a call to `mmap` counts as an allocation: an anonymous mapping that can be accessed,
/// of at least `min` bytes, that libc did not make for itself.
pub(crate) fn mmap_counts(call: MmapCall, min: u64) -> bool {
    call.flags & MAP_ANONYMOUS != 0
        && call.prot != 0
        && call.length >= min
        && call.length > 0
        && !call.from_libc
}

/// The sampler library's file name, by which its frames are recognised in a stack.
pub(super) const SHIM_NAME: &str = "librootline_alloc.so";

/// The C function a sampled allocation entered: an index into [`NATIVE_ALLOC_FUNCTIONS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct AllocKind(u8);

impl AllocKind {
    /// The `i`th of [`NATIVE_ALLOC_FUNCTIONS`] (None past them).
    pub(super) fn nth(i: usize) -> Option<AllocKind> {
        (i < NATIVE_ALLOC_FUNCTIONS.len()).then_some(AllocKind(i as u8))
    }

    /// From the sampler library's kind number (1 = malloc … 8 = pvalloc, 9 = mmap).
    pub(super) fn from_shim(kind: u64) -> Option<AllocKind> {
        (1..=NATIVE_ALLOC_FUNCTIONS.len() as u64)
            .contains(&kind)
            .then(|| AllocKind((kind - 1) as u8))
    }

    /// The function's name.
    pub fn function(self) -> &'static str {
        NATIVE_ALLOC_FUNCTIONS[usize::from(self.0)]
    }

    /// The leaf pseudo frame of its samples, `[alloc: malloc]`.
    pub fn frame_name(self) -> String {
        alloc_frame_name(Some(self.function()))
    }

    /// Bytes asked for, from the registers at the function's entry (SysV arguments).
    fn size(self, regs: &Registers) -> Option<u64> {
        let arg = |r| regs.get(r);
        match self.function() {
            "calloc" => arg(RDI)?.checked_mul(arg(RSI)?),
            "realloc" | "aligned_alloc" | "memalign" => arg(RSI),
            "posix_memalign" => arg(RDX),
            "mmap" => arg(RSI),
            _ => arg(RDI),
        }
    }
}

/// What an allocation sample weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AllocWeight {
    /// Estimated bytes allocated that this sample stands for.
    pub bytes: i64,
    /// Estimated allocations it stands for.
    pub count: i64,
    /// The function called.
    pub kind: AllocKind,
}

impl AllocWeight {
    fn new(size: u64, bytes: f64, kind: AllocKind) -> AllocWeight {
        let count = if size == 0 { 1.0 } else { bytes / size as f64 };
        AllocWeight {
            bytes: bytes.round() as i64,
            count: count.round().max(1.0) as i64,
            kind,
        }
    }
}

/// Bytes an allocation of `size` sampled at a mean of `rate` bytes stands for, unbiased:
/// `size / (1 - exp(-size / rate))`.
pub fn unbiased_bytes(size: u64, rate: f64) -> f64 {
    let s = size as f64;
    if rate <= 0.0 || s == 0.0 {
        return s;
    }
    s / -(-s / rate).exp_m1()
}

/// Counts of allocation recording.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Allocations sampled (each with its stack).
    pub sampled: u64,
    /// Estimated bytes the samples stand for.
    pub estimated_bytes: u64,
    /// Calls that trapped but fell between sample points (`-p` without the kernel filter).
    pub unsampled_calls: u64,
    /// Samples whose function or size could not be read: dropped.
    pub unreadable: u64,
}

/// Where allocation samples come from.
pub(crate) enum AllocSource {
    /// The sampler library: the sample is already decided and weighed.
    Shim,
    /// Uprobes on libc functions: `(file offset, kind)` of each, and the kind of each probed
    /// address in the processes given; the countdown runs here.
    Libc {
        sites: Vec<(u64, AllocKind)>,
        addresses: FastMap<u64, AllocKind>,
        /// The smallest anonymous `mmap` counted.
        mmap_min: u64,
        /// The BPF program already decided: every sample that arrives is sampled.
        kernel_decides: bool,
    },
}

/// A thread's Poisson countdown (xorshift64* generator).
struct Countdown {
    left: i64,
    rng: u64,
}

impl Countdown {
    fn new(tid: u32, rate: f64) -> Countdown {
        let seed = (u64::from(tid) << 32) ^ crate::perf_event::monotonic_ns() ^ 0x9e37_79b9;
        let mut c = Countdown {
            left: 0,
            rng: seed | 1,
        };
        c.left = c.draw(rate);
        c
    }

    fn draw(&mut self, rate: f64) -> i64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let x = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let u = ((x >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        (-u.ln() * rate).clamp(1.0, 9e18) as i64
    }

    /// Counts `size` bytes; true when they cross the sample point (then a new one is drawn).
    fn crosses(&mut self, size: u64, rate: f64) -> bool {
        let size = i64::try_from(size).unwrap_or(i64::MAX);
        if size < self.left {
            self.left -= size;
            return false;
        }
        self.left = self.draw(rate);
        true
    }
}

/// Turns allocation samples into weights. See the module documentation.
pub(crate) struct AllocSampler {
    source: AllocSource,
    rate: f64,
    countdowns: FastMap<u32, Countdown>,
    pub stats: AllocStats,
}

impl AllocSampler {
    /// A sampler for samples from `source`, at a mean of `rate` bytes between samples.
    pub fn new(source: AllocSource, rate: u64) -> AllocSampler {
        AllocSampler {
            source,
            rate: rate.max(1) as f64,
            countdowns: FastMap::new(),
            stats: AllocStats::default(),
        }
    }

    /// The weight of the allocation sample `s` (None: not sampled, or unreadable), and how many
    /// leaf frames of its stack belong to the sampler rather than the program (for the library,
    /// counted while unwinding: see [`AllocSampler::is_own_frame`]).
    pub fn weigh(&mut self, s: &Sample<'_>, processes: &Processes) -> Option<AllocWeight> {
        let Some(regs) = s.user_regs else {
            self.stats.unreadable += 1;
            return None;
        };
        let weight = match &self.source {
            AllocSource::Shim => {
                let kind = regs.get(RDX).and_then(AllocKind::from_shim);
                match (kind, regs.get(RDI), regs.get(RSI)) {
                    (Some(kind), Some(size), Some(bytes)) => {
                        Some(AllocWeight::new(size, bytes as f64, kind))
                    }
                    _ => None,
                }
            }
            AllocSource::Libc {
                sites,
                addresses,
                mmap_min,
                kernel_decides,
            } => {
                let ip = regs.ip();
                // A process given with -p by its address; a child it started since by the
                // file offset in its mappings.
                let kind = addresses.get(&ip).copied().or_else(|| {
                    let (region, _) = processes.binary_at(s.pid, ip)?;
                    let offset = ip - region.start + region.file_offset;
                    sites.iter().find(|&&(o, _)| o == offset).map(|&(_, k)| k)
                });
                match kind.and_then(|k| Some((k, k.size(&regs)?))) {
                    Some((kind, size)) if *kernel_decides => Some(AllocWeight::new(
                        size,
                        unbiased_bytes(size, self.rate),
                        kind,
                    )),
                    Some((kind, size))
                        if kind.function() == "mmap"
                            && !mmap_counts(
                                MmapCall {
                                    prot: regs.get(RDX).unwrap_or(0),
                                    flags: regs.get(RCX).unwrap_or(0),
                                    length: size,
                                    from_libc: called_from_own_binary(s, ip, processes),
                                },
                                *mmap_min,
                            ) =>
                    {
                        self.stats.unsampled_calls += 1;
                        return None;
                    }
                    Some((kind, size)) => {
                        let rate = self.rate;
                        let countdown = self
                            .countdowns
                            .entry(s.tid)
                            .or_insert_with(|| Countdown::new(s.tid, rate));
                        if size == 0 || !countdown.crosses(size, rate) {
                            self.stats.unsampled_calls += 1;
                            return None;
                        }
                        Some(AllocWeight::new(size, unbiased_bytes(size, rate), kind))
                    }
                    None => None,
                }
            }
        };
        match weight {
            Some(w) => {
                self.stats.sampled += 1;
                self.stats.estimated_bytes += w.bytes.max(0) as u64;
            }
            None => self.stats.unreadable += 1,
        }
        weight
    }

    /// Whether frame `index` (0 = leaf) of an allocation stack, in the binary `path`, is the
    /// sampler's own rather than the program's: the sampler library's frames, or the probed libc
    /// function's entry. The leaf-most run of such frames is dropped.
    pub fn is_own_frame(&self, index: usize, path: Option<&str>) -> bool {
        match self.source {
            AllocSource::Shim => path.is_some_and(|p| p.rsplit('/').next() == Some(SHIM_NAME)),
            AllocSource::Libc { .. } => index == 0,
        }
    }

    /// Forgets an exited thread's countdown.
    pub fn exited(&mut self, tid: u32) {
        self.countdowns.remove(&tid);
    }
}

/// Whether the call that trapped at `ip`, the entry of a probed function, came from the binary
/// that function is in: its return address, the first word of the stack, lies there.
fn called_from_own_binary(s: &Sample<'_>, ip: u64, processes: &Processes) -> bool {
    let Some(ret) = s.stack.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) else {
        return false;
    };
    let ret = u64::from_ne_bytes(ret);
    match (
        processes.binary_at(s.pid, ip),
        processes.binary_at(s.pid, ret),
    ) {
        (Some((callee, _)), Some((caller, _))) => callee.path == caller.path,
        _ => false,
    }
}

/// Adds the allocation counts to the profile's metadata.
pub(crate) fn describe_stats(
    stats: &AllocStats,
    extra: &mut std::collections::BTreeMap<String, String>,
) {
    if stats.sampled + stats.unsampled_calls + stats.unreadable == 0 {
        return;
    }
    for (key, n) in [
        ("alloc.sampled", stats.sampled),
        ("alloc.estimated_bytes", stats.estimated_bytes),
        ("alloc.unsampled_calls", stats.unsampled_calls),
        ("alloc.unreadable", stats.unreadable),
    ] {
        extra.insert(key.into(), n.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_weight_is_unbiased_for_small_and_large_sizes() {
        let rate = 512.0 * 1024.0;
        // Small: about one sample per `rate` bytes.
        assert!((unbiased_bytes(16, rate) - rate).abs() / rate < 1e-3);
        // Far above the rate: every one is sampled and weighs its size.
        let big = 64 * 1024 * 1024;
        assert!((unbiased_bytes(big, rate) - big as f64).abs() < 1.0);
        assert_eq!(unbiased_bytes(100, 0.0), 100.0);
    }

    #[test]
    fn only_large_anonymous_mappings_the_program_asked_for_count() {
        let min = DEFAULT_ALLOC_MMAP_MIN;
        // PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, 1 MiB, from the program.
        let call = MmapCall {
            prot: 3,
            flags: 0x22,
            length: 1 << 20,
            from_libc: false,
        };
        assert!(mmap_counts(call, min));
        assert!(mmap_counts(
            MmapCall {
                length: min,
                ..call
            },
            min
        ));
        // MAP_SHARED | MAP_ANONYMOUS, PROT_READ.
        assert!(mmap_counts(
            MmapCall {
                flags: 0x21,
                prot: 1,
                ..call
            },
            min
        ));
        let not = |c: MmapCall, why: &str| assert!(!mmap_counts(c, min), "{why}");
        not(
            MmapCall {
                length: min - 1,
                ..call
            },
            "below the minimum",
        );
        not(
            MmapCall {
                flags: 0x02,
                ..call
            },
            "a file mapping",
        );
        not(MmapCall { prot: 0, ..call }, "address space reserved");
        not(
            MmapCall {
                from_libc: true,
                ..call
            },
            "malloc's own mapping",
        );
        assert!(
            !mmap_counts(MmapCall { length: 0, ..call }, 0),
            "nothing mapped"
        );
        assert!(mmap_counts(MmapCall { length: 1, ..call }, 0));
    }

    #[test]
    fn a_countdown_samples_bytes_at_the_mean_rate() {
        let rate = 4096.0;
        let mut c = Countdown::new(7, rate);
        let (mut sampled, mut estimate) = (0u64, 0.0);
        let total = 64u64 * 1_000_000;
        for _ in 0..total / 64 {
            if c.crosses(64, rate) {
                sampled += 1;
                estimate += unbiased_bytes(64, rate);
            }
        }
        let expected = total as f64 / rate;
        assert!(
            (sampled as f64 - expected).abs() / expected < 0.05,
            "{sampled}"
        );
        assert!(
            (estimate - total as f64).abs() / (total as f64) < 0.05,
            "{estimate}"
        );
    }
}
