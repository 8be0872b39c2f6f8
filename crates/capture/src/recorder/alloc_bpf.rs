//! The kernel-side sampler of `record --alloc -p`: a BPF program (`bpf/alloc_sample.bpf.c`,
//! committed compiled) attached to each uprobe event on the target's libc allocation functions.
//! It keeps each thread's byte countdown and lets the kernel emit a sample only for the call that
//! crosses it, so unsampled calls pay the uprobe trap but no stack copy, ring write or unwind.
//! User space weighs each sample from its size and the rate alone. For `mmap` it also says which
//! mappings count: the minimum length, and each process's libc code range (a call returning there
//! is libc's own, malloc mapping a large block).
//!
//! A hit runs the programs of every event of its process (the kernel filters uprobe events by
//! address space), one per recorded thread: each program is linked with its thread's id as attach
//! cookie and acts only for that thread.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use aya::maps::{Array, HashMap};
use aya::programs::UProbe;

use super::alloc::AllocKind;
use crate::perf_event::PerfEvent;

/// Bytes kept at the alignment the ELF reader needs for its headers.
#[repr(C, align(8))]
struct Aligned<T: ?Sized>(T);

/// The compiled program (see the rebuild command in its source).
static OBJECT: &Aligned<[u8]> = &Aligned(*include_bytes!("../../bpf/alloc_sample.bpf.o"));

/// Entries of the program's table of exponential draws.
const DRAWS: u32 = 1024;

/// `BPF_LINK_CREATE` and `BPF_PERF_EVENT` (include/uapi/linux/bpf.h).
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PERF_EVENT: u32 = 41;

/// The loaded programs and the links that attach them; dropping it detaches them.
pub(crate) struct KernelSampler {
    ebpf: aya::Ebpf,
    links: Vec<OwnedFd>,
}

/// The program that reads the size of `kind`'s calls.
fn program_for(kind: AllocKind) -> &'static str {
    match kind.function() {
        "calloc" => "size_product",
        "realloc" | "aligned_alloc" | "memalign" => "size_arg2",
        "posix_memalign" => "size_arg3",
        "mmap" => "mmap_anon",
        _ => "size_arg1",
    }
}

/// The table's entry `i`: the `(i + 1/2) / DRAWS` quantile of the exponential distribution with
/// mean `rate`, in bytes.
fn draw(i: u32, rate: u64) -> u64 {
    let u = (f64::from(i) + 0.5) / f64::from(DRAWS);
    (-u.ln() * rate as f64).round().max(1.0) as u64
}

impl KernelSampler {
    /// Loads the programs, their table filled for a mean of `rate` bytes between samples, and
    /// anonymous mappings counted from `mmap_min` bytes.
    pub fn load(rate: u64, mmap_min: u64) -> Result<KernelSampler, String> {
        let mut ebpf = aya::EbpfLoader::new()
            .load(&OBJECT.0)
            .map_err(|e| format!("loading the BPF object: {e}"))?;
        let mut draws: Array<_, u64> = ebpf
            .map_mut("draws")
            .ok_or("the BPF object has no draws map")?
            .try_into()
            .map_err(|e| format!("the draws map: {e}"))?;
        for i in 0..DRAWS {
            draws
                .set(i, draw(i, rate), 0)
                .map_err(|e| format!("filling the draws map: {e}"))?;
        }
        let mut min: Array<_, u64> = ebpf
            .map_mut("mmap_min")
            .ok_or("the BPF object has no mmap_min map")?
            .try_into()
            .map_err(|e| format!("the mmap_min map: {e}"))?;
        min.set(0, mmap_min, 0)
            .map_err(|e| format!("setting the mmap minimum: {e}"))?;
        for name in [
            "size_arg1",
            "size_arg2",
            "size_arg3",
            "size_product",
            "mmap_anon",
        ] {
            let program: &mut UProbe = ebpf
                .program_mut(name)
                .ok_or_else(|| format!("the BPF object has no {name} program"))?
                .try_into()
                .map_err(|e| format!("{name}: {e}"))?;
            program
                .load()
                .map_err(|e| format!("the kernel refused the BPF program {name}: {e}"))?;
        }
        Ok(KernelSampler {
            ebpf,
            links: Vec::new(),
        })
    }

    /// Tells the `mmap` program the executable range `[start, end)` of process `pid`'s libc.
    pub fn set_libc_text(&mut self, pid: u32, start: u64, end: u64) -> Result<(), String> {
        let mut text: HashMap<_, u32, [u64; 2]> = self
            .ebpf
            .map_mut("libc_text")
            .ok_or("the BPF object has no libc_text map")?
            .try_into()
            .map_err(|e| format!("the libc_text map: {e}"))?;
        text.insert(pid, [start, end], 0)
            .map_err(|e| format!("setting process {pid}'s libc range: {e}"))
    }

    /// Attaches the program for `kind` to `event`, a uprobe event of one thread on one CPU,
    /// with `cookie` = `cpu << 32 | tid`.
    pub fn attach(&mut self, event: &PerfEvent, kind: AllocKind, cookie: u64) -> io::Result<()> {
        let name = program_for(kind);
        let program = self
            .ebpf
            .program(name)
            .ok_or_else(|| io::Error::other(format!("no {name} program")))?;
        let fd = program.fd().map_err(io::Error::other)?;
        // union bpf_attr, link_create: prog_fd, target_fd, attach_type, flags, then
        // perf_event.bpf_cookie at byte 16.
        let mut attr = [0u8; 64];
        attr[0..4].copy_from_slice(&(fd.as_fd().as_raw_fd() as u32).to_ne_bytes());
        attr[4..8].copy_from_slice(&(event.fd().as_raw_fd() as u32).to_ne_bytes());
        attr[8..12].copy_from_slice(&BPF_PERF_EVENT.to_ne_bytes());
        attr[16..24].copy_from_slice(&cookie.to_ne_bytes());
        // SAFETY: bpf(BPF_LINK_CREATE) reads `attr.len()` bytes of the buffer we own; both
        // descriptors in it are live for the call. The result is checked before being owned.
        let link = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_LINK_CREATE,
                attr.as_ptr(),
                attr.len() as libc::c_uint,
            )
        };
        if link < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor returned by the kernel, owned by nobody else.
        self.links
            .push(unsafe { OwnedFd::from_raw_fd(link as libc::c_int) });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draws_have_the_rate_as_their_mean() {
        let rate = 512 * 1024;
        let mean = (0..DRAWS).map(|i| draw(i, rate) as f64).sum::<f64>() / f64::from(DRAWS);
        assert!((mean / rate as f64 - 1.0).abs() < 0.001, "{mean}");
    }
}
