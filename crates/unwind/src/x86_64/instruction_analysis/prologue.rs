//! Prologues: the byte pattern of a standard frame-pointer prologue (native code), and the
//! prologue simulation (JIT code): forwards from a function's start up to an instruction,
//! tracking how far the return address lies above `rsp` and whether `rbp` is a frame pointer.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register};

use super::decode::*;

pub(super) const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// Offsets within a standard frame-pointer prologue: `[endbr64] push %rbp; mov %rsp,%rbp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FpPrologue {
    /// Offset of the `push %rbp`.
    pub(super) push: usize,
    /// Offset just past the `mov %rsp,%rbp`.
    pub(super) body: usize,
}

pub(super) fn fp_prologue(code: &[u8]) -> Option<FpPrologue> {
    let push = if code.starts_with(&ENDBR64) { 4 } else { 0 };
    if *code.get(push)? != 0x55 {
        return None;
    }
    let mov = code.get(push + 1..push + 4)?;
    (mov == [0x48, 0x89, 0xe5] || mov == [0x48, 0x8b, 0xec]).then_some(FpPrologue {
        push,
        body: push + 4,
    })
}

/// Scan 2: the state at `target` (an offset from the function's start), from the prologue.
pub(super) fn prologue_state(code: &[u8], target: usize) -> Option<State> {
    simulate(code, target, true)
}

/// The frame a Tier-0 .NET method keeps from the end of its prologue on: the offsets of its
/// return address and of the saved caller's `rbp` above `rsp` there. Tier-0 code always keeps a
/// frame pointer and a fixed frame; None for anything else.
pub(super) fn fixed_frame(code: &[u8]) -> Option<(u32, u32)> {
    let s = simulate(code, usize::MAX, false)?;
    (s.fp && !s.osr).then_some((s.ra, s.saved_bp?))
}

/// The length of a .NET On-Stack-Replacement method's entry, `mov reg, [rbp]; push reg` (the
/// Tier-0 frame's saved `rbp`, i.e. the caller's, copied into the OSR frame), when `code` starts
/// with one. On entry `rbp` is still the Tier-0 method's frame pointer.
fn osr_entry(code: &[u8]) -> Option<usize> {
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let load = decoder.decode();
    let push = decoder.decode();
    let copies_callers_bp = load.mnemonic() == Mnemonic::Mov
        && load.op_count() == 2
        && load.op_kind(0) == OpKind::Register
        && load.op0_register().is_gpr64()
        && !is_rbp(load.op0_register())
        && !is_sp(load.op0_register())
        && load.op_kind(1) == OpKind::Memory
        && load.memory_base() == Register::RBP
        && load.memory_index() == Register::None
        && load.memory_displacement64() == 0;
    (copies_callers_bp
        && push.mnemonic() == Mnemonic::Push
        && push.op_kind(0) == OpKind::Register
        && push.op0_register() == load.op0_register())
    .then_some(load.len())
}

/// The prologue simulation, up to `target`; with `stop_at_fp`, it stops as soon as a frame
/// pointer is set (the frame is known from there on), else it goes on to the prologue's end.
fn simulate(code: &[u8], target: usize, stop_at_fp: bool) -> Option<State> {
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut s = INITIAL;
    let osr_push = osr_entry(code);
    s.osr = osr_push.is_some();
    let mut instr = Instruction::default();
    // A copy of `rsp` in another register (`mov r10, rsp`) and the state then; after an
    // alignment (`and rsp, -16`), the state relative to that copy until the code saves it on
    // the stack (V8's `PrepareCallCFunction`: see `NoCfiRule::ReturnAtSavedSp`).
    let mut sp_copy: Option<(Register, State)> = None;
    let mut aligned = false;
    // Where the conditional branch just decoded lands.
    let mut branch_lands: Option<u64> = None;
    for _ in 0..MAX_INSTRUCTIONS {
        let at = decoder.position();
        if at == target || s.fp && stop_at_fp {
            // At the target, or past the prologue of a frame-pointer function (not between an
            // alignment and the save of the stack pointer it lost).
            return (!aligned).then_some(s);
        }
        if at > target {
            // The target is not on an instruction boundary.
            return None;
        }
        if !decoder.can_decode() {
            // The bytes end inside straight-line code: the state stays what the prologue built.
            return Some(s);
        }
        decoder.decode_out(&mut instr);
        if instr.is_invalid() {
            return None;
        }
        let after_branch = std::mem::replace(
            &mut branch_lands,
            (instr.flow_control() == FlowControl::ConditionalBranch)
                .then(|| instr.near_branch_target()),
        );
        let down = match instr.mnemonic() {
            Mnemonic::Push => Some(8),
            Mnemonic::Sub if op0_is_rsp(&instr) => Some(imm(&instr)?),
            Mnemonic::Lea if op0_is_rsp(&instr) => {
                if !is_sp(instr.memory_base()) || instr.memory_index() != Register::None {
                    return None;
                }
                let d = instr.memory_displacement64() as i64;
                if d > 0 {
                    // An upward move: an epilogue, the prologue is over.
                    return Some(s);
                }
                Some(u32::try_from(-d).ok()?)
            }
            _ => None,
        };
        if is_nop_lea(&instr) {
            continue;
        }
        if let Some(d) = rbp_store(&instr).filter(|_| s.sp_saved_at.is_none()) {
            s.saved_bp.get_or_insert(d);
            continue;
        }
        if let Some(n) = down {
            if aligned {
                return None;
            }
            if let Some(slot) = s.sp_saved_at.as_mut() {
                // Below the aligned stack pointer: only the save slot moves away.
                *slot = slot.checked_add(n)?;
                continue;
            }
            s.ra = s.ra.checked_add(n)?;
            s.saved_bp = s.saved_bp.map(|b| b + n);
            let pushes_callers_bp = op0_is_rbp(&instr) || osr_push == Some(at);
            if instr.mnemonic() == Mnemonic::Push && pushes_callers_bp && s.saved_bp.is_none() {
                s.saved_bp = Some(0);
            }
            continue;
        }
        if let Some((reg, copied)) = sp_copy {
            if instr.mnemonic() == Mnemonic::And && op0_is_rsp(&instr) && aligns_down(&instr) {
                aligned = true;
                s = copied;
                continue;
            }
            if aligned && sp_store(&instr) == Some(reg) {
                s.sp_saved_at = Some(u32::try_from(instr.memory_displacement64() as i64).ok()?);
                aligned = false;
                sp_copy = None;
                continue;
            }
            if instr.op_count() > 0
                && instr.op_kind(0) == OpKind::Register
                && instr.op0_register() == reg
            {
                // The copy is overwritten.
                if aligned {
                    return None;
                }
                sp_copy = None;
            }
        }
        if s.sp_saved_at.is_none()
            && instr.mnemonic() == Mnemonic::Mov
            && instr.op_count() == 2
            && instr.op_kind(0) == OpKind::Register
            && instr.op0_register().is_gpr64()
            && !is_sp(instr.op0_register())
            && !is_rbp(instr.op0_register())
            && instr.op_kind(1) == OpKind::Register
            && is_sp(instr.op1_register())
        {
            sp_copy = Some((instr.op0_register(), s));
            continue;
        }
        if op0_is_rbp(&instr) && instr.op0_register() == Register::RBP {
            let frame_at = match instr.mnemonic() {
                Mnemonic::Mov
                    if instr.op_kind(1) == OpKind::Register && is_sp(instr.op1_register()) =>
                {
                    Some(0)
                }
                Mnemonic::Lea
                    if is_sp(instr.memory_base()) && instr.memory_index() == Register::None =>
                {
                    u32::try_from(instr.memory_displacement64() as i64).ok()
                }
                _ => None,
            };
            if frame_at.is_some() && frame_at == s.saved_bp {
                s.fp = true;
                continue;
            }
        }
        let flow_ends = !matches!(
            instr.flow_control(),
            FlowControl::Next | FlowControl::ConditionalBranch
        );
        let epilogue = matches!(instr.mnemonic(), Mnemonic::Pop | Mnemonic::Leave)
            || instr.mnemonic() == Mnemonic::Add && op0_is_rsp(&instr)
            || instr.mnemonic() == Mnemonic::Mov && op0_is_rsp(&instr);
        if flow_ends || epilogue {
            if at == 0 && instr.mnemonic() == Mnemonic::Call && padding_follows(&mut decoder) {
                // HotSpot's on-stack-replacement code: its normal entry is a call to a stub
                // that never returns here, padded to the OSR entry, whose prologue follows.
                if decoder.position() > target {
                    return Some(s);
                }
                continue;
            }
            if s == INITIAL
                && instr.flow_control() == FlowControl::UnconditionalBranch
                && let Some(landing) = after_branch
            {
                // An entry check that jumps away on a mismatch, jumped over on a match, with
                // nothing pushed on either path (HotSpot's inline-cache check before a native
                // wrapper's verified entry: `cmp rax, r10; je verified; jmp ic_miss; nop…`): the
                // simulation goes on where the branch lands, past the padding.
                let _ = decoder.set_position(usize::try_from(instr.next_ip()).ok()?);
                padding_follows(&mut decoder);
                if decoder.position() as u64 == landing {
                    continue;
                }
                return Some(s);
            }
            if s == INITIAL && instr.mnemonic() == Mnemonic::Call {
                // A call before anything was pushed: an out-of-line prologue (V8's baseline code
                // calls a builtin that pushes `rbp` and sets it). A function that calls must move
                // `rsp` first (the call would misalign the stack otherwise), so this is no frameless
                // caller.
                s.fp = true;
            }
            return Some(s);
        }
        if op0_is_rsp(&instr) || instr.stack_pointer_increment() != 0 {
            // An `rsp` change not modelled (e.g. `and rsp, -16`): no guess.
            return None;
        }
        if op0_is_rbp(&instr) && s.saved_bp.is_none() && writes_sp_or_bp(&instr) {
            // `rbp` overwritten before the caller's value was saved.
            return None;
        }
    }
    Some(s)
}

/// `and rsp, -2^k`: the stack pointer aligned down.
fn aligns_down(i: &Instruction) -> bool {
    i.op_count() == 2
        && !matches!(i.op_kind(1), OpKind::Register | OpKind::Memory)
        && (i.immediate(1) as i64) < 0
        && (i.immediate(1) as i64).unsigned_abs().is_power_of_two()
}

/// `mov [rsp+d], reg`: the register stored.
fn sp_store(i: &Instruction) -> Option<Register> {
    (i.mnemonic() == Mnemonic::Mov
        && i.op_count() == 2
        && i.op_kind(0) == OpKind::Memory
        && is_sp(i.memory_base())
        && i.memory_index() == Register::None
        && i.op_kind(1) == OpKind::Register)
        .then(|| i.op1_register())
}

/// Skips the `nop`s that follow (alignment padding); whether there was at least one.
fn padding_follows(decoder: &mut Decoder<'_>) -> bool {
    let mut any = false;
    let mut instr = Instruction::default();
    while decoder.can_decode() {
        let at = decoder.position();
        decoder.decode_out(&mut instr);
        if instr.mnemonic() != Mnemonic::Nop {
            // Back to the first instruction after the padding.
            let _ = decoder.set_position(at);
            break;
        }
        any = true;
    }
    any
}

#[cfg(test)]
mod tests;
