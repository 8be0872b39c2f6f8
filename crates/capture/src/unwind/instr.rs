//! x86-64 instruction analysis for code without CFI: where is the return address at this
//! instruction, and does a return address follow a call instruction?
//!
//! Only the handful of instruction forms that decide a frame's state are recognised: `endbr64`,
//! `push %rbp`, `mov %rsp,%rbp`, `ret`, and the `call` encodings. Anything else is "body".

/// How to find the caller of a frame in code without CFI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoCfiRule {
    /// Nothing pushed yet (function entry, or `ret` about to run): return address at `[sp]`,
    /// `rbp` still the caller's.
    ReturnAtSp,
    /// `push %rbp` done, `mov %rsp,%rbp` not yet: saved `rbp` at `[sp]`, return address at
    /// `[sp+8]`, `rbp` still the caller's.
    ReturnAtSpPlus8,
    /// Inside a frame-pointer body: return address at `[rbp+8]`, caller's `rbp` at `[rbp]`.
    FramePointer,
    /// Return address at `[sp+ra]`; the caller's `rbp` at `[sp+saved_bp]` when given, else still
    /// in `rbp` (JIT code: see `jit::frame_state`).
    ReturnAt {
        /// Offset of the return address from `sp`.
        ra: u32,
        /// Offset of the saved caller's `rbp` from `sp`, once pushed.
        saved_bp: Option<u32>,
    },
}

const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// Offsets within a standard frame-pointer prologue: `[endbr64] push %rbp; mov %rsp,%rbp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FpPrologue {
    /// Offset of the `push %rbp`.
    push: usize,
    /// Offset just past the `mov %rsp,%rbp`.
    body: usize,
}

fn fp_prologue(code: &[u8]) -> Option<FpPrologue> {
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

fn is_ret(code: &[u8]) -> bool {
    matches!(code, [0xc3, ..] | [0xf3, 0xc3, ..] | [0xc2, _, _, ..])
}

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

/// Whether the bytes just before a return address end with a call instruction.
///
/// `before` holds up to 8 bytes ending right at the return address. Recognises `call rel32`
/// (`e8`) and every `call r/m64` form (`ff /2`, `ff /3`) whose length ends exactly there.
pub fn is_after_call(before: &[u8]) -> bool {
    let n = before.len();
    if n >= 5 && before[n - 5] == 0xe8 {
        return true;
    }
    (2..=7.min(n)).any(|k| {
        let at = n - k;
        before[at] == 0xff
            && before.get(at + 1).is_some_and(|&modrm| {
                matches!((modrm >> 3) & 7, 2 | 3)
                    && modrm_length(modrm, before.get(at + 2).copied()) == Some(k)
            })
    })
}

/// Length of an instruction `ff modrm [sib] [disp]` from its ModRM (and SIB) byte.
fn modrm_length(modrm: u8, sib: Option<u8>) -> Option<usize> {
    let md = modrm >> 6;
    let rm = modrm & 7;
    if md == 3 {
        return Some(2);
    }
    let mut len = 2;
    if rm == 4 {
        len += 1;
        if md == 0 && sib? & 7 == 5 {
            len += 4;
        }
    } else if md == 0 && rm == 5 {
        len += 4;
    }
    len += match md {
        1 => 1,
        2 => 4,
        _ => 0,
    };
    Some(len)
}

#[cfg(test)]
mod tests {
    use super::*;

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
