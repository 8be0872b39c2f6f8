//! The kernel's frame-pointer callchain as a second source, taken at the sample's own instant.
//!
//! With `PERF_SAMPLE_CALLCHAIN` and user callchains enabled, the kernel walks the user stack's
//! frame-pointer chain while it takes the sample: from `fp = rbp` it records the return address
//! at `fp + 8` and moves to `fp = [fp]`, at most `sample_max_stack` times
//! (`kernel.perf_event_max_stack`). It reports only the return addresses, not where it read them.
//!
//! The caller hands [`cross_check`] the sample's registers, that callchain, the stack the unwinder
//! produced (return addresses with the stack pointer of each caller) and the memory the unwinder
//! read. This module re-walks the same frame-pointer chain through that memory to learn the
//! *stack address* of each callchain entry, and joins an entry to an unwound frame only when both
//! were read from the same stack slot — never by matching return addresses alone (recursion
//! repeats them). At a joined slot the two must agree: past the copied stack the unwinder's word
//! came from the live process, read after the sample, while the kernel's came from the sample's
//! instant, so a disagreement proves the stack changed in between and the unwound stack is cut
//! there. Entries whose slot matches no unwound frame are ignored: a function without a frame
//! pointer makes the chain skip or invent frames, which is why it is only a cross-check here.

use crate::unwind::Memory;

/// What the cross-check found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CrossCheck {
    /// Callchain entries joined to an unwound frame by stack address.
    pub joined: usize,
    /// Joined entries whose slot lies past the copied stack (the ones that check live reads).
    pub joined_live: usize,
    /// The first unwound frame (index into the stack, leaf = 0) whose return address disagrees
    /// with the kernel's at the same stack slot.
    pub mismatch: Option<usize>,
}

/// Joins `chain` (the kernel's user callchain: IP first, then return addresses) with an unwound
/// stack: `addrs[i]` (i ≥ 1) is a return address read at `sps[i] - 8`. `bp` is the sampled frame
/// pointer and `copy_end` the end of the copied stack. Frame-pointer words are read through
/// `mem`, the memory the unwinder used (so no slot is read twice from different sources).
pub fn cross_check(
    chain: &[u64],
    bp: u64,
    addrs: &[u64],
    sps: &[u64],
    copy_end: u64,
    mem: &mut dyn Memory,
) -> CrossCheck {
    let mut out = CrossCheck::default();
    let mut fp = bp;
    // Unwound frames in increasing slot order (stack pointers strictly increase).
    let mut i = 1;
    let last_slot = sps.last().map_or(0, |s| s.wrapping_sub(8));
    for (k, &ra) in chain.iter().enumerate().skip(1) {
        let Some(slot) = fp.checked_add(8) else { break };
        if slot > last_slot {
            // Past the last unwound frame: nothing left to join (and nothing to read for).
            break;
        }
        while i < addrs.len() && sps.get(i).is_some_and(|&s| s.wrapping_sub(8) < slot) {
            i += 1;
        }
        if i < addrs.len() && sps.get(i).is_some_and(|&s| s.wrapping_sub(8) == slot) {
            out.joined += 1;
            if slot >= copy_end {
                out.joined_live += 1;
            }
            if addrs[i] != ra {
                out.mismatch = Some(i);
                return out;
            }
        }
        if k + 1 == chain.len() {
            break;
        }
        // The kernel moved to [fp]; a chain that does not climb cannot be followed further by
        // address (and the kernel's own walk would have gone somewhere we do not track).
        let Ok(next) = mem.read_stack_u64(fp) else {
            break;
        };
        if next <= fp {
            break;
        }
        fp = next;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind::{ReadFailure, SampleStack};

    /// A stack of frame records at 0x1000 + 0x100·n: [fp] = next record, [fp+8] = return address.
    fn stack(frames: usize) -> (u64, Vec<u8>, Vec<u64>) {
        let base = 0x1000u64;
        let mut bytes = vec![0u8; 0x100 * (frames + 1)];
        let mut ras = Vec::new();
        for n in 0..frames {
            let fp = 0x100 * n;
            let next = base + 0x100 * (n as u64 + 1);
            let ra = 0x40_0000 + n as u64 * 16;
            bytes[fp..fp + 8].copy_from_slice(&next.to_le_bytes());
            bytes[fp + 8..fp + 16].copy_from_slice(&ra.to_le_bytes());
            ras.push(ra);
        }
        (base, bytes, ras)
    }

    #[test]
    fn joins_by_slot_and_finds_a_changed_return_address() {
        let (base, bytes, ras) = stack(6);
        let mut mem = SampleStack {
            base,
            bytes: &bytes,
            fallback: None,
        };
        // The unwinder's view: the same frames; caller i's sp is just above its return address.
        let mut addrs = vec![0x40_1234];
        let mut sps = vec![base];
        for (n, &ra) in ras.iter().enumerate() {
            addrs.push(ra);
            sps.push(base + 0x100 * n as u64 + 16);
        }
        let mut chain = addrs.clone();
        let copy_end = base + 0x300;
        let c = cross_check(&chain, base, &addrs, &sps, copy_end, &mut mem);
        assert_eq!(c.joined, 6);
        assert_eq!(c.joined_live, 3);
        assert_eq!(c.mismatch, None);
        // The kernel saw another return address in frame 4's slot at the sample's instant.
        chain[4] = 0x50_0000;
        let c = cross_check(&chain, base, &addrs, &sps, copy_end, &mut mem);
        assert_eq!(c.mismatch, Some(4));
    }

    #[test]
    fn equal_return_addresses_at_other_slots_are_not_joined() {
        // Recursion: every frame has the same return address. An unwound stack that skipped a
        // frame has the right addresses but at the wrong slots: only slot matches count.
        let (base, mut bytes, _) = stack(5);
        for n in 0..5 {
            bytes[0x100 * n + 8..0x100 * n + 16].copy_from_slice(&0x40_0000u64.to_le_bytes());
        }
        let mut mem = SampleStack {
            base,
            bytes: &bytes,
            fallback: None,
        };
        let addrs = vec![0x40_1234, 0x40_0000, 0x40_0000];
        let sps = vec![base, base + 0x100 + 16, base + 0x300 + 16];
        let chain = vec![0x40_1234, 0x40_0000, 0x40_0000, 0x40_0000, 0x40_0000];
        let c = cross_check(&chain, base, &addrs, &sps, base, &mut mem);
        assert_eq!(c.joined, 2, "slots 1 and 3 only");
        assert_eq!(c.mismatch, None);
    }

    #[test]
    fn an_unreadable_frame_pointer_ends_the_join() {
        struct Nothing;
        impl Memory for Nothing {
            fn read_stack_u64(&mut self, _: u64) -> Result<u64, ReadFailure> {
                Err(ReadFailure::Unreadable)
            }
        }
        let c = cross_check(
            &[1, 2, 3],
            0x1000,
            &[1, 2],
            &[0x0ff0, 0x1010],
            0,
            &mut Nothing,
        );
        assert_eq!(c.joined, 1);
        assert_eq!(c.mismatch, None);
    }
}
