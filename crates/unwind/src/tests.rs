//! Unwinder tests on a crafted module: every way a stack can end (a real root, or an explicit
//! truncation) and the full-register path for CFI that needs more than rip, rsp and rbp.

use std::sync::Arc;

use gimli::X86_64;
use gimli::write::CallFrameInstruction as I;

use crate::cfi::tests::eh_frame_rows;
use crate::regs::{self, Registers};
use crate::synthetic::SyntheticBinary;
use crate::{
    Memory, MemoryReader, NoCfiRule, ReadFailure, Region, SampleStack, StackEnd, TruncateReason,
};

type AddressSpace = crate::AddressSpace<SyntheticBinary>;

const TEXT: u64 = 0x1000;
/// `root` (CFI: return address undefined) calls `tramp` and returns to `ROOT_RA`.
const ROOT: u64 = 0x1000;
const ROOT_RA: u64 = 0x1010;
/// `tramp` (CFI: rbx saved, then CFA = rbx+16, like ld.so's `_dl_runtime_resolve`) calls the
/// leaves and returns to `TRAMP_RA`.
const TRAMP: u64 = 0x1100;
const TRAMP_RA: u64 = 0x1150;
/// `leaf` (CFI: push rbx at +4).
const LEAF: u64 = 0x1200;
/// `fp_nocfi`: `push rbp; mov rsp,rbp`, no CFI.
const FP_NOCFI: u64 = 0x1300;
/// `fp_cfi`: a frame-pointer function with CFI (CFA = rbp+16 from +4).
const FP_CFI: u64 = 0x1400;
/// A return address in `fp_cfi`'s body.
const FP_CFI_RA: u64 = FP_CFI + 0x80;
/// 0x1500..0x1600: code without a symbol or CFI (function start unknown).
const NAMELESS: u64 = 0x1500;
/// `clone3`, without CFI.
const CLONE3: u64 = 0x1600;
/// `clone3`'s CFI-covered part (from here to its system call), as in glibc.
const CLONE3_PARENT: u64 = CLONE3 + 0x40;
/// `clone3`'s system call (the child's first instructions follow it, without CFI).
const CLONE3_SYSCALL: u64 = CLONE3 + 0x4e;
/// The child's `thread_start` (CFI: return address undefined).
const CLONE3_CHILD: u64 = CLONE3 + 0x58;
/// `big_fp`: 8 KiB, `push rbp; mov rsp,rbp`, no CFI.
const BIG_FP: u64 = 0x1700;
/// V8's `Builtins_InterpreterEnterAtNextBytecode` (nops before it: no call).
const REENTRY: u64 = 0x3700;
/// Another function of the same shape, not a re-entry point.
const OTHER_ENTRY: u64 = 0x3780;
/// `huge`: `push rbp; sub rsp, 600000` (CFI: CFA = rsp + 600016 from +9, beyond what
/// the fast walk's frame rules take), calls the leaves and returns to `HUGE_RA`.
const HUGE: u64 = 0x3800;
const HUGE_RA: u64 = HUGE + 0x40;
/// `huge`'s CFA offset in its body.
const HUGE_CFA: u64 = 600_016;
const TEXT_END: u64 = 0x3900;

/// Stack pointer of every sample.
const SP: u64 = 0x7000_0000;

fn eh_frame() -> Vec<u8> {
    let fdes: [(u64, Vec<(u32, I)>); 5] = [
        (ROOT, vec![(0, I::Undefined(X86_64::RA))]),
        (
            TRAMP,
            vec![
                (4, I::CfaOffset(16)),
                (4, I::Offset(X86_64::RBX, -16)),
                (8, I::CfaRegister(X86_64::RBX)),
            ],
        ),
        (
            LEAF,
            vec![(4, I::CfaOffset(16)), (4, I::Offset(X86_64::RBX, -16))],
        ),
        (
            FP_CFI,
            vec![
                (1, I::CfaOffset(16)),
                (1, I::Offset(X86_64::RBP, -16)),
                (4, I::CfaRegister(X86_64::RBP)),
                // After `leave`, at the `ret`: gcc's CFI still names rbp's popped save slot.
                (0x90, I::Cfa(X86_64::RSP, 8)),
            ],
        ),
        (
            HUGE,
            vec![
                (1, I::CfaOffset(16)),
                (1, I::Offset(X86_64::RBP, -16)),
                (8, I::CfaOffset(HUGE_CFA as i32)),
            ],
        ),
    ];
    let mut fdes: Vec<_> = fdes
        .into_iter()
        .map(|(start, rows)| (start, 0x100, rows))
        .collect();
    // glibc's `clone3` shape: the parent's CFI ends at the system call; the child's
    // `thread_start` begins a few bytes later with the return address undefined.
    fdes.push((CLONE3_PARENT, CLONE3_SYSCALL - CLONE3_PARENT, vec![]));
    fdes.push((CLONE3_CHILD, 0x20, vec![(0, I::Undefined(X86_64::RA))]));
    eh_frame_rows(&fdes)
}

fn space() -> AddressSpace {
    let mut code = vec![0x90u8; (TEXT_END - TEXT) as usize];
    let mut put = |at: u64, bytes: &[u8]| {
        let o = (at - TEXT) as usize;
        code[o..o + bytes.len()].copy_from_slice(bytes);
    };
    // `call rel32` before each return address.
    put(ROOT_RA - 5, &[0xe8, 0, 0, 0, 0]);
    put(TRAMP_RA - 5, &[0xe8, 0, 0, 0, 0]);
    put(FP_NOCFI, &[0x55, 0x48, 0x89, 0xe5]);
    put(FP_CFI, &[0x55, 0x48, 0x89, 0xe5]);
    // fp_cfi calls itself and returns to `FP_CFI_RA`; `leave; ret` at +0x8f.
    put(FP_CFI_RA - 5, &[0xe8, 0, 0, 0, 0]);
    put(FP_CFI + 0x8f, &[0xc9, 0xc3]);
    put(BIG_FP, &[0x55, 0x48, 0x89, 0xe5]);
    put(CLONE3_SYSCALL, &[0x0f, 0x05]);
    put(HUGE_RA - 5, &[0xe8, 0, 0, 0, 0]);
    let module = SyntheticBinary::new(
        TEXT,
        &code,
        0x8000,
        &eh_frame(),
        &[
            (ROOT, ROOT + 0x100, "root"),
            (TRAMP, TRAMP + 0x100, "tramp"),
            (LEAF, LEAF + 0x100, "leaf"),
            (FP_NOCFI, FP_NOCFI + 0x100, "fp_nocfi"),
            (FP_CFI, FP_CFI + 0x100, "fp_cfi"),
            (CLONE3, CLONE3 + 0x100, "clone3"),
            (BIG_FP, BIG_FP + 0x2000, "big_fp"),
            (
                REENTRY,
                REENTRY + 0x80,
                "Builtins_InterpreterEnterAtNextBytecode",
            ),
            (OTHER_ENTRY, OTHER_ENTRY + 0x80, "other_entry"),
            (HUGE, HUGE + 0x100, "huge"),
        ],
    );
    let mut space = AddressSpace::new();
    space.add_region(Region::new(
        TEXT,
        TEXT_END,
        0,
        "synthetic".into(),
        Some(Arc::new(module)),
    ));
    space
}

/// Stack bytes from `SP`: `words[i]` at `SP + 8i`.
fn stack(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn unwind(space: &mut AddressSpace, regs: &Registers, words: &[u64]) -> (StackEnd, Vec<u64>) {
    let bytes = stack(words);
    let mut mem = SampleStack {
        base: SP,
        bytes: &bytes,
        fallback: None,
    };
    let mut out = Vec::new();
    let end = space.unwind_with_sps(regs, &mut mem, &mut out, None);
    (end, out)
}

fn regs(ip: u64, bp: u64, rbx: Option<u64>) -> Registers {
    let mut r = Registers::new(ip, SP, bp);
    if let Some(v) = rbx {
        r.set(regs::RBX, v);
    }
    r
}

/// The stack under a sample in `leaf` after its `push rbx`: leaf's frame (saved rbx, return
/// into tramp), tramp's frame (48 bytes of locals below its saved rbx), root's return address.
fn trampoline_stack() -> Vec<u64> {
    // tramp's CFA is SP + 80, so its rbx (CFA - 16) is SP + 64.
    let mut w = vec![SP + 64, TRAMP_RA];
    w.extend([0xbad; 6]);
    w.extend([0x1234, ROOT_RA]);
    w
}

#[test]
fn cfi_undefined_return_address_is_the_root() {
    let mut s = space();
    let (end, out) = unwind(&mut s, &regs(ROOT + 0x20, 0, None), &[0; 4]);
    assert_eq!((end, out), (StackEnd::Root, vec![ROOT + 0x20]));
    assert_eq!(s.full_register_unwinds(), 0);
}

#[test]
fn a_600_kb_frame_is_unwound_in_the_fast_walk() {
    // leaf (saved rbx, return into huge), huge's 600,000 bytes of locals, its saved rbp and
    // its return into root.
    let mut words = vec![0x77, HUGE_RA];
    let cfa = 16 + HUGE_CFA;
    words.resize((cfa / 8) as usize - 2, 0xbad);
    words.extend([0x1234, ROOT_RA]);
    let mut s = space();
    let (end, out) = unwind(&mut s, &regs(LEAF + 0x80, 0xdead, Some(7)), &words);
    assert_eq!(end, StackEnd::Root);
    assert_eq!(out, vec![LEAF + 0x80, HUGE_RA, ROOT_RA]);
    assert_eq!(
        s.full_register_unwinds(),
        0,
        "huge's frame runs as a frame rule, with no walk from the leaf with every register"
    );
    // Sampled in huge itself: the same rule for the leaf frame.
    let (end, out) = unwind(&mut s, &regs(HUGE + 0x20, 0xdead, None), &words[2..]);
    assert_eq!((end, out), (StackEnd::Root, vec![HUGE + 0x20, ROOT_RA]));
    assert_eq!(s.full_register_unwinds(), 0);
}

#[test]
fn frames_based_on_rbx_are_unwound_with_all_registers() {
    let mut s = space();
    let (end, out) = unwind(
        &mut s,
        &regs(LEAF + 0x80, 0xdead, Some(7)),
        &trampoline_stack(),
    );
    assert_eq!(end, StackEnd::Root);
    assert_eq!(out, vec![LEAF + 0x80, TRAMP_RA, ROOT_RA]);
    assert_eq!(s.full_register_unwinds(), 1, "restarted once from the leaf");
    // Twice: a remembered lookup must not turn the rbx row into a frame-pointer guess.
    let (end, out) = unwind(
        &mut s,
        &regs(LEAF + 0x80, 0xdead, Some(7)),
        &trampoline_stack(),
    );
    assert_eq!((end, out.len()), (StackEnd::Root, 3));
}

#[test]
fn a_sample_in_the_rbx_frame_itself_needs_the_sampled_rbx() {
    let mut s = space();
    // tramp after `mov rsp,rbx`: CFA = rbx + 16 = SP + 16.
    let words = [0x1234, ROOT_RA];
    let (end, out) = unwind(&mut s, &regs(TRAMP + 0x80, 0, Some(SP)), &words);
    assert_eq!((end, out), (StackEnd::Root, vec![TRAMP + 0x80, ROOT_RA]));
    // Without rbx the frame cannot be unwound: an explicit truncation, no frame-pointer guess.
    let (end, out) = unwind(&mut s, &regs(TRAMP + 0x80, 0, None), &words);
    assert_eq!(
        (end, out),
        (
            StackEnd::Truncated(TruncateReason::UnwindRuleMissing),
            vec![TRAMP + 0x80]
        )
    );
}

#[test]
fn an_unknown_register_after_a_frame_without_cfi_truncates() {
    let mut s = space();
    // fp_nocfi's body, called from tramp: its frame pointer chain gives the return address, but
    // rbx (which tramp's CFA needs) may have been changed by code without CFI.
    let words = [SP + 64, TRAMP_RA, 0, 0, 0, 0, 0, 0, 0x1234, ROOT_RA];
    let (end, out) = unwind(&mut s, &regs(FP_NOCFI + 0x20, SP, Some(SP + 64)), &words);
    assert_eq!(
        (end, out),
        (
            StackEnd::Truncated(TruncateReason::UnwindRuleMissing),
            vec![FP_NOCFI + 0x20, TRAMP_RA]
        )
    );
}

#[test]
fn a_return_into_v8s_interpreter_reentry_is_accepted_at_its_entry_only() {
    let mut s = space();
    // fp_nocfi's body returns into the re-entry builtin (a frame the deoptimizer materialized,
    // frame pointer at SP+32), whose caller is found through that frame pointer.
    let stack_to = |ra: u64| vec![SP + 32, ra, 0, 0, 0, ROOT_RA];
    let (end, out) = unwind(&mut s, &regs(FP_NOCFI + 0x20, SP, None), &stack_to(REENTRY));
    assert_eq!(
        (end, out),
        (StackEnd::Root, vec![FP_NOCFI + 0x20, REENTRY, ROOT_RA])
    );
    // Named at the builtin itself, not at the function before it.
    assert_eq!(s.instruction_frames(), &[1]);
    // Past its entry, or another function's entry: not after a call.
    for ra in [REENTRY + 4, OTHER_ENTRY] {
        let (end, out) = unwind(&mut s, &regs(FP_NOCFI + 0x20, SP, None), &stack_to(ra));
        assert_eq!(
            (end, out),
            (
                StackEnd::Truncated(TruncateReason::NotAfterCall),
                vec![FP_NOCFI + 0x20]
            )
        );
    }
}

#[test]
fn a_zero_frame_pointer_in_a_cfi_frame_is_not_a_root() {
    let mut s = space();
    // A frame-pointer rule cannot follow rbp = 0; the CFI says nothing of a root.
    let (end, out) = unwind(&mut s, &regs(FP_CFI + 0x80, 0, None), &[0; 4]);
    assert!(matches!(end, StackEnd::Truncated(_)), "{end:?}");
    assert_eq!(out, vec![FP_CFI + 0x80]);
}

#[test]
fn a_zero_return_address_in_a_cfi_frame_is_not_a_root() {
    let mut s = space();
    let (end, out) = unwind(&mut s, &regs(LEAF + 0x80, 0, None), &[0, 0, 0]);
    assert_eq!(end, StackEnd::Truncated(TruncateReason::NotAfterCall));
    assert_eq!(out, vec![LEAF + 0x80]);
}

#[test]
fn a_zero_frame_pointer_ends_the_stack_only_where_the_function_is_unknown() {
    let mut s = space();
    // fp_nocfi keeps a frame pointer: rbp = 0 in its body is a broken chain.
    let (end, _) = unwind(&mut s, &regs(FP_NOCFI + 0x20, 0, None), &[0; 4]);
    assert_eq!(end, StackEnd::Truncated(TruncateReason::BadFramePointer));
    // Far into a large function that keeps a frame pointer: still a broken chain.
    let (end, _) = unwind(&mut s, &regs(BIG_FP + 0x1800, 0, None), &[0; 4]);
    assert_eq!(end, StackEnd::Truncated(TruncateReason::BadFramePointer));
    // Code whose start is unknown: rbp = 0 is the ABI's outermost-frame mark.
    let (end, out) = unwind(&mut s, &regs(NAMELESS + 0x20, 0, None), &[0; 4]);
    assert_eq!((end, out), (StackEnd::Root, vec![NAMELESS + 0x20]));
}

#[test]
fn a_zero_return_address_without_cfi_ends_the_stack_only_where_a_root_may_be() {
    let mut s = space();
    let (end, _) = unwind(&mut s, &regs(FP_NOCFI + 0x20, SP, None), &[0, 0, 0]);
    assert_eq!(end, StackEnd::Truncated(TruncateReason::NotAfterCall));
    let (end, _) = unwind(&mut s, &regs(NAMELESS + 0x20, SP, None), &[0, 0, 0]);
    assert_eq!(end, StackEnd::Root);
}

#[test]
fn a_new_thread_in_clone3_ends_at_its_root() {
    let mut s = space();
    // clone3 past its start, without CFI or a prologue: undecidable, but it is where threads
    // begin.
    let (end, out) = unwind(&mut s, &regs(CLONE3 + 0x20, 0, None), &[0; 2]);
    assert_eq!((end, out), (StackEnd::Root, vec![CLONE3 + 0x20]));
    // The same code under another name is an explicit truncation.
    let (end, _) = unwind(&mut s, &regs(FP_NOCFI + 0x2, 0, None), &[]);
    assert!(matches!(end, StackEnd::Truncated(_)), "{end:?}");
}

#[test]
fn a_new_thread_right_after_the_clone3_system_call_is_at_its_root() {
    let mut s = space();
    let with = |pc: u64, rax: Option<u64>| {
        let mut r = regs(pc, 0x1234_5678, None);
        if let Some(v) = rax {
            r.set(regs::RAX, v);
        }
        r
    };
    // The child (the system call returned 0), anywhere between the system call and
    // `thread_start`: its fresh stack holds no return address.
    let garbage = [0x7fff_dead_beef, 0, 0];
    for pc in [CLONE3_SYSCALL + 2, CLONE3_SYSCALL + 5, CLONE3_CHILD - 1] {
        let (end, out) = unwind(&mut s, &with(pc, Some(0)), &garbage);
        assert_eq!((end, out), (StackEnd::Root, vec![pc]), "at {pc:#x}");
    }
    // The parent (the child's id, or -ENOSYS during the call), anywhere in the gap: its frame
    // is the one the CFI before the system call describes, even where the code alone would
    // suggest a frame pointer (rbp holds no frame here).
    let after = CLONE3_SYSCALL + 2;
    for (pc, rax) in [
        (after, 4242),
        (CLONE3_CHILD - 1, 4242),
        (after, (-38i64) as u64),
    ] {
        let (end, out) = unwind(&mut s, &with(pc, Some(rax)), &[ROOT_RA, 0, 0]);
        assert_eq!(
            (end, out),
            (StackEnd::Root, vec![pc, ROOT_RA]),
            "at {pc:#x}"
        );
    }
    // Without the result, the child's stack is no proof of a root.
    let (end, _) = unwind(&mut s, &with(after, None), &garbage);
    assert!(matches!(end, StackEnd::Truncated(_)), "{end:?}");
    // Where CFI describes the parent, rax may be 0 (the caller's, at the start): unwound as usual.
    let (end, out) = unwind(&mut s, &with(CLONE3_PARENT, Some(0)), &[ROOT_RA, 0, 0]);
    assert_eq!((end, out), (StackEnd::Root, vec![CLONE3_PARENT, ROOT_RA]));
}

/// Live memory that has changed since the sample: every word reads as `CHANGED`.
struct ChangedSince;

const CHANGED: u64 = 0x7777_0000;

impl MemoryReader for ChangedSince {
    fn read(&mut self, _addr: u64, buf: &mut [u8]) -> bool {
        for chunk in buf.chunks_mut(8) {
            chunk.copy_from_slice(&CHANGED.to_le_bytes()[..chunk.len()]);
        }
        true
    }
}

#[test]
fn a_save_slot_already_popped_is_never_read_from_live_memory() {
    let mut s = space();
    // Sampled at fp_cfi's `ret`, after `leave` popped the caller's rbp (SP + 16) into rbp. The
    // CFI row still says "rbp saved at CFA-16" = SP - 8, below the stack pointer: not in the copy,
    // and in the live process possibly overwritten since. The register holds the value.
    let words = stack(&[FP_CFI_RA, 0xbad, 0, ROOT_RA]);
    // Both walks: the fast one (rip/rsp/rbp) and the full-register evaluator's.
    for full in [false, true] {
        let mut live = ChangedSince;
        let mut mem = SampleStack {
            base: SP,
            bytes: &words,
            fallback: Some(&mut live),
        };
        let mut out = Vec::new();
        let end = if full {
            s.walk(
                true,
                regs(FP_CFI + 0x90, SP + 16, None),
                &mut mem,
                &mut crate::memory::NoObserver,
                &mut out,
                None,
            )
            .expect("the full walk always ends")
        } else {
            s.unwind_with_sps(
                &regs(FP_CFI + 0x90, SP + 16, None),
                &mut mem,
                &mut out,
                None,
            )
        };
        assert_eq!(
            (end, out),
            (StackEnd::Root, vec![FP_CFI + 0x90, FP_CFI_RA, ROOT_RA]),
            "full-register walk: {full}"
        );
    }
    assert_eq!(s.full_register_unwinds(), 0);
}

/// Precompiled code in anonymous memory (a ReadyToRun image the unwinder does not read).
const IMAGE: u64 = 0x10_0000;
const IMAGE_END: u64 = 0x10_1000;

/// A sample's memory in which the image at `IMAGE` was refused for the module budget and loads
/// when the unwinder asks (the budget has room now): from then on its methods are known.
struct ImageLoadsWhenAsked<'a> {
    stack: SampleStack<'a>,
    loaded: bool,
}

impl Memory for ImageLoadsWhenAsked<'_> {
    fn read_stack_u64(&mut self, addr: u64) -> Result<u64, ReadFailure> {
        self.stack.read_stack_u64(addr)
    }

    fn jit_rule(&mut self, lookup: u64, _leaf: bool) -> Option<Option<NoCfiRule>> {
        // A method without a frame of its own: the return address is at [sp].
        (self.loaded && (IMAGE..IMAGE_END).contains(&lookup)).then_some(Some(NoCfiRule::ReturnAtSp))
    }

    fn code_refused(&mut self, addr: u64) -> bool {
        self.loaded |= (IMAGE..IMAGE_END).contains(&addr);
        false
    }
}

#[test]
fn a_frame_in_an_image_loaded_as_it_is_reached_follows_its_method() {
    let mut s = space();
    s.add_region(Region::new(IMAGE, IMAGE_END, 0, "image.dll".into(), None));
    // Sampled in a precompiled method without a frame, called from fp_cfi's body (whose frame
    // pointer rbp still holds), itself called from root.
    let words = stack(&[FP_CFI_RA, 0xbad, 0, ROOT_RA]);
    let mut mem = ImageLoadsWhenAsked {
        stack: SampleStack {
            base: SP,
            bytes: &words,
            fallback: None,
        },
        loaded: false,
    };
    let mut out = Vec::new();
    let end = s.unwind_with_sps(&regs(IMAGE + 0x20, SP + 16, None), &mut mem, &mut out, None);
    // Not a frame-pointer guess, which would skip fp_cfi (its return address at [rbp + 8]).
    assert_eq!(
        (end, out),
        (StackEnd::Root, vec![IMAGE + 0x20, FP_CFI_RA, ROOT_RA])
    );
}

/// A sample's memory in a JVM whose perf map does not name the sampled code yet.
struct UnnamedJvmCode<'a> {
    stack: SampleStack<'a>,
}

impl Memory for UnnamedJvmCode<'_> {
    fn read_stack_u64(&mut self, addr: u64) -> Result<u64, ReadFailure> {
        self.stack.read_stack_u64(addr)
    }

    fn jit_code_unnamed(&mut self, addr: u64) -> bool {
        (IMAGE..IMAGE_END).contains(&addr)
    }
}

#[test]
fn code_a_jvm_has_not_named_yet_ends_the_stack_instead_of_a_guess() {
    let mut s = space();
    s.add_region(Region::new(IMAGE, IMAGE_END, 0, "[anon:jit]".into(), None));
    // Sampled after `pop rbp` in compiled code whose caller (fp_cfi's body) keeps its frame
    // pointer: a frame-pointer guess would skip that caller.
    let words = stack(&[FP_CFI_RA, 0xbad, 0, ROOT_RA]);
    let mut mem = UnnamedJvmCode {
        stack: SampleStack {
            base: SP,
            bytes: &words,
            fallback: None,
        },
    };
    let mut out = Vec::new();
    let end = s.unwind_with_sps(&regs(IMAGE + 0x20, SP + 16, None), &mut mem, &mut out, None);
    assert_eq!(
        (end, out),
        (
            StackEnd::Truncated(TruncateReason::NoUnwindInfo),
            vec![IMAGE + 0x20]
        )
    );
}

mod deoptimization;
mod osr;
