//! Parsing of perf ring-buffer records for the sample layout [`super::PerfEvent`] requests.

use perf_event_open_sys::bindings as b;

use super::PERF_CONTEXT_MAX;
use crate::unwind::regs::{self, Registers};

/// A parsed ring-buffer record.
#[derive(Debug)]
pub enum Record<'a> {
    /// A sample.
    Sample(Sample<'a>),
    /// An executable mapping was created.
    Mmap2 {
        /// Process id.
        pid: u32,
        /// Start address.
        addr: u64,
        /// Length in bytes.
        len: u64,
        /// File offset.
        pgoff: u64,
        /// Device major/minor and inode (zero when the record carries a build id instead).
        file_key: (u32, u32, u64),
        /// File path or pseudo name.
        filename: &'a str,
    },
    /// A thread got a name (`exec` true when the process exec'd).
    Comm {
        /// Process id.
        pid: u32,
        /// Thread id.
        tid: u32,
        /// New name.
        name: &'a str,
        /// The name change comes from an exec.
        exec: bool,
    },
    /// A thread or process was created.
    Fork {
        /// New process id.
        pid: u32,
        /// Parent process id.
        ppid: u32,
        /// New thread id.
        tid: u32,
    },
    /// A thread or process exited.
    Exit {
        /// Process id.
        pid: u32,
        /// Thread id.
        tid: u32,
    },
    /// A thread entered or left the CPU (`PERF_RECORD_SWITCH`, or `PERF_RECORD_SWITCH_CPU_WIDE`
    /// of a per-CPU event; the thread is read from the `sample_id_all` trailer).
    Switch {
        /// Process id.
        pid: u32,
        /// Thread id.
        tid: u32,
        /// The thread left the CPU (else it entered it).
        out: bool,
        /// It left while still runnable: preempted rather than blocked or sleeping.
        preempt: bool,
    },
    /// The kernel dropped this many records (ring full).
    Lost(u64),
    /// Anything else.
    Other,
}

/// One sample as the kernel recorded it.
#[derive(Debug)]
pub struct Sample<'a> {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Time (CLOCK_MONOTONIC, ns).
    pub time: u64,
    /// CPU.
    pub cpu: u32,
    /// Event period (ns for cpu-clock).
    pub period: u64,
    /// The sample interrupted kernel code (the user registers are those of the last entry to
    /// the kernel).
    pub kernel_mode: bool,
    /// Kernel callchain IPs (with context markers removed), leaf first.
    pub kernel_ips: Vec<u64>,
    /// The kernel's frame-pointer walk of the user stack, taken with the sample (when requested):
    /// the user IP, then each return address it found, leaf first.
    pub user_ips: Vec<u64>,
    /// User registers, absent for kernel threads.
    pub user_regs: Option<Registers>,
    /// Copied user stack starting at the user SP.
    pub stack: &'a [u8],
}

struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn u64(&mut self) -> Option<u64> {
        let v = self.data.get(self.pos..self.pos + 8)?;
        self.pos += 8;
        Some(u64::from_le_bytes(v.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        let v = self.data.get(self.pos..self.pos + 4)?;
        self.pos += 4;
        Some(u32::from_le_bytes(v.try_into().ok()?))
    }
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let v = self.data.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(v)
    }
    fn cstr(&mut self) -> Option<&'a str> {
        let rest = self.data.get(self.pos..)?;
        let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
        let s = std::str::from_utf8(&rest[..end]).ok()?;
        self.pos += (end + 8) & !7;
        Some(s)
    }
}

/// Whether a raw record is a sample.
pub fn is_sample(data: &[u8]) -> bool {
    data.get(0..4) == Some(&b::PERF_RECORD_SAMPLE.to_le_bytes()[..])
}

/// The time of a non-sample record, from its `sample_id_all` trailer (`pid tid | time | cpu res`).
pub fn side_band_time(data: &[u8]) -> Option<u64> {
    let end = data.len().checked_sub(16)?;
    Some(u64::from_le_bytes(data.get(end..end + 8)?.try_into().ok()?))
}

/// Parses one record (header included). `callchain` (samples carry `PERF_SAMPLE_CALLCHAIN`)
/// must match the event's configuration. Malformed records parse as [`Record::Other`].
pub fn parse_record(data: &[u8], callchain: bool) -> Record<'_> {
    parse(data, callchain).unwrap_or(Record::Other)
}

fn parse(data: &[u8], callchain: bool) -> Option<Record<'_>> {
    let kind = u32::from_le_bytes(data.get(0..4)?.try_into().ok()?);
    let misc = u16::from_le_bytes(data.get(4..6)?.try_into().ok()?) as u32;
    let mut c = Cursor { data, pos: 8 };
    Some(match kind {
        b::PERF_RECORD_SAMPLE => {
            let _ip = c.u64()?;
            let pid = c.u32()?;
            let tid = c.u32()?;
            let time = c.u64()?;
            let cpu = c.u32()?;
            let _res = c.u32()?;
            let period = c.u64()?;
            let mut kernel_ips = Vec::new();
            let mut user_ips = Vec::new();
            if callchain {
                let nr = c.u64()?;
                let mut user = false;
                for _ in 0..nr {
                    let ip = c.u64()?;
                    // The user part comes last, and its entries are whatever the kernel's
                    // frame-pointer walk read from the stack (-1 and other values in the marker
                    // range among them): after `PERF_CONTEXT_USER` nothing is a marker.
                    if user {
                        user_ips.push(ip);
                    } else if ip >= PERF_CONTEXT_MAX {
                        user = ip == b::PERF_CONTEXT_USER;
                    } else {
                        kernel_ips.push(ip);
                    }
                }
            }
            let abi = c.u64()?;
            // With any ABI but "none" the kernel writes one value per requested register; only
            // 64-bit processes' are unwound.
            let user_regs = if abi == u64::from(b::PERF_SAMPLE_REGS_ABI_NONE) {
                None
            } else {
                let mut values = [0u64; regs::COUNT];
                for v in &mut values {
                    *v = c.u64()?;
                }
                if abi == u64::from(b::PERF_SAMPLE_REGS_ABI_64) {
                    Registers::from_perf(&values)
                } else {
                    None
                }
            };
            let size = c.u64()? as usize;
            let raw = c.bytes(size)?;
            let stack = if size > 0 {
                let dyn_size = (c.u64()? as usize).min(size);
                &raw[..dyn_size]
            } else {
                raw
            };
            Record::Sample(Sample {
                pid,
                tid,
                time,
                cpu,
                period,
                kernel_mode: misc & 7 == b::PERF_RECORD_MISC_KERNEL,
                kernel_ips,
                user_ips,
                user_regs,
                stack,
            })
        }
        b::PERF_RECORD_MMAP2 => {
            let pid = c.u32()?;
            let _tid = c.u32()?;
            let addr = c.u64()?;
            let len = c.u64()?;
            let pgoff = c.u64()?;
            let file_key = if misc & b::PERF_RECORD_MISC_MMAP_BUILD_ID != 0 {
                c.bytes(24)?;
                (0, 0, 0)
            } else {
                let maj = c.u32()?;
                let min = c.u32()?;
                let ino = c.u64()?;
                let _gen = c.u64()?;
                (maj, min, ino)
            };
            let _prot = c.u32()?;
            let _flags = c.u32()?;
            Record::Mmap2 {
                pid,
                addr,
                len,
                pgoff,
                file_key,
                filename: c.cstr()?,
            }
        }
        b::PERF_RECORD_COMM => {
            let pid = c.u32()?;
            let tid = c.u32()?;
            Record::Comm {
                pid,
                tid,
                name: c.cstr()?,
                exec: misc & b::PERF_RECORD_MISC_COMM_EXEC != 0,
            }
        }
        b::PERF_RECORD_FORK | b::PERF_RECORD_EXIT => {
            let pid = c.u32()?;
            let ppid = c.u32()?;
            let tid = c.u32()?;
            if kind == b::PERF_RECORD_FORK {
                Record::Fork { pid, ppid, tid }
            } else {
                Record::Exit { pid, tid }
            }
        }
        b::PERF_RECORD_SWITCH | b::PERF_RECORD_SWITCH_CPU_WIDE => {
            if kind == b::PERF_RECORD_SWITCH_CPU_WIDE {
                // The other task of the switch; the one switching is in the trailer.
                c.u64()?;
            }
            let pid = c.u32()?;
            let tid = c.u32()?;
            Record::Switch {
                pid,
                tid,
                out: misc & b::PERF_RECORD_MISC_SWITCH_OUT != 0,
                preempt: misc & b::PERF_RECORD_MISC_SWITCH_OUT_PREEMPT != 0,
            }
        }
        b::PERF_RECORD_LOST => {
            let _id = c.u64()?;
            Record::Lost(c.u64()?)
        }
        _ => Record::Other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind::regs::{RBP, RBX, RIP, RSP};

    /// A sample record as the kernel writes it for our sample type (no callchain): every
    /// requested register in perf bit order, then the stack copy and its dynamic size.
    fn sample_bytes(regs: &[u64], stack: &[u8]) -> Vec<u8> {
        sample_with_callchain(None, regs, stack)
    }

    /// [`sample_bytes`] with a callchain (`PERF_SAMPLE_CALLCHAIN`) when `callchain` is given.
    fn sample_with_callchain(callchain: Option<&[u64]>, regs: &[u64], stack: &[u8]) -> Vec<u8> {
        let mut body = Vec::new();
        let mut put = |v: u64| body.extend_from_slice(&v.to_le_bytes());
        put(0x1234); // ip
        put(u64::from(7u32) | (u64::from(8u32) << 32)); // pid, tid
        put(99); // time
        put(1); // cpu, res
        put(1_000_000); // period
        if let Some(chain) = callchain {
            put(chain.len() as u64);
            for &ip in chain {
                put(ip);
            }
        }
        put(u64::from(b::PERF_SAMPLE_REGS_ABI_64));
        for &r in regs {
            put(r);
        }
        put(stack.len() as u64);
        body.extend_from_slice(stack);
        body.extend_from_slice(&(stack.len() as u64).to_le_bytes());
        let mut rec = Vec::new();
        rec.extend_from_slice(&b::PERF_RECORD_SAMPLE.to_le_bytes());
        rec.extend_from_slice(&(b::PERF_RECORD_MISC_USER as u16).to_le_bytes());
        rec.extend_from_slice(&((8 + body.len()) as u16).to_le_bytes());
        rec.extend_from_slice(&body);
        rec
    }

    #[test]
    fn a_cpu_wide_switch_record_names_the_thread_of_its_trailer() {
        let mut rec = Vec::new();
        rec.extend_from_slice(&b::PERF_RECORD_SWITCH_CPU_WIDE.to_le_bytes());
        let misc = (b::PERF_RECORD_MISC_SWITCH_OUT | b::PERF_RECORD_MISC_SWITCH_OUT_PREEMPT) as u16;
        rec.extend_from_slice(&misc.to_le_bytes());
        rec.extend_from_slice(&40u16.to_le_bytes());
        // The next task (pid 5, tid 6), then the trailer: pid 7, tid 8, time, cpu.
        for (a, b) in [(5u32, 6u32), (7, 8)] {
            rec.extend_from_slice(&a.to_le_bytes());
            rec.extend_from_slice(&b.to_le_bytes());
        }
        rec.extend_from_slice(&1234u64.to_le_bytes());
        rec.extend_from_slice(&0u64.to_le_bytes());
        let Record::Switch {
            pid,
            tid,
            out,
            preempt,
        } = parse_record(&rec, false)
        else {
            panic!("not a switch record");
        };
        assert_eq!((pid, tid, out, preempt), (7, 8, true, true));
        assert_eq!(side_band_time(&rec), Some(1234));
    }

    #[test]
    fn every_general_purpose_register_is_parsed() {
        // perf order: AX BX CX DX SI DI BP SP IP R8..R15.
        let regs: Vec<u64> = (0..17).map(|i| 0x100 + i).collect();
        let stack = [0xaau8; 16];
        let bytes = sample_bytes(&regs, &stack);
        let Record::Sample(s) = parse_record(&bytes, false) else {
            panic!("not parsed as a sample");
        };
        let r = s.user_regs.expect("registers");
        assert_eq!(r.get(RBX), Some(0x101));
        assert_eq!(r.get(RBP), Some(0x106));
        assert_eq!(r.get(RSP), Some(0x107));
        assert_eq!(r.get(RIP), Some(0x108));
        assert_eq!(r.get(15), Some(0x110));
        assert_eq!((s.pid, s.tid, s.stack), (7, 8, &stack[..]));
        // A 32-bit process's registers are skipped, not read as the stack size.
        let mut compat = bytes.clone();
        let abi_at = 8 + 5 * 8;
        compat[abi_at..abi_at + 8]
            .copy_from_slice(&u64::from(b::PERF_SAMPLE_REGS_ABI_32).to_le_bytes());
        let Record::Sample(s) = parse_record(&compat, false) else {
            panic!("not parsed as a sample");
        };
        assert!(s.user_regs.is_none());
        assert_eq!(s.stack, &stack[..]);
        // A record cut inside the registers is not a sample.
        assert!(matches!(
            parse_record(&sample_bytes(&regs[..10], &[]), false),
            Record::Other
        ));
    }

    #[test]
    fn after_the_user_marker_every_callchain_entry_is_a_user_address() {
        // A frame-pointer walk through a frame-pointer-less binary reads whatever the stack
        // holds, -1 included: that is a user entry, not a context marker ending the user part.
        let user = b::PERF_CONTEXT_USER;
        let kernel = b::PERF_CONTEXT_KERNEL;
        let chain = [
            kernel,
            0xffff_ffff_8100_0000,
            user,
            0x7f00_0000_1000,
            u64::MAX,
            0x7f00_0000_2000,
        ];
        let regs: Vec<u64> = (0..17).collect();
        let bytes = sample_with_callchain(Some(&chain), &regs, &[]);
        let Record::Sample(s) = parse_record(&bytes, true) else {
            panic!("not parsed as a sample");
        };
        assert_eq!(s.kernel_ips, [0xffff_ffff_8100_0000]);
        assert_eq!(s.user_ips, [0x7f00_0000_1000, u64::MAX, 0x7f00_0000_2000]);
        assert!(s.user_regs.is_some());
    }
}
