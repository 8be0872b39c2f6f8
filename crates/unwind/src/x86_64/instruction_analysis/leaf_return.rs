//! Where a leaf's return address is, found by executing the paths from the sampled instruction to
//! `ret` on symbolic values: the leaf's registers and the leaf's stack words.
//!
//! V8's builtins keep the return address in a register while they rearrange the stack:
//! `BaselineOutOfLinePrologue` pops it into `r15`, builds the frame of its baseline caller and
//! returns with `push r15; ret`; `BaselineLeaveFrame` and the drop of a call's arguments pop it
//! into `r8`, move `rsp` by the argument count (`lea rsp, [rsp+rbx*8]`) and push it back. Neither
//! the epilogue scan (which stops at the register) nor the prologue simulation can say where the
//! return address is there; the values that reach the final `ret` can: the leaf's value of a
//! register (the return address is in that register now) or the leaf's stack word at `[rsp+n]`.
//!
//! The caller's `rbp` is the value `rbp` holds at that `ret`. Where that is a frame the path
//! builds (`BaselineOutOfLinePrologue` before its `mov rbp, rsp`), the caller was stopped at the
//! call that begins its code and has pushed nothing ([`NoCfiRule::OutOfLinePrologue`]): its own
//! frame rule, which counts on that frame, would skip a frame. With the return address in a
//! register meanwhile (after `pop r15`) no rule is right and there is no answer.
//!
//! Every path is followed (both sides of conditional branches, direct jumps) within a budget;
//! the answer holds when the paths that reach a `ret` into one of the leaf's values agree. A path
//! returning into a value of its own making (`push rcx; ret`, a tail call), calls and anything
//! the model does not follow end a path without an answer. A jump out of the function (or
//! through a register) is a tail call: the callee returns to the value at `[rsp]`, as `ret`.

use std::collections::BTreeMap;

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess,
    OpKind, Register,
};

use super::NoCfiRule;
use super::decode::{is_sp, jump_to, jump_within, op0_is_rsp, writes};

/// Instructions decoded over all paths at most.
const MAX_INSTRUCTIONS: usize = 512;

/// A value as the path computes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value {
    /// The leaf's value of this register.
    Leaf(Register),
    /// The leaf's stack word at `[rsp + n]`.
    Stack(u32),
    /// The address leaf `rsp + n` (a frame pointer the path set: `mov rbp, rsp`), through
    /// which the path may read back words it pushed (`mov rbp, [rbp]`).
    Address(i64),
    /// Anything else.
    Other,
}

/// The machine state along one path.
#[derive(Debug, Clone)]
struct Machine {
    /// Registers the path changed (the others keep the leaf's value).
    regs: BTreeMap<Register, Value>,
    /// `rsp` minus the leaf's `rsp`, while known.
    rsp: Option<i64>,
    /// Stack words the path wrote, by offset from the leaf's `rsp`.
    written: BTreeMap<i64, Value>,
    /// Words pushed since `rsp` became unknown (the top last).
    floating: Vec<Value>,
}

impl Machine {
    fn reg(&self, r: Register) -> Value {
        let r = r.full_register();
        if is_sp(r) {
            // `rsp` moves: its value is no value of the leaf's.
            return Value::Other;
        }
        self.regs.get(&r).copied().unwrap_or(Value::Leaf(r))
    }

    fn word(&self, at: i64) -> Value {
        match self.written.get(&at) {
            Some(v) => *v,
            None if at >= 0 => u32::try_from(at).map_or(Value::Other, Value::Stack),
            None => Value::Other,
        }
    }

    fn push(&mut self, v: Value) {
        match &mut self.rsp {
            Some(x) => {
                *x -= 8;
                self.written.insert(*x, v);
            }
            None => self.floating.push(v),
        }
    }

    /// The word at `[rsp]`; None when it cannot be known.
    fn top(&self) -> Option<Value> {
        match self.rsp {
            Some(x) if self.floating.is_empty() => Some(self.word(x)),
            _ => self.floating.last().copied(),
        }
    }

    fn pop(&mut self) -> Value {
        if let Some(v) = self.floating.pop() {
            return v;
        }
        match &mut self.rsp {
            Some(x) => {
                let v = self.written.get(x).copied().unwrap_or_else(|| {
                    if *x >= 0 {
                        u32::try_from(*x).map_or(Value::Other, Value::Stack)
                    } else {
                        Value::Other
                    }
                });
                *x += 8;
                v
            }
            None => Value::Other,
        }
    }
}

/// How a path ends.
enum End {
    /// At a `ret` into this value, with `rbp` holding that value.
    Return(Value, Value),
    /// Without an answer.
    Unknown,
}

/// The leaf rule at offset `at` of `code` (bytes from the function's start) from the values its
/// paths return to (see the module documentation): [`NoCfiRule::ReturnInRegister`] or
/// [`NoCfiRule::ReturnAt`]. None when the paths tell nothing; `Some(None)` when they show the
/// return address in a register but the caller's `rbp` is not yet what the caller's frame rule
/// needs, so no rule is right (the stack ends there rather than skip a frame).
pub fn leaf_return(code: &[u8], at: usize) -> Option<Option<NoCfiRule>> {
    if at >= code.len() {
        return None;
    }
    let mut info = InstructionInfoFactory::new();
    let mut budget = MAX_INSTRUCTIONS;
    let start = Machine {
        regs: BTreeMap::new(),
        rsp: Some(0),
        written: BTreeMap::new(),
        floating: Vec::new(),
    };
    let mut pending = vec![(at, start)];
    let mut answer: Option<(Value, Value)> = None;
    let mut visited = std::collections::BTreeSet::new();
    while let Some((from, m)) = pending.pop() {
        if !visited.insert(from) {
            continue;
        }
        match follow(code, from, m, &mut pending, &mut budget, &mut info) {
            End::Return(ra @ (Value::Leaf(_) | Value::Stack(_)), bp) => {
                if answer.is_some_and(|a| a != (ra, bp)) {
                    return None;
                }
                answer = Some((ra, bp));
            }
            End::Return(..) | End::Unknown => {}
        }
    }
    let (ra, bp) = answer?;
    let saved_bp = match (bp, ra) {
        (Value::Leaf(Register::RBP), _) => None,
        (Value::Stack(n), _) => Some(n),
        // Returning with `rbp` pointed at a frame the path built on the stack for the caller
        // (`mov rbp, rsp`): an out-of-line prologue, before the frame is built.
        (Value::Address(_), Value::Stack(n)) => {
            return Some(Some(NoCfiRule::OutOfLinePrologue { ra: n }));
        }
        _ => return Some(None),
    };
    match ra {
        Value::Leaf(r) if saved_bp.is_none() => {
            Some(dwarf(r).map(|reg| NoCfiRule::ReturnInRegister { reg }))
        }
        Value::Leaf(_) => Some(None),
        Value::Stack(0) if saved_bp.is_none() => Some(Some(NoCfiRule::ReturnAtSp)),
        Value::Stack(n) => Some(Some(NoCfiRule::ReturnAt { ra: n, saved_bp })),
        Value::Address(_) | Value::Other => None,
    }
}

/// Follows one path from `from`, queueing the other sides of its conditional branches.
fn follow(
    code: &[u8],
    from: usize,
    mut m: Machine,
    pending: &mut Vec<(usize, Machine)>,
    budget: &mut usize,
    info: &mut InstructionInfoFactory,
) -> End {
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    if decoder.set_position(from).is_err() {
        return End::Unknown;
    }
    decoder.set_ip(from as u64);
    let mut instr = Instruction::default();
    loop {
        if *budget == 0 || !decoder.can_decode() {
            return End::Unknown;
        }
        *budget -= 1;
        decoder.decode_out(&mut instr);
        if instr.is_invalid() {
            return End::Unknown;
        }
        match instr.flow_control() {
            FlowControl::Return => {
                return match m.top() {
                    Some(v) => End::Return(v, m.reg(Register::RBP)),
                    None => End::Unknown,
                };
            }
            FlowControl::UnconditionalBranch if jump_within(&instr, code.len()).is_some() => {
                if !jump_within(&instr, code.len()).is_some_and(|t| jump_to(&mut decoder, t)) {
                    return End::Unknown;
                }
                continue;
            }
            // A tail call (out of the function, or through a register): the callee returns to
            // the address at `[rsp]`.
            // (Only a word of the leaf's stack counts: a register pushed before a jump is an
            // argument as often as a return address.)
            FlowControl::UnconditionalBranch | FlowControl::IndirectBranch => {
                return match m.top() {
                    Some(v @ Value::Stack(_)) => End::Return(v, m.reg(Register::RBP)),
                    _ => End::Unknown,
                };
            }
            FlowControl::ConditionalBranch => {
                if let Ok(target) = usize::try_from(instr.near_branch_target())
                    && target < code.len()
                {
                    pending.push((target, m.clone()));
                }
            }
            FlowControl::Next => {}
            _ => return End::Unknown,
        }
        if !execute(&mut m, &instr, info) {
            return End::Unknown;
        }
    }
}

/// Executes one straight-line instruction on `m`; false when the model cannot follow it.
fn execute(m: &mut Machine, instr: &Instruction, info: &mut InstructionInfoFactory) -> bool {
    let reg0 = (instr.op_count() > 0 && instr.op0_kind() == OpKind::Register)
        .then(|| instr.op0_register().full_register());
    match instr.mnemonic() {
        Mnemonic::Push => {
            let v = match instr.op0_kind() {
                OpKind::Register => m.reg(instr.op0_register()),
                OpKind::Memory if is_sp(instr.memory_base()) => match m.rsp {
                    Some(x) if instr.memory_index() == Register::None && m.floating.is_empty() => {
                        m.word(x + instr.memory_displacement64() as i64)
                    }
                    _ => Value::Other,
                },
                _ => Value::Other,
            };
            m.push(v);
            return true;
        }
        Mnemonic::Pop => {
            let Some(r) = reg0.filter(|r| !is_sp(*r)) else {
                return false;
            };
            let v = m.pop();
            m.regs.insert(r, v);
            return true;
        }
        Mnemonic::Add | Mnemonic::Sub | Mnemonic::Lea if op0_is_rsp(instr) => {
            let delta = match instr.mnemonic() {
                Mnemonic::Add | Mnemonic::Sub
                    if !matches!(instr.op1_kind(), OpKind::Register | OpKind::Memory) =>
                {
                    let imm = instr.immediate(1) as i64;
                    Some(if instr.mnemonic() == Mnemonic::Add {
                        imm
                    } else {
                        -imm
                    })
                }
                Mnemonic::Lea
                    if is_sp(instr.memory_base()) && instr.memory_index() == Register::None =>
                {
                    Some(instr.memory_displacement64() as i64)
                }
                Mnemonic::Lea if is_sp(instr.memory_base()) => None,
                _ => return false,
            };
            match (delta, &mut m.rsp) {
                (Some(d), Some(x)) if m.floating.is_empty() => *x += d,
                (Some(d), _) if d >= 0 && d % 8 == 0 => {
                    for _ in 0..d / 8 {
                        if m.floating.pop().is_none() {
                            break;
                        }
                    }
                }
                // Moved by an amount not known here: what was pushed is gone.
                _ => {
                    m.rsp = None;
                    m.floating.clear();
                }
            }
            return true;
        }
        _ => {}
    }
    if instr.stack_pointer_increment() != 0 || writes(instr, info, Register::RSP) {
        return false;
    }
    // Stores into the stack the model sees.
    if instr.op_count() == 2 && instr.op0_kind() == OpKind::Memory && is_sp(instr.memory_base()) {
        let (Some(x), Mnemonic::Mov, Register::None) =
            (m.rsp, instr.mnemonic(), instr.memory_index())
        else {
            return false;
        };
        if !m.floating.is_empty() {
            return false;
        }
        let v = match instr.op1_kind() {
            OpKind::Register => m.reg(instr.op1_register()),
            _ => Value::Other,
        };
        m.written
            .insert(x + instr.memory_displacement64() as i64, v);
        return true;
    }
    // Register copies and loads from the stack keep their values; other writes lose them.
    if instr.mnemonic() == Mnemonic::Mov
        && let Some(r) = reg0
        && r.is_gpr64()
        && instr.op0_register().is_gpr64()
    {
        let v = match instr.op1_kind() {
            OpKind::Register if is_sp(instr.op1_register()) => match m.rsp {
                Some(x) if m.floating.is_empty() => Value::Address(x),
                _ => Value::Other,
            },
            OpKind::Register if instr.op1_register().is_gpr64() => m.reg(instr.op1_register()),
            OpKind::Memory
                if is_sp(instr.memory_base())
                    && instr.memory_index() == Register::None
                    && m.floating.is_empty() =>
            {
                m.rsp.map_or(Value::Other, |x| {
                    m.word(x + instr.memory_displacement64() as i64)
                })
            }
            // A word the path can place: read through the frame pointer it set.
            OpKind::Memory if instr.memory_index() == Register::None => {
                match m.reg(instr.memory_base()) {
                    Value::Address(x) if m.floating.is_empty() => {
                        m.word(x + instr.memory_displacement64() as i64)
                    }
                    _ => Value::Other,
                }
            }
            _ => Value::Other,
        };
        m.regs.insert(r, v);
        return true;
    }
    for u in info.info(instr).used_registers() {
        if !matches!(
            u.access(),
            OpAccess::Read | OpAccess::CondRead | OpAccess::NoMemAccess
        ) {
            m.regs.insert(u.register().full_register(), Value::Other);
        }
    }
    true
}

/// The DWARF number of a 64-bit general-purpose register.
fn dwarf(r: Register) -> Option<u16> {
    Some(match r {
        Register::RAX => 0,
        Register::RDX => 1,
        Register::RCX => 2,
        Register::RBX => 3,
        Register::RSI => 4,
        Register::RDI => 5,
        Register::RBP => 6,
        Register::R8 => 8,
        Register::R9 => 9,
        Register::R10 => 10,
        Register::R11 => 11,
        Register::R12 => 12,
        Register::R13 => 13,
        Register::R14 => 14,
        Register::R15 => 15,
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
