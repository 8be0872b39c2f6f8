//! One CFI row reduced to what the fast walk needs, remembered per lookup address.
//!
//! Almost every row a walk meets says: the CFA is rsp or rbp plus an offset, the return address
//! lies at CFA-8, and rbp either keeps its value or was saved at an offset from the CFA. Such a
//! row is a [`FrameRule`] of a few bytes; the address space keeps one per lookup address it
//! has met (the same call sites recur in every sample), so a frame is unwound from it with two
//! stack reads and no CFI parsing. Rows of any other shape (a CFA from another register or an
//! expression, a return address elsewhere) have no frame rule and go the evaluators' way.

use gimli::{CfaRule, RegisterRule, UnwindContextStorage, UnwindTableRow, X86_64};

use crate::memory::Memory;
use crate::policy::{self, TruncateReason};
use crate::regs::Registers;

/// The register a [`FrameRule`]'s CFA is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CfaBase {
    /// The stack pointer.
    Rsp,
    /// The frame pointer.
    Rbp,
}

/// A CFI row that needs only rip, rsp and rbp, in a form the fast walk runs directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameRule {
    /// The row marks the return address undefined: the thread's outermost frame.
    Root,
    /// CFA = `base` + `offset`; the return address at CFA-8; rbp saved at CFA + `rbp_at`, or
    /// unchanged when None.
    Cfa {
        /// The register the CFA is computed from.
        base: CfaBase,
        /// The CFA's offset from `base`.
        offset: i32,
        /// Where rbp was saved, relative to the CFA.
        rbp_at: Option<i32>,
    },
}

/// How running a [`FrameRule`] can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleFailure {
    /// The stack ends here, for this reason.
    Truncated(TruncateReason),
    /// The frame cannot be judged from rip, rsp and rbp alone (a zero frame pointer or return
    /// address, which the CFI does not call a root): the full-register walk decides.
    NeedsFullRegisters,
}

impl FrameRule {
    /// The rule for `row`, when it has this shape (and its offsets fit in 32 bits: a rule is
    /// kept for every lookup address met, so it is kept small).
    pub fn of_row<T: gimli::ReaderOffset, S: UnwindContextStorage<T>>(
        row: &UnwindTableRow<T, S>,
    ) -> Option<FrameRule> {
        match row.register(X86_64::RA) {
            Some(RegisterRule::Undefined) => return Some(FrameRule::Root),
            Some(RegisterRule::Offset(-8)) => {}
            _ => return None,
        }
        let rbp_at = match row.register(X86_64::RBP) {
            None | Some(RegisterRule::SameValue) => None,
            Some(RegisterRule::Offset(o)) => Some(i32::try_from(o).ok()?),
            Some(_) => return None,
        };
        let CfaRule::RegisterAndOffset { register, offset } = *row.cfa() else {
            return None;
        };
        let base = match register {
            X86_64::RSP => CfaBase::Rsp,
            X86_64::RBP => CfaBase::Rbp,
            _ => return None,
        };
        Some(FrameRule::Cfa {
            base,
            offset: i32::try_from(offset).ok()?,
            rbp_at,
        })
    }

    /// Unwinds one frame of the fast walk (`first`: the sampled instruction's): moves `regs`
    /// (rip, rsp, rbp) to the caller and returns its return address, or None at the root.
    ///
    /// The saved rbp is read before the return address. In the first frame a save slot below
    /// the stack pointer (an epilogue that has popped it already) leaves rbp as it is.
    pub fn exec(
        self,
        first: bool,
        regs: &mut Registers,
        mem: &mut dyn Memory,
    ) -> Result<Option<u64>, RuleFailure> {
        let FrameRule::Cfa {
            base,
            offset,
            rbp_at,
        } = self
        else {
            return Ok(None);
        };
        let (sp, bp) = (regs.sp(), regs.bp());
        let from = match base {
            CfaBase::Rsp => sp,
            // No frame pointer to follow: what the CFI means here only the full walk can tell.
            CfaBase::Rbp if bp == 0 => return Err(RuleFailure::NeedsFullRegisters),
            CfaBase::Rbp => bp,
        };
        let overflow = RuleFailure::Truncated(TruncateReason::CfiError);
        let cfa = from.checked_add_signed(offset.into()).ok_or(overflow)?;
        let read = |mem: &mut dyn Memory, addr: u64| {
            mem.read_stack_u64(addr)
                .map_err(|f| RuleFailure::Truncated(policy::reason_for_read(f)))
        };
        let caller_bp = match rbp_at {
            None => bp,
            Some(o) => {
                let at = cfa.checked_add_signed(o.into()).ok_or(overflow)?;
                if first && at < sp { bp } else { read(mem, at)? }
            }
        };
        let ra = read(mem, cfa.checked_sub(8).ok_or(overflow)?)?;
        if ra == 0 {
            return Err(RuleFailure::NeedsFullRegisters);
        }
        *regs = Registers::new(ra, cfa, caller_bp);
        Ok(Some(ra))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ReadFailure;

    /// A stack of words from `base`.
    struct Words {
        base: u64,
        words: Vec<u64>,
    }

    impl Memory for Words {
        fn read_stack_u64(&mut self, addr: u64) -> Result<u64, ReadFailure> {
            let i = addr.checked_sub(self.base).ok_or(ReadFailure::Unreadable)? / 8;
            self.words
                .get(i as usize)
                .copied()
                .ok_or(ReadFailure::BeyondCopy)
        }
    }

    fn stack() -> Words {
        // 0x1000: local, 0x1008: saved rbp, 0x1010: return address, 0x1018: caller's.
        Words {
            base: 0x1000,
            words: vec![7, 0x2000, 0x40_1234, 9],
        }
    }

    #[test]
    fn an_rsp_based_frame_restores_its_saved_rbp_and_return_address() {
        let rule = FrameRule::Cfa {
            base: CfaBase::Rsp,
            offset: 0x18,
            rbp_at: Some(-16),
        };
        let mut regs = Registers::new(0x40_0000, 0x1000, 5);
        assert_eq!(
            rule.exec(false, &mut regs, &mut stack()),
            Ok(Some(0x40_1234))
        );
        assert_eq!(
            (regs.ip(), regs.sp(), regs.bp()),
            (0x40_1234, 0x1018, 0x2000)
        );
    }

    #[test]
    fn an_rbp_based_frame_follows_the_frame_pointer() {
        let rule = FrameRule::Cfa {
            base: CfaBase::Rbp,
            offset: 16,
            rbp_at: Some(-16),
        };
        let mut regs = Registers::new(0x40_0000, 0x1000, 0x1008);
        assert_eq!(
            rule.exec(false, &mut regs, &mut stack()),
            Ok(Some(0x40_1234))
        );
        assert_eq!((regs.sp(), regs.bp()), (0x1018, 0x2000));
        let mut zero = Registers::new(0x40_0000, 0x1000, 0);
        assert_eq!(
            rule.exec(false, &mut zero, &mut stack()),
            Err(RuleFailure::NeedsFullRegisters)
        );
    }

    #[test]
    fn a_leaf_past_its_epilogues_pop_keeps_rbp() {
        // The slot lies below the stack pointer (the copy starts there): rbp already holds the
        // popped value.
        let rule = FrameRule::Cfa {
            base: CfaBase::Rsp,
            offset: 8,
            rbp_at: Some(-16),
        };
        let copy = || Words {
            base: 0x1010,
            words: vec![0x40_1234, 9],
        };
        let mut regs = Registers::new(0x40_0000, 0x1010, 5);
        assert_eq!(rule.exec(true, &mut regs, &mut copy()), Ok(Some(0x40_1234)));
        assert_eq!(regs.bp(), 5);
        let mut caller = Registers::new(0x40_0000, 0x1010, 5);
        assert_eq!(
            rule.exec(false, &mut caller, &mut copy()),
            Err(RuleFailure::Truncated(TruncateReason::UnreadableStack))
        );
    }

    #[test]
    fn reads_past_the_copy_and_null_return_addresses_are_told_apart() {
        let far = FrameRule::Cfa {
            base: CfaBase::Rsp,
            offset: 0x100,
            rbp_at: None,
        };
        let mut regs = Registers::new(0x40_0000, 0x1000, 5);
        assert_eq!(
            far.exec(false, &mut regs, &mut stack()),
            Err(RuleFailure::Truncated(TruncateReason::StackCopyExhausted))
        );
        let null = FrameRule::Cfa {
            base: CfaBase::Rsp,
            offset: 8,
            rbp_at: None,
        };
        let mut zeros = Words {
            base: 0x1000,
            words: vec![0, 0],
        };
        assert_eq!(
            null.exec(false, &mut regs, &mut zeros),
            Err(RuleFailure::NeedsFullRegisters)
        );
        assert_eq!(
            FrameRule::Root.exec(false, &mut regs, &mut stack()),
            Ok(None)
        );
    }
}
