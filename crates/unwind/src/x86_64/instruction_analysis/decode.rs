//! What the prologue simulation and the epilogue scan share: the frame state they compute and
//! the instruction predicates they test.

use iced_x86::{
    Decoder, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register,
};

use super::{NoCfiRule, OsrSlot};

/// Instructions examined by one scan at most.
pub(super) const MAX_INSTRUCTIONS: usize = 96;

/// Where the return address and caller's `rbp` are relative to the current `rsp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct State {
    /// Bytes between `rsp` and the return address.
    pub(super) ra: u32,
    /// Bytes between `rsp` and the saved caller's `rbp`, once pushed.
    pub(super) saved_bp: Option<u32>,
    /// `rbp` points at its saved copy: a standard frame pointer.
    pub(super) fp: bool,
    /// A .NET On-Stack-Replacement method (see [`NoCfiRule::Osr`]).
    pub(super) osr: bool,
    /// The stack pointer was aligned down: `ra` and `saved_bp` are relative to the stack pointer
    /// from before, saved at `[rsp + slot]` (see [`NoCfiRule::ReturnAtSavedSp`]).
    pub(super) sp_saved_at: Option<u32>,
}

/// The state at a function's first instruction.
pub(super) const INITIAL: State = State {
    ra: 0,
    saved_bp: None,
    fp: false,
    osr: false,
    sp_saved_at: None,
};

impl State {
    pub(super) fn rule(self) -> NoCfiRule {
        if self.osr {
            let slot = if self.fp {
                OsrSlot::Bp(8)
            } else {
                OsrSlot::Sp(self.ra)
            };
            return NoCfiRule::Osr { slot };
        }
        if self.fp {
            return NoCfiRule::FramePointer;
        }
        if let Some(slot) = self.sp_saved_at {
            return NoCfiRule::ReturnAtSavedSp {
                slot,
                ra: self.ra,
                saved_bp: self.saved_bp,
            };
        }
        match (self.ra, self.saved_bp) {
            (0, None) => NoCfiRule::ReturnAtSp,
            (ra, saved_bp) => NoCfiRule::ReturnAt { ra, saved_bp },
        }
    }
}

pub(super) fn is_sp(r: Register) -> bool {
    matches!(r, Register::RSP | Register::ESP | Register::SP)
}

pub(super) fn is_rbp(r: Register) -> bool {
    matches!(
        r,
        Register::RBP | Register::EBP | Register::BP | Register::BPL
    )
}

/// Whether the instruction writes `rsp` or `rbp` in a way neither scan models.
pub(super) fn writes_sp_or_bp(i: &Instruction) -> bool {
    if i.op_count() == 0 || i.op_kind(0) != OpKind::Register {
        return false;
    }
    let r = i.op0_register();
    (is_sp(r) || is_rbp(r))
        && !matches!(
            i.mnemonic(),
            Mnemonic::Cmp | Mnemonic::Test | Mnemonic::Push
        )
}

pub(super) fn imm(i: &Instruction) -> Option<u32> {
    (i.op_count() == 2 && i.op_kind(1) != OpKind::Register && i.op_kind(1) != OpKind::Memory)
        .then(|| i.immediate(1))
        .and_then(|v| u32::try_from(v).ok())
}

/// `lea rsp, [rsp+N]` with N ≥ 0: N.
pub(super) fn rsp_lea(i: &Instruction) -> Option<u32> {
    if !is_sp(i.memory_base()) || i.memory_index() != Register::None {
        return None;
    }
    u32::try_from(i.memory_displacement64() as i64).ok()
}

/// `lea reg, [reg+0]` (a multi-byte no-op some JITs pad with).
pub(super) fn is_nop_lea(i: &Instruction) -> bool {
    i.mnemonic() == Mnemonic::Lea
        && i.memory_base() == i.op0_register()
        && i.memory_index() == Register::None
        && i.memory_displacement64() == 0
}

/// `mov [rsp+d], rbp` (d ≥ 0): a save of the caller's `rbp` in a frameless prologue.
pub(super) fn rbp_store(i: &Instruction) -> Option<u32> {
    (i.mnemonic() == Mnemonic::Mov
        && i.op_count() == 2
        && i.op_kind(0) == OpKind::Memory
        && is_sp(i.memory_base())
        && i.memory_index() == Register::None
        && i.op_kind(1) == OpKind::Register
        && i.op1_register() == Register::RBP)
        .then(|| u32::try_from(i.memory_displacement64() as i64).ok())
        .flatten()
}

/// `mov rbp, [rsp+d]` (d ≥ 0): the caller's `rbp` restored from a save slot.
pub(super) fn rbp_load(i: &Instruction) -> Option<u32> {
    (i.mnemonic() == Mnemonic::Mov
        && i.op_count() == 2
        && i.op_kind(0) == OpKind::Register
        && i.op0_register() == Register::RBP
        && i.op_kind(1) == OpKind::Memory
        && is_sp(i.memory_base())
        && i.memory_index() == Register::None)
        .then(|| u32::try_from(i.memory_displacement64() as i64).ok())
        .flatten()
}

pub(super) fn op0_is_rsp(i: &Instruction) -> bool {
    i.op_count() > 0 && i.op_kind(0) == OpKind::Register && is_sp(i.op0_register())
}

pub(super) fn op0_is_rbp(i: &Instruction) -> bool {
    i.op_count() > 0 && i.op_kind(0) == OpKind::Register && is_rbp(i.op0_register())
}

/// Whether `instr` writes `reg` (any part of it).
pub(super) fn writes(
    instr: &Instruction,
    info: &mut InstructionInfoFactory,
    reg: Register,
) -> bool {
    info.info(instr).used_registers().iter().any(|u| {
        u.register().full_register() == reg
            && !matches!(
                u.access(),
                OpAccess::Read | OpAccess::CondRead | OpAccess::NoMemAccess
            )
    })
}

/// The target of `instr` when it is a direct jump within the `code_len` bytes decoded (the
/// scans follow those; any other jump leaves the function).
pub(super) fn jump_within(instr: &Instruction, code_len: usize) -> Option<u64> {
    (instr.flow_control() == FlowControl::UnconditionalBranch
        && instr.op0_kind() == OpKind::NearBranch64
        && usize::try_from(instr.near_branch_target()).is_ok_and(|t| t < code_len))
    .then(|| instr.near_branch_target())
}

/// Moves `decoder` to `target` (an offset in its code, which starts at address 0); false when
/// it cannot.
pub(super) fn jump_to(decoder: &mut Decoder<'_>, target: u64) -> bool {
    let Ok(position) = usize::try_from(target) else {
        return false;
    };
    if decoder.set_position(position).is_err() {
        return false;
    }
    decoder.set_ip(target);
    true
}
