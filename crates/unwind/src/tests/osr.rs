//! .NET On-Stack-Replacement frames, on code a .NET 8.0.4 runtime compiled for
//! `crates/capture/tests/jit/Calls.cs` (bytes read from the live process at the addresses its
//! perf map gave): an OSR method's frame sits on the Tier-0 frame it continues, and its caller is
//! the Tier-0 method's caller.

use super::{ROOT_RA, SP, space, stack};
use crate::x86_64::instruction_analysis::jit::{caller_rule, leaf_rule};
use crate::x86_64::instruction_analysis::{NoCfiRule, OsrSlot};
use crate::{Memory, ReadFailure, Region, SampleStack, StackEnd};

/// `Calls::Shallow(object)[QuickJitted]`: `push rbp; sub rsp,0x50; lea rbp,[rsp+0x50]`, its
/// patchpoint call at 0x29 (returning to 0x2e), then the loop.
const SHALLOW_TIER0: &[u8] = &[
    0x55, 0x48, 0x83, 0xec, 0x50, 0x48, 0x8d, 0x6c, 0x24, 0x50, 0x48, 0x89, 0x7d, 0xd0, 0xc7, 0x45,
    0xc0, 0xe8, 0x03, 0x00, 0x00, 0x8b, 0x7d, 0xc0, 0xff, 0xcf, 0x89, 0x7d, 0xc0, 0x83, 0x7d, 0xc0,
    0x00, 0x7f, 0x0b, 0x48, 0x8d, 0x7d, 0xc0, 0x33, 0xf6, 0xe8, 0x02, 0xf7, 0x52, 0x7e, 0x8b, 0x35,
    0xb0, 0xae, 0x08, 0x00, 0x89, 0x75, 0xcc, 0x48, 0x8b, 0x75, 0xd0, 0x48, 0xbf, 0x80, 0x09, 0x18,
    0x1f, 0x76, 0x7f, 0x00, 0x00, 0xff, 0x15, 0x9d, 0x1d, 0xff, 0xff, 0x8b, 0x38, 0x89, 0x7d, 0xbc,
    0x8b, 0x7d, 0xbc, 0xbe, 0x20, 0x4e, 0x00, 0x00, 0xff, 0x15, 0xd2, 0x4a, 0x09, 0x00, 0x03, 0x45,
    0xcc, 0x89, 0x05, 0x7d, 0xae, 0x08, 0x00, 0xeb, 0xac,
];
/// Where the Tier-0 method's patchpoint call returns.
const SHALLOW_PATCHPOINT_RET: u64 = 0x2e;

/// `Calls::Shallow(object)[OptimizedTier1OSR]`: `mov rax,[rbp]; push rax; sub rsp,0x20;` saves
/// of r15, r14, rbx into the Tier-0 frame; `lea rbp,[rsp+0x20]`; an endless loop (no epilogue).
const SHALLOW_OSR: &[u8] = &[
    0x48, 0x8b, 0x45, 0x00, 0x50, 0x48, 0x83, 0xec, 0x20, 0x4c, 0x89, 0x7c, 0x24, 0x78, 0x4c, 0x89,
    0x74, 0x24, 0x70, 0x48, 0x89, 0x5c, 0x24, 0x68, 0x48, 0x8d, 0x6c, 0x24, 0x20, 0x48, 0x8b, 0x5d,
    0x30, 0x49, 0xbf, 0x04, 0xd5, 0x29, 0x1f, 0x76, 0x7f, 0x00, 0x00, 0x45, 0x8b, 0x37, 0x48, 0xbe,
    0x80, 0x09, 0x18, 0x1f, 0x76, 0x7f, 0x00, 0x00, 0x48, 0x39, 0x33, 0x74, 0x13, 0x48, 0x8b, 0xf3,
    0x48, 0xbf, 0x80, 0x09, 0x18, 0x1f, 0x76, 0x7f, 0x00, 0x00, 0xff, 0x15, 0xf8, 0x14, 0xff, 0xff,
    0x8b, 0x7b, 0x08, 0xbe, 0x20, 0x4e, 0x00, 0x00, 0xff, 0x15, 0x32, 0x42, 0x09, 0x00, 0x41, 0x03,
    0xc6, 0x41, 0x89, 0x07, 0xeb, 0xbb,
];
/// A return address in `SHALLOW_OSR` (after `call [rip+..]` at 0x5a).
const SHALLOW_OSR_CALL_RET: usize = 0x60;

/// `Calls::Spin(int32)[OptimizedTier1OSR]`, with its epilogue: `add rsp,0x58; pop rbx;
/// pop r14; pop r15; pop rbp; ret` (popping the Tier-0 frame too).
const SPIN_OSR: &[u8] = &[
    0x48, 0x8b, 0x45, 0x00, 0x50, 0x48, 0x83, 0xec, 0x20, 0x4c, 0x89, 0x7c, 0x24, 0x68, 0x4c, 0x89,
    0x74, 0x24, 0x60, 0x48, 0x89, 0x5c, 0x24, 0x58, 0x48, 0x8d, 0x6c, 0x24, 0x20, 0x8b, 0x5d, 0x24,
    0x44, 0x8b, 0x75, 0x20, 0x44, 0x8b, 0x7d, 0x1c, 0x44, 0x3b, 0xfb, 0x7d, 0x17, 0x41, 0x8b, 0xff,
    0x41, 0x8b, 0xf6, 0xff, 0x15, 0xa7, 0x52, 0x09, 0x00, 0x44, 0x03, 0xf0, 0x41, 0xff, 0xc7, 0x44,
    0x3b, 0xfb, 0x7c, 0xe9, 0x41, 0x8b, 0xc6, 0x48, 0x83, 0xc4, 0x58, 0x5b, 0x41, 0x5e, 0x41, 0x5f,
    0x5d, 0xc3,
];

fn leaf(code: &[u8], off: usize) -> Option<NoCfiRule> {
    leaf_rule(code, off, &code[off..])
}

#[test]
fn an_osr_method_is_recognised_by_its_entry_at_every_prologue_instruction() {
    use NoCfiRule::Osr;
    assert_eq!(
        leaf(SHALLOW_OSR, 0),
        Some(Osr {
            slot: OsrSlot::Sp(0)
        })
    );
    assert_eq!(
        leaf(SHALLOW_OSR, 4),
        Some(Osr {
            slot: OsrSlot::Sp(0)
        })
    );
    assert_eq!(
        leaf(SHALLOW_OSR, 5),
        Some(Osr {
            slot: OsrSlot::Sp(8)
        })
    );
    assert_eq!(
        leaf(SHALLOW_OSR, 9),
        Some(Osr {
            slot: OsrSlot::Sp(0x28)
        })
    );
    assert_eq!(
        leaf(SHALLOW_OSR, 0x18),
        Some(Osr {
            slot: OsrSlot::Sp(0x28)
        })
    );
    // In the endless loop (no path to `ret`): the frame pointer the prologue set.
    assert_eq!(
        leaf(SHALLOW_OSR, 0x21),
        Some(Osr {
            slot: OsrSlot::Bp(8)
        })
    );
    assert_eq!(
        caller_rule(SHALLOW_OSR, SHALLOW_OSR_CALL_RET),
        Some(Osr {
            slot: OsrSlot::Bp(8)
        })
    );
}

#[test]
fn an_osr_method_with_an_epilogue_is_read_from_its_path_to_ret() {
    // add rsp,0x58 + three pops + pop rbp: the real return address (the Tier-0 frame's) is
    // 0x78 above rsp, the caller's rbp 0x70.
    assert_eq!(
        leaf(SPIN_OSR, 0x1d),
        Some(NoCfiRule::ReturnAt {
            ra: 0x78,
            saved_bp: Some(0x70)
        })
    );
    assert_eq!(leaf(SPIN_OSR, 0x51), Some(NoCfiRule::ReturnAtSp));
    assert_eq!(
        caller_rule(SPIN_OSR, 0x39),
        Some(NoCfiRule::Osr {
            slot: OsrSlot::Bp(8)
        })
    );
}

#[test]
fn tier0_code_is_not_taken_for_osr_code() {
    assert_eq!(leaf(SHALLOW_TIER0, 0x0e), Some(NoCfiRule::FramePointer));
}

const JIT: u64 = 0x20_0000;
const TIER0: u64 = JIT;
const OSR: u64 = JIT + 0x1000;
const JIT_END: u64 = JIT + 0x2000;

/// A sample's memory in a process whose JIT code holds `Shallow`'s Tier-0 and OSR versions.
struct DotnetJit<'a> {
    stack: SampleStack<'a>,
}

impl Memory for DotnetJit<'_> {
    fn read_stack_u64(&mut self, addr: u64) -> Result<u64, ReadFailure> {
        self.stack.read_stack_u64(addr)
    }

    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> bool {
        let (start, code) = if addr >= OSR {
            (OSR, SHALLOW_OSR)
        } else {
            (TIER0, SHALLOW_TIER0)
        };
        let Some(from) = addr.checked_sub(start).map(|o| o as usize) else {
            return false;
        };
        match code.get(from..from + buf.len()) {
            Some(bytes) => {
                buf.copy_from_slice(bytes);
                true
            }
            None => false,
        }
    }

    fn jit_function(&mut self, addr: u64) -> Option<std::ops::Range<u64>> {
        [
            (TIER0, SHALLOW_TIER0.len() as u64),
            (OSR, SHALLOW_OSR.len() as u64),
        ]
        .into_iter()
        .find(|&(s, len)| (s..s + len).contains(&addr))
        .map(|(s, len)| s..s + len)
    }
}

/// The stack of a sample in `Shallow`'s OSR loop at `SP`, called from root: the OSR frame
/// (0x20 bytes, the caller's rbp copied, the slot holding `slot`), the Tier-0 frame (0x50 bytes,
/// the caller's rbp, the return into root).
fn osr_stack(slot: u64, callers_bp: u64) -> Vec<u64> {
    let mut w = vec![0xbad; 4];
    w.extend([callers_bp, slot]);
    w.extend([0xbad; 10]);
    w.extend([callers_bp, ROOT_RA]);
    w
}

fn unwind_osr(words: &[u64]) -> (StackEnd, Vec<u64>) {
    let mut s = space();
    s.add_region(Region::new(JIT, JIT_END, 0, "[anon:jit]".into(), None));
    let bytes = stack(words);
    let mut mem = DotnetJit {
        stack: SampleStack {
            base: SP,
            bytes: &bytes,
            fallback: None,
        },
    };
    let mut out = Vec::new();
    let osr_bp = SP + 0x20;
    let regs = crate::Registers::new(OSR + 0x21, SP, osr_bp);
    let end = s.unwind_with_sps(&regs, &mut mem, &mut out, None);
    (end, out)
}

#[test]
fn an_osr_frame_returns_to_the_caller_of_the_tier0_frame_it_continues() {
    let (end, out) = unwind_osr(&osr_stack(TIER0 + SHALLOW_PATCHPOINT_RET, 0));
    // One frame for the method (the Tier-0 frame under it is not a second call), then root.
    assert_eq!((end, out), (StackEnd::Root, vec![OSR + 0x21, ROOT_RA]));
}

#[test]
fn an_osr_slot_not_holding_a_patchpoint_return_ends_the_stack() {
    // Not after a call in the Tier-0 method: no guess at where its frame ends.
    let (end, out) = unwind_osr(&osr_stack(TIER0 + 0x10, 0));
    assert_eq!(
        (end, out),
        (
            StackEnd::Truncated(crate::TruncateReason::NoUnwindInfo),
            vec![OSR + 0x21]
        )
    );
}
