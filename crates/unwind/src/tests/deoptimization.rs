//! HotSpot's deoptimization handlers, on code OpenJDK 17 compiled for
//! `crates/capture/tests/jit/Rec.java` (bytes read from the live process at the addresses its
//! perf map gave): a compiled frame the JVM is deoptimizing returns into its method's handler,
//! which follows no call, and is still the method's fixed frame.

use super::{FP_CFI_RA, ROOT_RA, SP, space, stack};
use crate::x86_64::instruction_analysis::is_deoptimization_handler;
use crate::{Memory, ReadFailure, Region, SampleStack, StackEnd};

/// `int Rec.down(int, int)` compiled by C2: stack bang, `push rbp; sub rsp,0x20`, a recursive
/// call at 0x1b, and at 0xa3 its deoptimization handler (`call next; sub qword [rsp],5; jmp`).
const DOWN_C2: &[u8] = &[
    0x89, 0x84, 0x24, 0x00, 0xc0, 0xfe, 0xff, 0x55, 0x48, 0x83, 0xec, 0x20, 0x81, 0xfe, 0x00, 0x00,
    0x00, 0x80, 0x74, 0x2c, 0x85, 0xf6, 0x74, 0x1d, 0xff, 0xce, 0x90, 0xe8, 0xe0, 0xff, 0xff, 0xff,
    0xff, 0xc0, 0x48, 0x83, 0xc4, 0x20, 0x5d, 0x49, 0x3b, 0xa7, 0x40, 0x03, 0x00, 0x00, 0x0f, 0x87,
    0x32, 0x00, 0x00, 0x00, 0xc3, 0x8b, 0xf2, 0xe8, 0xc4, 0xf6, 0xff, 0xff, 0xff, 0xc0, 0xeb, 0xe2,
    0x89, 0x14, 0x24, 0x89, 0x74, 0x24, 0x04, 0xbe, 0x45, 0xff, 0xff, 0xff, 0x66, 0x66, 0x90, 0xe8,
    0x8c, 0xe8, 0xab, 0xff, 0x48, 0x8b, 0xf0, 0xeb, 0x03, 0x48, 0x8b, 0xf0, 0x48, 0x83, 0xc4, 0x20,
    0x5d, 0xe9, 0x7a, 0x01, 0xad, 0xff, 0x49, 0xba, 0xc7, 0x31, 0xed, 0xd4, 0x0d, 0x7f, 0x00, 0x00,
    0x4d, 0x89, 0x97, 0x58, 0x03, 0x00, 0x00, 0xe9, 0xe4, 0xd6, 0xab, 0xff, 0xf4, 0xf4, 0xf4, 0xf4,
    0x48, 0xbb, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xe9, 0xfb, 0xff, 0xff, 0xff, 0x48,
    0xbb, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xe9, 0xfb, 0xff, 0xff, 0xff, 0xe9, 0xbd,
    0xaf, 0xac, 0xff, 0xe8, 0x00, 0x00, 0x00, 0x00, 0x48, 0x83, 0x2c, 0x24, 0x05, 0xe9, 0x4e, 0xeb,
    0xab, 0xff, 0xf4, 0xf4, 0xf4, 0xf4, 0xf4, 0xf4,
];
/// Where `DOWN_C2`'s deoptimization handler starts.
const DOWN_C2_HANDLER: u64 = 0xa3;
/// Where `DOWN_C2`'s recursive call returns.
const DOWN_C2_CALL_RET: u64 = 0x20;

/// The end of `Rec.down` compiled by C1 (loaded at 0x7f0dcd415ee0): its exception handler's
/// call to a stop, `hlt`, then its deoptimization handler at 0x4dd (`mov r10, 0x7f0dcd4163bd;
/// push r10; jmp`).
const DOWN_C1_TAIL: &[u8] = &[
    0x48, 0x83, 0xe4, 0xf0, 0xe8, 0x34, 0x31, 0x0f, 0x1f, 0xf4, 0x49, 0xba, 0xbd, 0x63, 0x41, 0xcd,
    0x0d, 0x7f, 0x00, 0x00, 0x41, 0x52, 0xe9, 0xd2, 0xb9, 0x57, 0x07, 0xf4, 0xf4,
];
/// Where `DOWN_C1_TAIL`'s handler is in the process, and in the slice.
const DOWN_C1_HANDLER: u64 = 0x7f0d_cd41_63bd;
const DOWN_C1_HANDLER_IN_TAIL: usize = 10;

/// JIT code in anonymous memory: `DOWN_C2` at `JIT`, a frameless leaf (`ret`) at `LEAF`, a
/// safepoint handler at `HANDLER`.
const JIT: u64 = 0x20_0000;
const LEAF: u64 = JIT + 0x100;
const HANDLER: u64 = JIT + 0x200;
const JIT_END: u64 = JIT + 0x1000;

/// A safepoint handler's start as far as it matters here: `push rbp; mov rbp, rsp`, a call,
/// `leave; ret`.
const HANDLER_CODE: &[u8] = &[0x55, 0x48, 0x89, 0xe5, 0xe8, 0, 0, 0, 0, 0xc9, 0xc3];

/// A sample's memory with the two JIT functions' code.
struct JitCode<'a> {
    stack: SampleStack<'a>,
}

impl Memory for JitCode<'_> {
    fn read_stack_u64(&mut self, addr: u64) -> Result<u64, ReadFailure> {
        self.stack.read_stack_u64(addr)
    }

    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> bool {
        let (base, code): (u64, &[u8]) = if addr >= HANDLER {
            (HANDLER, HANDLER_CODE)
        } else if addr >= LEAF {
            (LEAF, &[0xc3])
        } else {
            (JIT, DOWN_C2)
        };
        let at = (addr - base) as usize;
        let Some(bytes) = code.get(at..) else {
            return false;
        };
        let n = buf.len().min(bytes.len());
        // Past the function: HotSpot's padding.
        buf.fill(0xf4);
        buf[..n].copy_from_slice(&bytes[..n]);
        true
    }

    fn jit_function(&mut self, addr: u64) -> Option<std::ops::Range<u64>> {
        [
            JIT..JIT + DOWN_C2.len() as u64,
            LEAF..LEAF + 1,
            HANDLER..HANDLER + HANDLER_CODE.len() as u64,
        ]
        .into_iter()
        .find(|f| f.contains(&addr))
    }

    fn jit_interrupt_handler(&mut self, addr: u64) -> bool {
        (HANDLER..HANDLER + HANDLER_CODE.len() as u64).contains(&addr)
    }
}

/// A stack from a sample in the handler at its call, with its frame pointer set, whose
/// return address is `interrupted` in `DOWN_C2`'s body (`push rbp; sub rsp, 0x20` done), whose
/// frame lies above: the handler's saved `rbp` and return address, down's 0x20 bytes of locals,
/// its saved `rbp` and return address into fp_cfi, then fp_cfi's frame.
fn unwind_from_handler_over(interrupted: u64) -> (StackEnd, Vec<u64>) {
    let mut words = vec![0x5555, interrupted];
    words.extend([0xbad; 4]);
    words.extend([SP + 0x48, FP_CFI_RA, 0xbad, 0, ROOT_RA]);
    unwind_jit(&words, crate::Registers::new(HANDLER + 4, SP, SP))
}

/// Unwinds a sample with registers `regs` over stack `words` (from `SP`), in a process whose
/// JIT code is [`JitCode`]'s.
fn unwind_jit(words: &[u64], regs: crate::Registers) -> (StackEnd, Vec<u64>) {
    let bytes = stack(words);
    let mut mem = JitCode {
        stack: SampleStack {
            base: SP,
            bytes: &bytes,
            fallback: None,
        },
    };
    let mut s = space();
    s.add_region(Region::new(JIT, JIT_END, 0, "[anon:jit]".into(), None));
    let mut out = Vec::new();
    let end = s.unwind_with_sps(&regs, &mut mem, &mut out, None);
    (end, out)
}

#[test]
fn a_frame_stopped_at_a_safepoint_poll_is_unwound_at_that_instruction() {
    // Interrupted at `test esi, esi` (0x14), which follows no call.
    assert_eq!(
        unwind_from_handler_over(JIT + 0x14),
        (
            StackEnd::Root,
            vec![HANDLER + 4, JIT + 0x14, FP_CFI_RA, ROOT_RA]
        )
    );
}

/// Unwinds a sample at `LEAF` whose return address is `ra` in `DOWN_C2`, whose frame (0x20
/// bytes of locals, the saved `rbp`, the return address into fp_cfi's body) lies above it.
fn unwind_from_leaf_returning_to(ra: u64) -> (StackEnd, Vec<u64>) {
    let mut words = vec![ra];
    words.extend([0xbad; 4]);
    // down's saved rbp: fp_cfi's frame pointer, at SP + 0x40.
    words.extend([SP + 0x40, FP_CFI_RA]);
    // fp_cfi's frame: a local, its saved rbp (0: the outermost), root's return address.
    words.extend([0xbad, 0, ROOT_RA]);
    unwind_jit(&words, crate::Registers::new(LEAF, SP, 0x1234))
}

#[test]
fn a_frame_being_deoptimized_is_unwound_through_its_handler() {
    // The same frame stopped at its call and redirected to its handler unwind alike.
    for ra in [JIT + DOWN_C2_CALL_RET, JIT + DOWN_C2_HANDLER] {
        assert_eq!(
            unwind_from_leaf_returning_to(ra),
            (StackEnd::Root, vec![LEAF, ra, FP_CFI_RA, ROOT_RA]),
            "returning to {ra:#x}"
        );
    }
}

#[test]
fn other_code_that_follows_no_call_still_ends_the_stack() {
    // After the `ret` at 0x34: no call before it, no handler at it.
    let (end, out) = unwind_from_leaf_returning_to(JIT + 0x35);
    assert_eq!(
        (end, out),
        (
            StackEnd::Truncated(crate::TruncateReason::NotAfterCall),
            vec![LEAF]
        )
    );
}

#[test]
fn both_compilers_handlers_are_recognised_and_nothing_else() {
    let c2 = &DOWN_C2[DOWN_C2_HANDLER as usize..];
    assert!(is_deoptimization_handler(JIT + DOWN_C2_HANDLER, c2));
    let c1 = &DOWN_C1_TAIL[DOWN_C1_HANDLER_IN_TAIL..];
    assert!(is_deoptimization_handler(DOWN_C1_HANDLER, c1));
    // C1's form names its own address: the same bytes elsewhere are other code.
    assert!(!is_deoptimization_handler(DOWN_C1_HANDLER + 0x10, c1));
    // C2's uncommon-trap stub also loads an address into r10 (then stores it, no push).
    assert!(!is_deoptimization_handler(JIT + 0x66, &DOWN_C2[0x66..]));
    // Too short to tell.
    assert!(!is_deoptimization_handler(DOWN_C1_HANDLER, &c1[..12]));
    // Every other offset of both methods.
    for at in (0..DOWN_C2.len()).filter(|&at| at != DOWN_C2_HANDLER as usize) {
        assert!(!is_deoptimization_handler(JIT + at as u64, &DOWN_C2[at..]));
    }
    let tail_at = DOWN_C1_HANDLER - DOWN_C1_HANDLER_IN_TAIL as u64;
    for at in (0..DOWN_C1_TAIL.len()).filter(|&at| at != DOWN_C1_HANDLER_IN_TAIL) {
        assert!(!is_deoptimization_handler(
            tail_at + at as u64,
            &DOWN_C1_TAIL[at..]
        ));
    }
}
