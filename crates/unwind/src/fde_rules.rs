//! Every row of one FDE reduced to its [`FrameRule`], read in one pass, and kept per address
//! space for the FDEs its lookups met.
//!
//! The address space remembers a frame rule per lookup address ([`crate::space`]). An address
//! it has not met (nearly every sample's leaf, a call site seen for the first time) needed the
//! covering FDE parsed and its rows run up to the address with gimli, a few microseconds each.
//! Hot functions are met again and again at new addresses, so the rules of all of an FDE's rows
//! are kept the first time one of its addresses is looked up, and later addresses in that FDE
//! are found by a binary search. A lookup finds the rule of the row that contains the address
//! (what [`crate::full::Evaluator::frame_rule`] finds there); None for a row of another shape
//! (one that [`crate::cfi::CfiIndex::row_class`] says needs full registers), where no row
//! contains it, and anywhere in an FDE whose rows cannot all be read (which `row_class` also
//! gives to the full-register evaluator).

use foldhash::HashMap;

use crate::frame_rule::FrameRule;
use crate::full::{Evaluator, RowAt};

/// One row: the link-time addresses it covers and its rule (None: another shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RuleRow {
    start: u64,
    end: u64,
    rule: Option<FrameRule>,
}

/// The rows of one FDE, in address order (rows covering no address left out).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FdeRules {
    rows: Box<[RuleRow]>,
}

impl FdeRules {
    /// Collects rows (start, end, rule) as gimli yields them; rows covering no address are
    /// left out (they cannot contain an address).
    pub(crate) fn from_rows(rows: impl Iterator<Item = (u64, u64, Option<FrameRule>)>) -> Self {
        FdeRules {
            rows: rows
                .filter(|&(start, end, _)| start < end)
                .map(|(start, end, rule)| RuleRow { start, end, rule })
                .collect(),
        }
    }

    /// The rule of the row containing link-time address `svma` (None: no row contains it, or
    /// the row has another shape).
    pub fn rule_at(&self, svma: u64) -> Option<FrameRule> {
        let i = self.rows.partition_point(|r| r.start <= svma);
        let row = self.rows.get(i.checked_sub(1)?)?;
        if svma < row.end { row.rule } else { None }
    }

    /// Number of rows kept.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no row was kept.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// Most rows an address space keeps in [`FdeRuleCache`] (about 1 MiB at a few tens of bytes a
/// row; rustc's FDEs average some 16 rows, so about 2,000 functions); past it the cache starts
/// again.
const MAX_CACHED_ROWS: usize = 1 << 15;

/// The rules of the FDEs an address space's lookups met, by the runtime address where the FDE
/// starts (and its section). Cleared when the regions change, as the address space's other
/// per-address memos are.
#[derive(Default)]
pub(crate) struct FdeRuleCache {
    fdes: HashMap<(u64, bool), FdeRules>,
    rows: usize,
}

impl FdeRuleCache {
    /// The frame rule at runtime address `lookup` (link-time `at.svma`, in the FDE that starts
    /// at link-time `fde_start`), from the rules of that FDE, read the first time one of its
    /// addresses is looked up.
    pub(crate) fn rule(
        &mut self,
        evaluator: &mut Evaluator,
        at: RowAt<'_>,
        fde_start: u64,
        lookup: u64,
    ) -> Option<FrameRule> {
        let key = (
            lookup.wrapping_sub(at.svma.wrapping_sub(fde_start)),
            at.debug,
        );
        if let Some(rules) = self.fdes.get(&key) {
            return rules.rule_at(at.svma);
        }
        let rules = evaluator.fde_rules(at)?;
        let rule = rules.rule_at(at.svma);
        if self.rows + rules.len() > MAX_CACHED_ROWS {
            self.clear();
        }
        self.rows += rules.len();
        self.fdes.insert(key, rules);
        rule
    }

    /// Forgets every FDE's rules.
    pub(crate) fn clear(&mut self) {
        self.fdes.clear();
        self.rows = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame_rule::CfaBase;

    fn cfa(offset: i32) -> Option<FrameRule> {
        Some(FrameRule::Cfa {
            base: CfaBase::Rsp,
            offset,
            rbp_at: None,
        })
    }

    #[test]
    fn a_lookup_finds_the_row_containing_it_and_nothing_between_or_past_rows() {
        let rules = FdeRules::from_rows(
            [
                (0x100, 0x104, cfa(8)),
                (0x104, 0x104, cfa(99)), // covers no address
                (0x104, 0x110, cfa(16)),
                (0x110, 0x118, None),
                (0x120, 0x128, cfa(8)),
            ]
            .into_iter(),
        );
        assert_eq!(rules.len(), 4);
        let at = |a| rules.rule_at(a);
        assert_eq!(
            [at(0xff), at(0x100), at(0x103), at(0x104), at(0x10f)],
            [None, cfa(8), cfa(8), cfa(16), cfa(16)]
        );
        assert_eq!(
            [at(0x110), at(0x118), at(0x11f), at(0x127), at(0x128)],
            [None, None, None, cfa(8), None]
        );
        assert_eq!(FdeRules::default().rule_at(0x100), None);
    }
}
