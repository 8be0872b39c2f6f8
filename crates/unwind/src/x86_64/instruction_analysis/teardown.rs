//! The frame-teardown scan: whether the path from an instruction leaves its function through
//! the frame pointer (`mov rsp, rbp; pop rbp` or `leave`, then a return), in which case the
//! frame-pointer rule holds there exactly: the return address is the one at `[rbp+8]` and the
//! caller's `rbp` the one at `[rbp]`, whatever the code pushed or popped before.
//!
//! This decides frames whose prologue is not on the way from the function's start: V8's embedded
//! builtins (node) build their frame in deferred code only on slow paths (`LoadIC`,
//! `ReturnHandler`), or first pop the return address into a register and push it back after
//! setting up a frame on their caller's behalf (`BaselineOutOfLinePrologue`, which builds the
//! frame of the baseline code that calls it). The prologue simulation from the function's start
//! cannot see those frames; the path from the instruction to the return can.
//!
//! Every path from the instruction is followed (both sides of conditional branches, the targets
//! of direct jumps, over calls, within a budget of instructions): the rule holds when one path
//! returns through the frame pointer and none returns with `rbp` untouched (which would show that
//! `rbp` frames no frame of this function: code on a frameless path). Before the teardown `rsp`
//! may move freely (it is reset from `rbp`), but `rbp` and the frame's two slots may not be
//! written. After it, a small model of the slots under the return address follows the path: the
//! return address may be popped into a register, the arguments above it dropped (`add`/`lea rsp`)
//! and the register pushed back before `ret` (V8's `DropArguments`); arguments may be slid under
//! a copy of it before a jump (a tail call with stack arguments), or an address pushed and
//! returned into (`push rcx; ret`, a tail call whose callee returns to the address under it).
//! A path through anything else that touches `rsp` or `rbp` decides nothing.

use std::collections::BTreeSet;

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpKind,
    Register,
};

use super::decode::{is_sp, jump_to, jump_within, op0_is_rsp, writes};

/// Instructions decoded over all paths at most.
const MAX_INSTRUCTIONS: usize = 1024;

/// Where the path is relative to the frame's teardown.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// `rbp` is the frame pointer; `rsp` anywhere below it.
    Framed,
    /// `mov rsp, rbp` done: the saved `rbp` is at `[rsp]`.
    AtSavedBp,
    /// The frame is popped (see [`Popped`]).
    Popped(Popped),
}

/// What the path does with the stack once the frame is popped: the slots from the frame's return
/// address slot down to `rsp` (`true`: a copy of the return address), and the register holding a
/// copy, if any. Slots above the return address are the caller's and hold no copy.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Popped {
    slots: Vec<bool>,
    ra_register: Option<Register>,
}

impl Popped {
    fn new() -> Popped {
        Popped {
            slots: vec![true],
            ra_register: None,
        }
    }

    /// The slot `offset` bytes above `rsp` (None when past the modelled slots or unaligned).
    fn slot(&self, offset: u64) -> Option<usize> {
        if !offset.is_multiple_of(8) {
            return None;
        }
        let from_top = usize::try_from(offset / 8).ok()?;
        self.slots.len().checked_sub(from_top + 1)
    }

    /// Whether the code now returns to `[rsp]` holding a return-address copy.
    fn top_is_return(&self) -> bool {
        self.slots.last() == Some(&true)
    }
}

/// How one path from the instruction ends.
enum PathEnd {
    /// Through the frame pointer, as the rule needs.
    Proven,
    /// At a return with the frame still in place: `rbp` frames no frame of this function.
    NoFrame,
    /// Somewhere the scan does not follow (a path it leaves to the others).
    Unknown,
}

/// Whether the paths from offset `at` in `code` (bytes from the function's start, or from any
/// point before `at`, for jumps backwards) tear down a frame-pointer frame and return through
/// it (see the module documentation): at least one path does, and no path returns with the
/// frame in place.
pub fn frame_pointer_teardown(code: &[u8], at: usize) -> bool {
    if at >= code.len() {
        return false;
    }
    let mut scan = Scan {
        code,
        info: InstructionInfoFactory::new(),
        budget: MAX_INSTRUCTIONS,
        framed_seen: BTreeSet::new(),
        pending: vec![(at, Phase::Framed)],
    };
    let mut proven = false;
    while let Some((start, phase)) = scan.pending.pop() {
        match scan.follow(start, phase) {
            PathEnd::Proven => proven = true,
            PathEnd::NoFrame => return false,
            PathEnd::Unknown => {}
        }
    }
    proven
}

/// The state of one scan: the paths still to follow and what was seen.
struct Scan<'c> {
    code: &'c [u8],
    info: InstructionInfoFactory,
    /// Instructions left to decode over all paths.
    budget: usize,
    /// Offsets already reached with the frame in place (their paths are followed once).
    framed_seen: BTreeSet<usize>,
    /// Branch targets still to follow, with the phase there.
    pending: Vec<(usize, Phase)>,
}

impl Scan<'_> {
    /// Follows one path from `start`, queueing the targets of its conditional branches.
    fn follow(&mut self, start: usize, mut phase: Phase) -> PathEnd {
        let mut decoder = Decoder::with_ip(64, self.code, 0, DecoderOptions::NONE);
        if decoder.set_position(start).is_err() {
            return PathEnd::Unknown;
        }
        decoder.set_ip(start as u64);
        let mut instr = Instruction::default();
        loop {
            if self.budget == 0 || !decoder.can_decode() {
                return PathEnd::Unknown;
            }
            self.budget -= 1;
            let at = decoder.position();
            if phase == Phase::Framed && !self.framed_seen.insert(at) {
                return PathEnd::Unknown;
            }
            decoder.decode_out(&mut instr);
            if instr.is_invalid() {
                return PathEnd::Unknown;
            }
            match instr.flow_control() {
                FlowControl::Return => {
                    return match &phase {
                        // `ret`, or `push X; ret` (a tail call to X, which returns to the
                        // address under it).
                        Phase::Popped(p)
                            if p.top_is_return()
                                || p.slots.len() >= 2 && p.slots[p.slots.len() - 2] =>
                        {
                            PathEnd::Proven
                        }
                        Phase::Popped(_) => PathEnd::Unknown,
                        Phase::Framed | Phase::AtSavedBp => PathEnd::NoFrame,
                    };
                }
                FlowControl::UnconditionalBranch
                    if jump_within(&instr, self.code.len()).is_some() =>
                {
                    if !jump_within(&instr, self.code.len())
                        .is_some_and(|t| jump_to(&mut decoder, t))
                    {
                        return PathEnd::Unknown;
                    }
                    continue;
                }
                // A tail call: the callee returns to the address at `[rsp]`.
                FlowControl::UnconditionalBranch | FlowControl::IndirectBranch => {
                    return match &phase {
                        Phase::Popped(p) if p.top_is_return() => PathEnd::Proven,
                        _ => PathEnd::Unknown,
                    };
                }
                // A call returns with `rsp` and `rbp` as they were (both are callee-saved).
                FlowControl::Call | FlowControl::IndirectCall if phase == Phase::Framed => {
                    continue;
                }
                FlowControl::ConditionalBranch => {
                    if let Ok(target) = usize::try_from(instr.near_branch_target())
                        && target < self.code.len()
                    {
                        self.pending.push((target, phase.clone()));
                    }
                }
                FlowControl::Next => {}
                _ => return PathEnd::Unknown,
            }
            phase = match step(phase, &instr, &mut self.info) {
                Some(p) => p,
                None => return PathEnd::Unknown,
            };
        }
    }
}

/// The phase after one straight-line instruction; None when it breaks the pattern.
fn step(phase: Phase, instr: &Instruction, info: &mut InstructionInfoFactory) -> Option<Phase> {
    let writes_rbp = writes(instr, info, Register::RBP);
    let touches_rsp = instr.stack_pointer_increment() != 0 || writes(instr, info, Register::RSP);
    match phase {
        Phase::Framed => {
            if is_mov_rsp_rbp(instr) {
                return Some(Phase::AtSavedBp);
            }
            if instr.mnemonic() == Mnemonic::Leave {
                return Some(Phase::Popped(Popped::new()));
            }
            if writes_rbp || writes_frame_slot(instr) {
                return None;
            }
            // `rsp` is reset from `rbp` at the teardown: what happens to it before (pushes,
            // pops, the alignment for a C call and its undoing) does not matter.
            Some(Phase::Framed)
        }
        Phase::AtSavedBp => {
            if is_pop_of(instr, Register::RBP) {
                return Some(Phase::Popped(Popped::new()));
            }
            (!writes_rbp && !touches_rsp && !writes_rsp_slot(instr)).then_some(Phase::AtSavedBp)
        }
        Phase::Popped(p) => {
            if writes_rbp {
                return None;
            }
            popped_step(p, instr, info, touches_rsp).map(Phase::Popped)
        }
    }
}

/// One instruction after the frame is popped (see [`Popped`]).
fn popped_step(
    mut p: Popped,
    instr: &Instruction,
    info: &mut InstructionInfoFactory,
    touches_rsp: bool,
) -> Option<Popped> {
    let reg_op = (instr.op_count() > 0 && instr.op0_kind() == OpKind::Register)
        .then(|| instr.op0_register().full_register());
    match instr.mnemonic() {
        Mnemonic::Push => {
            let copy = match instr.op0_kind() {
                OpKind::Register => reg_op.is_some() && reg_op == p.ra_register,
                OpKind::Memory
                    if is_sp(instr.memory_base()) && instr.memory_index() == Register::None =>
                {
                    p.slot(instr.memory_displacement64())
                        .is_some_and(|i| p.slots[i])
                }
                _ => false,
            };
            p.slots.push(copy);
            return Some(p);
        }
        Mnemonic::Pop => {
            let r = reg_op.filter(|r| r.is_gpr64() && !is_sp(*r))?;
            let top = p.slots.pop()?;
            if top {
                p.ra_register = Some(r);
            } else if p.ra_register == Some(r) {
                p.ra_register = None;
            }
            return Some(p);
        }
        Mnemonic::Add | Mnemonic::Lea if op0_is_rsp(instr) => {
            // Dropping slots (arguments above a return address kept in a register).
            let drop = match instr.mnemonic() {
                Mnemonic::Add if instr.op1_kind() != OpKind::Register => {
                    Some(instr.immediate(1) as i64)
                }
                Mnemonic::Add => None,
                _ if !is_sp(instr.memory_base()) => return None,
                _ if instr.memory_index() == Register::None => {
                    Some(instr.memory_displacement64() as i64)
                }
                _ => None,
            };
            let keep = match drop {
                Some(d) if d >= 0 && d % 8 == 0 => {
                    p.slots.len().saturating_sub(usize::try_from(d / 8).ok()?)
                }
                Some(_) => return None,
                // An amount not known here (`lea rsp, [rsp+rbx*8]`): every modelled slot goes.
                None => 0,
            };
            if p.slots[keep..].iter().any(|&copy| copy) && p.ra_register.is_none() {
                // The only copy of the return address dropped.
                return None;
            }
            p.slots.truncate(keep);
            return Some(p);
        }
        _ => {}
    }
    if touches_rsp {
        return None;
    }
    if let Some(r) = p.ra_register
        && writes(instr, info, r)
    {
        p.ra_register = None;
    }
    // A store into a modelled slot: `mov [rsp+k], reg`.
    if instr.op_count() == 2
        && instr.op0_kind() == OpKind::Memory
        && is_sp(instr.memory_base())
        && instr.mnemonic() == Mnemonic::Mov
    {
        if instr.memory_index() != Register::None {
            return None;
        }
        let i = p.slot(instr.memory_displacement64())?;
        p.slots[i] = instr.op1_kind() == OpKind::Register
            && Some(instr.op1_register().full_register()) == p.ra_register;
    } else if writes_rsp_slot(instr) {
        return None;
    }
    Some(p)
}

/// `mov rsp, rbp`.
fn is_mov_rsp_rbp(instr: &Instruction) -> bool {
    instr.mnemonic() == Mnemonic::Mov
        && op0_is_rsp(instr)
        && instr.op1_kind() == OpKind::Register
        && instr.op1_register() == Register::RBP
}

fn is_pop_of(instr: &Instruction, reg: Register) -> bool {
    instr.mnemonic() == Mnemonic::Pop
        && instr.op0_kind() == OpKind::Register
        && instr.op0_register() == reg
}

/// A store to memory addressed from `rsp` other than a plain `mov` (which the model follows).
fn writes_rsp_slot(instr: &Instruction) -> bool {
    instr.op_count() > 0
        && instr.op0_kind() == OpKind::Memory
        && is_sp(instr.memory_base())
        && !matches!(instr.mnemonic(), Mnemonic::Cmp | Mnemonic::Test)
}

/// A store to `[rbp]` or `[rbp+8]`, the frame's saved `rbp` and return address.
fn writes_frame_slot(instr: &Instruction) -> bool {
    (0..instr.op_count()).any(|i| {
        instr.op_kind(i) == OpKind::Memory
            && instr.memory_base() == Register::RBP
            && instr.memory_index() == Register::None
            && matches!(instr.memory_displacement64(), 0 | 8)
            && i == 0
            && !matches!(
                instr.mnemonic(),
                Mnemonic::Cmp | Mnemonic::Test | Mnemonic::Push
            )
    })
}

#[cfg(test)]
mod tests;
