//! Frame rules for ahead-of-time code without CFI, from the few byte patterns that decide a
//! frame's state: `endbr64`, `push %rbp`, `mov %rsp,%rbp`, `ret`. Anything else is "body".

use super::NoCfiRule;
use super::epilogue::is_ret;
use super::prologue::{ENDBR64, fp_prologue};

/// The rule for the *leaf* frame (the sampled instruction) of a function without CFI.
///
/// `at_ip` holds the bytes from the instruction pointer on. `function` gives the bytes from the
/// function's start and the offset of the instruction pointer within them, when the start is
/// known (symbol table, perf map); `prev` holds the two bytes before the instruction pointer.
/// Returns `None` when the state cannot be decided, i.e. a
/// function without a frame-pointer prologue sampled past its first instruction.
pub fn leaf_rule(
    at_ip: &[u8],
    prev: [Option<u8>; 2],
    function: Option<(&[u8], usize)>,
) -> Option<NoCfiRule> {
    if is_ret(at_ip) {
        return Some(NoCfiRule::ReturnAtSp);
    }
    match function {
        Some((code, offset)) => match fp_prologue(code) {
            Some(p) if offset <= p.push => Some(NoCfiRule::ReturnAtSp),
            Some(p) if offset < p.body => Some(NoCfiRule::ReturnAtSpPlus8),
            Some(_) => Some(NoCfiRule::FramePointer),
            None if offset == 0 => Some(NoCfiRule::ReturnAtSp),
            None => None,
        },
        None => {
            if at_ip.first() == Some(&0x55) || at_ip.starts_with(&ENDBR64) {
                Some(NoCfiRule::ReturnAtSp)
            } else if prev == [Some(0x0f), Some(0x05)] {
                // Right after a `syscall` in code with neither CFI nor a known start: an assembly
                // syscall wrapper, which keeps the return address at [sp]; validation rejects
                // the rule where that is not so (e.g. a new thread's first instruction).
                Some(NoCfiRule::ReturnAtSp)
            } else if prev[1] == Some(0x55)
                && (at_ip.starts_with(&[0x48, 0x89, 0xe5])
                    || at_ip.starts_with(&[0x48, 0x8b, 0xec]))
            {
                Some(NoCfiRule::ReturnAtSpPlus8)
            } else {
                Some(NoCfiRule::FramePointer)
            }
        }
    }
}

/// The rule for a *caller* frame (stopped at a call) of a function without CFI: the frame-pointer
/// rule when the function keeps a frame pointer (or its start is unknown), else `None`.
pub fn caller_rule(function: Option<&[u8]>) -> Option<NoCfiRule> {
    match function {
        Some(code) => fp_prologue(code).map(|_| NoCfiRule::FramePointer),
        None => Some(NoCfiRule::FramePointer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::x86_64::instruction_analysis::is_after_call;

    const PROLOGUE: [u8; 12] = [
        0xf3, 0x0f, 0x1e, 0xfa, // endbr64
        0x55, // push %rbp
        0x48, 0x89, 0xe5, // mov %rsp,%rbp
        0x89, 0x7d, 0xec, // mov %edi,-0x14(%rbp)
        0xc3, // ret
    ];

    #[test]
    fn leaf_state_follows_the_prologue() {
        let at = |off: usize| leaf_rule(&PROLOGUE[off..], [None; 2], Some((&PROLOGUE, off)));
        assert_eq!(at(0), Some(NoCfiRule::ReturnAtSp));
        assert_eq!(at(4), Some(NoCfiRule::ReturnAtSp));
        assert_eq!(at(5), Some(NoCfiRule::ReturnAtSpPlus8));
        assert_eq!(at(8), Some(NoCfiRule::FramePointer));
        assert_eq!(at(11), Some(NoCfiRule::ReturnAtSp));
    }

    #[test]
    fn frameless_function_is_undecidable_past_entry() {
        let code = [0x8b, 0x05, 0, 0, 0, 0, 0x01, 0xf8, 0xc3];
        assert_eq!(
            leaf_rule(&code, [None; 2], Some((&code, 0))),
            Some(NoCfiRule::ReturnAtSp)
        );
        assert_eq!(leaf_rule(&code[6..], [None; 2], Some((&code, 6))), None);
        assert_eq!(
            leaf_rule(&code[8..], [None; 2], Some((&code, 8))),
            Some(NoCfiRule::ReturnAtSp)
        );
        assert_eq!(caller_rule(Some(&code)), None);
        assert_eq!(caller_rule(Some(&PROLOGUE)), Some(NoCfiRule::FramePointer));
    }

    #[test]
    fn call_forms_are_recognised() {
        assert!(is_after_call(&[0x90, 0x90, 0x90, 0xe8, 1, 2, 3, 4]));
        assert!(is_after_call(&[0x90, 0xff, 0xd0])); // call *%rax
        assert!(is_after_call(&[0x41, 0xff, 0xd4])); // call *%r12
        assert!(is_after_call(&[0xff, 0x15, 1, 2, 3, 4])); // call *disp(%rip)
        assert!(is_after_call(&[0xff, 0x50, 0x08])); // call *8(%rax)
        assert!(is_after_call(&[0xff, 0x14, 0xc5, 1, 2, 3, 4])); // call *disp(,%rax,8)
        assert!(!is_after_call(&[0x90, 0x90, 0x90, 0x90, 0x90]));
        assert!(!is_after_call(&[0xff, 0xe0])); // jmp *%rax is not a call
        assert!(!is_after_call(&[0x48, 0x89, 0xe5])); // a saved rbp's bytes are not a call
    }
}
