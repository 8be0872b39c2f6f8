//! The epilogue scan (leaf frames of JIT code): forwards from the instruction pointer along the
//! fall-through path, adding up `pop`s and `add rsp, N` until a `ret` tells where the return
//! address and the caller's `rbp` are. See [`super::jit`] for when it applies.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind};

use super::decode::*;

/// Whether `code` starts with a return instruction.
pub(super) fn is_ret(code: &[u8]) -> bool {
    matches!(code, [0xc3, ..] | [0xf3, 0xc3, ..] | [0xc2, _, _, ..])
}

/// Scan 1: the state at the first instruction of `code`, from its path to a `ret`.
pub(super) fn epilogue_scan(code: &[u8]) -> Option<State> {
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut up: u32 = 0;
    let mut saved_bp = None;
    let mut instr = Instruction::default();
    for _ in 0..MAX_INSTRUCTIONS {
        if !decoder.can_decode() {
            return None;
        }
        decoder.decode_out(&mut instr);
        if instr.is_invalid() {
            return None;
        }
        // (In an OSR method the path to `ret` pops the Tier-0 frame too: the state is the
        // real caller's, and no OSR rule is needed.)
        let state = State {
            ra: up,
            saved_bp,
            fp: false,
            osr: false,
            sp_saved_at: None,
        };
        match instr.flow_control() {
            FlowControl::Return => return Some(state),
            // A jump after the frame is (partly) popped: a tail call, the callee returns for us.
            FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
                if up > 0 || saved_bp.is_some() =>
            {
                return Some(state);
            }
            FlowControl::Call | FlowControl::IndirectCall => continue,
            FlowControl::Next | FlowControl::ConditionalBranch => {}
            _ => return None,
        }
        match instr.mnemonic() {
            Mnemonic::Pop => {
                if instr.op_kind(0) != OpKind::Register || is_sp(instr.op0_register()) {
                    return None;
                }
                if is_rbp(instr.op0_register()) {
                    saved_bp = Some(up);
                }
                up = up.checked_add(8)?;
            }
            Mnemonic::Add if op0_is_rsp(&instr) => up = up.checked_add(imm(&instr)?)?,
            Mnemonic::Lea if op0_is_rsp(&instr) => up = up.checked_add(rsp_lea(&instr)?)?,
            _ if is_nop_lea(&instr) => {}
            // Saving the caller's `rbp` is prologue work: not a path to `ret` that tells.
            _ if rbp_store(&instr).is_some() => return None,
            _ if rbp_load(&instr).is_some() => {
                saved_bp = Some(up.checked_add(rbp_load(&instr)?)?);
            }
            _ => {
                if instr.stack_pointer_increment() != 0
                    || writes_sp_or_bp(&instr)
                    || instr.mnemonic() == Mnemonic::Leave
                {
                    return None;
                }
            }
        }
    }
    None
}
