//! Full-register evaluation of one CFI row with gimli: the slow path for rows that need more
//! than rip, rsp and rbp (see [`super::cfi`]); and reading a row's [`FrameRule`] for the fast
//! walk.
//!
//! Every general-purpose register is carried from frame to frame: a register the row restores
//! gets its saved value, a callee-saved register without a rule keeps its value, and every
//! other register becomes unknown. A CFA or return address that needs an unknown register ends
//! the stack with [`TruncateReason::UnwindRuleMissing`]; nothing is guessed.

use gimli::{
    BaseAddresses, CfaRule, EndianSlice, Evaluation, EvaluationResult, LittleEndian, Location,
    Piece, Register, RegisterRule, UnwindContext, UnwindExpression, UnwindSection, UnwindTableRow,
    Value, X86_64,
};

use crate::fde_rules::FdeRules;
use crate::frame_rule::FrameRule;
use crate::memory::Memory;
use crate::policy::{self, TruncateReason};
use crate::regs::{self, Registers};
use crate::sections::UnwindSections;

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// Reusable gimli state for evaluating rows.
pub struct Evaluator {
    ctx: Box<UnwindContext<usize>>,
}

impl Default for Evaluator {
    fn default() -> Self {
        Evaluator {
            ctx: Box::new(UnwindContext::new()),
        }
    }
}

/// Where one row comes from: a module, its section, the link-time lookup address.
#[derive(Clone, Copy)]
pub struct RowAt<'m> {
    /// The unwind sections of the binary whose CFI covers the address.
    pub sections: &'m UnwindSections,
    /// `.debug_frame` (true) or `.eh_frame`.
    pub debug: bool,
    /// The link-time lookup address (the instruction pointer, or a return address minus one).
    pub svma: u64,
}

impl Evaluator {
    /// Unwinds one frame (`first`: the sampled instruction's): moves `regs` to the caller and
    /// returns its return address, or `Ok(None)` when the row marks the return address undefined
    /// (the thread's root).
    pub fn step(
        &mut self,
        at: RowAt<'_>,
        first: bool,
        regs: &mut Registers,
        mem: &mut dyn Memory,
    ) -> Result<Option<u64>, TruncateReason> {
        self.with_row(at, |row, section| eval_row(row, section, first, regs, mem))
    }

    /// The [`FrameRule`] of the row at `at`, when it has that shape (None also when the row
    /// cannot be read). The walk takes its rules from [`Evaluator::fde_rules`]; this lookup of
    /// one row is the reference the tests hold those to.
    pub fn frame_rule(&mut self, at: RowAt<'_>) -> Option<FrameRule> {
        self.with_row(at, |row, _| Ok(FrameRule::of_row(row)))
            .ok()
            .flatten()
    }

    /// The [`FrameRule`]s of every row of the FDE covering `at.svma` (None when the FDE
    /// cannot be read; no rule anywhere in it when one of its rows cannot be read, as
    /// [`crate::cfi::CfiIndex::row_class`] then gives the whole FDE to the full-register
    /// evaluator).
    pub fn fde_rules(&mut self, at: RowAt<'_>) -> Option<FdeRules> {
        let offset = at.sections.cfi(at.debug).fde_at(at.svma)?;
        let bases = at.sections.cfi_bases(at.debug);
        if at.debug {
            let section = at.sections.debug_frame_section()?;
            rules_in(&section, &bases, offset, &mut self.ctx)
        } else {
            let section = at.sections.eh_frame_section()?;
            rules_in(&section, &bases, offset, &mut self.ctx)
        }
    }

    fn with_row<T>(
        &mut self,
        at: RowAt<'_>,
        f: impl FnOnce(&UnwindTableRow<usize>, &dyn Section<'_>) -> Result<T, TruncateReason>,
    ) -> Result<T, TruncateReason> {
        let offset = at
            .sections
            .cfi(at.debug)
            .fde_at(at.svma)
            .ok_or(TruncateReason::CfiError)?;
        let bases = at.sections.cfi_bases(at.debug);
        if at.debug {
            let section = at
                .sections
                .debug_frame_section()
                .ok_or(TruncateReason::CfiError)?;
            row_in(&section, &bases, offset, at.svma, &mut self.ctx, f)
        } else {
            let section = at
                .sections
                .eh_frame_section()
                .ok_or(TruncateReason::CfiError)?;
            row_in(&section, &bases, offset, at.svma, &mut self.ctx, f)
        }
    }
}

/// A CFI section, as far as expressions need it.
trait Section<'a> {
    fn expression(&self, e: &UnwindExpression<usize>) -> Option<gimli::Expression<Slice<'a>>>;
}

impl<'a, S: UnwindSection<Slice<'a>>> Section<'a> for S {
    fn expression(&self, e: &UnwindExpression<usize>) -> Option<gimli::Expression<Slice<'a>>> {
        e.get(self).ok()
    }
}

fn row_in<'a, S, T>(
    section: &S,
    bases: &BaseAddresses,
    offset: usize,
    svma: u64,
    ctx: &mut UnwindContext<usize>,
    f: impl FnOnce(&UnwindTableRow<usize>, &dyn Section<'a>) -> Result<T, TruncateReason>,
) -> Result<T, TruncateReason>
where
    S: UnwindSection<Slice<'a>>,
{
    let fde = section
        .fde_from_offset(bases, S::Offset::from(offset), S::cie_from_offset)
        .map_err(|_| TruncateReason::CfiError)?;
    let row = fde
        .unwind_info_for_address(section, bases, ctx, svma)
        .map_err(|_| TruncateReason::CfiError)?;
    f(row, section)
}

/// Every row's rule of the FDE at `offset` in `section` (none when a row cannot be read).
fn rules_in<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    offset: usize,
    ctx: &mut UnwindContext<usize>,
) -> Option<FdeRules>
where
    S: UnwindSection<Slice<'a>>,
{
    let fde = section
        .fde_from_offset(bases, S::Offset::from(offset), S::cie_from_offset)
        .ok()?;
    let mut table = fde.rows(section, bases, ctx).ok()?;
    let mut rows = Vec::new();
    loop {
        match table.next_row() {
            Ok(Some(row)) => rows.push((
                row.start_address(),
                row.end_address(),
                FrameRule::of_row(row),
            )),
            Ok(None) => return Some(FdeRules::from_rows(rows.into_iter())),
            Err(_) => return Some(FdeRules::default()),
        }
    }
}

fn eval_row(
    row: &UnwindTableRow<usize>,
    section: &dyn Section<'_>,
    first: bool,
    regs: &mut Registers,
    mem: &mut dyn Memory,
) -> Result<Option<u64>, TruncateReason> {
    let ra_rule = row.register(X86_64::RA);
    if matches!(ra_rule, Some(RegisterRule::Undefined)) {
        return Ok(None);
    }
    let cfa = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => regs
            .get(register.0)
            .ok_or(TruncateReason::UnwindRuleMissing)?
            .wrapping_add_signed(*offset),
        CfaRule::Expression(e) => {
            let expr = section.expression(e).ok_or(TruncateReason::CfiError)?;
            evaluate(expr, None, regs, mem)?
        }
    };
    let ra = match ra_rule {
        Some(rule) => restore(&rule, cfa, section, regs, mem)?,
        // No rule for the return address: the CIE does not say where it is.
        None => return Err(TruncateReason::CfiError),
    };
    let mut caller = *regs;
    for reg in 0..regs::RIP {
        if reg == regs::RSP {
            continue;
        }
        let value = match row.register(Register(reg)) {
            None if regs::callee_saved(reg) => regs.get(reg),
            None => None,
            Some(RegisterRule::SameValue) => regs.get(reg),
            // In an epilogue the CFI may still name a save slot the function has already popped
            // (it now lies below the stack pointer, outside the sample's copy): the register
            // holds the popped value.
            Some(RegisterRule::Offset(o)) if first && cfa.wrapping_add_signed(o) < regs.sp() => {
                regs.get(reg)
            }
            // A rule that cannot be followed leaves the register unknown; only a later rule
            // that needs it ends the stack.
            Some(rule) => restore(&rule, cfa, section, regs, mem).ok(),
        };
        match value {
            Some(v) => caller.set(reg, v),
            None => caller.forget(reg),
        }
    }
    caller.set(regs::RSP, cfa);
    caller.set(regs::RIP, ra);
    *regs = caller;
    Ok(Some(ra))
}

/// The caller's value of a register under `rule` (other than "same value").
fn restore(
    rule: &RegisterRule<usize>,
    cfa: u64,
    section: &dyn Section<'_>,
    regs: &Registers,
    mem: &mut dyn Memory,
) -> Result<u64, TruncateReason> {
    let read =
        |mem: &mut dyn Memory, addr: u64| mem.read_stack_u64(addr).map_err(policy::reason_for_read);
    let expr = |e: &UnwindExpression<usize>| section.expression(e).ok_or(TruncateReason::CfiError);
    match rule {
        RegisterRule::Undefined | RegisterRule::Architectural | RegisterRule::SameValue => {
            Err(TruncateReason::UnwindRuleMissing)
        }
        RegisterRule::Offset(o) => read(mem, cfa.wrapping_add_signed(*o)),
        RegisterRule::ValOffset(o) => Ok(cfa.wrapping_add_signed(*o)),
        RegisterRule::Register(r) => regs.get(r.0).ok_or(TruncateReason::UnwindRuleMissing),
        RegisterRule::Expression(e) => {
            let addr = evaluate(expr(e)?, Some(cfa), regs, mem)?;
            read(mem, addr)
        }
        RegisterRule::ValExpression(e) => evaluate(expr(e)?, Some(cfa), regs, mem),
        RegisterRule::Constant(c) => Ok(*c),
    }
}

/// The most operations one CFI expression may execute.
const MAX_OPERATIONS: u32 = 1000;

/// Evaluates a DWARF expression to an address, with `initial` pushed first (the CFA, for
/// register rules), registers from `regs` and memory from the stack.
fn evaluate(
    expr: gimli::Expression<Slice<'_>>,
    initial: Option<u64>,
    regs: &Registers,
    mem: &mut dyn Memory,
) -> Result<u64, TruncateReason> {
    let encoding = gimli::Encoding {
        format: gimli::Format::Dwarf64,
        version: 4,
        address_size: 8,
    };
    let mut eval: Evaluation<Slice<'_>> = expr.evaluation(encoding);
    if let Some(v) = initial {
        eval.set_initial_value(v);
    }
    // Expressions in CFI are short; bounds on the operations executed (a branch may loop) and
    // on the registers and memory asked for keep a malformed expression from spinning.
    eval.set_max_iterations(MAX_OPERATIONS);
    let mut state = eval.evaluate().map_err(|_| TruncateReason::CfiError)?;
    for _ in 0..64 {
        state = match state {
            EvaluationResult::Complete => {
                return match eval.as_result() {
                    [
                        Piece {
                            location: Location::Address { address },
                            ..
                        },
                    ] => Ok(*address),
                    _ => Err(TruncateReason::CfiError),
                };
            }
            EvaluationResult::RequiresRegister { register, .. } => {
                let v = regs
                    .get(register.0)
                    .ok_or(TruncateReason::UnwindRuleMissing)?;
                eval.resume_with_register(Value::Generic(v))
            }
            EvaluationResult::RequiresMemory {
                address,
                size,
                space: None,
                ..
            } => {
                let word = mem
                    .read_stack_u64(address)
                    .map_err(policy::reason_for_read)?;
                let v = if size >= 8 {
                    word
                } else {
                    word & ((1u64 << (8 * u32::from(size))) - 1)
                };
                eval.resume_with_memory(Value::Generic(v))
            }
            _ => return Err(TruncateReason::CfiError),
        }
        .map_err(|_| TruncateReason::CfiError)?;
    }
    Err(TruncateReason::CfiError)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoStack;

    impl Memory for NoStack {
        fn read_stack_u64(&mut self, _addr: u64) -> Result<u64, super::super::ReadFailure> {
            Err(super::super::ReadFailure::Unreadable)
        }
    }

    fn eval(bytes: &[u8]) -> Result<u64, TruncateReason> {
        let expr = gimli::Expression(EndianSlice::new(bytes, LittleEndian));
        evaluate(expr, Some(0x1000), &Registers::new(1, 2, 3), &mut NoStack)
    }

    #[test]
    fn an_expression_that_branches_to_itself_is_an_error_not_a_hang() {
        // DW_OP_lit8; DW_OP_plus: CFA + 8.
        assert_eq!(eval(&[0x38, 0x22]), Ok(0x1008));
        // DW_OP_skip -3: jumps back to itself forever.
        assert_eq!(eval(&[0x2f, 0xfd, 0xff]), Err(TruncateReason::CfiError));
    }
}
