//! Frames in code without CFI: the rule decided from the instructions (the
//! [`instruction_analysis`](crate::x86_64::instruction_analysis) of native or JIT code), and its
//! execution on the registers.
//!
//! A zero frame pointer or return address ends a stack at its root only where the ABI's
//! outermost-frame convention can apply: in a function that starts threads, or in code whose
//! function start is unknown. A function known to keep a frame pointer never has rbp = 0, so
//! there a zero is a broken chain and ends the stack with a truncation.

use crate::binary::Binary;
use crate::memory::Memory;
use crate::policy::{self, TruncateReason};
use crate::region::Region;
use crate::regs::{self, Registers};
use crate::x86_64::instruction_analysis::{NoCfiRule, OsrSlot, jit, native};

/// Bytes past the instruction read for the path to the function's return.
const PATH_BYTES: usize = 1024;

/// The function's code from `start`: all of it when its end is known and it fits in `buf`
/// (a jump past a shorter slice would be taken for a tail call out of the function, when it
/// goes to the function's own deferred code), else through `PATH_BYTES` past `offset` (less
/// where the code ends sooner; at least through the instruction at `offset`).
fn read_path<'b, M: Binary + ?Sized>(
    m: &M,
    start: u64,
    offset: usize,
    buf: &'b mut [u8],
) -> Option<&'b [u8]> {
    if let Some(len) = m
        .function_end(start)
        .and_then(|end| usize::try_from(end.checked_sub(start)?).ok())
        .filter(|&len| len > offset && len <= buf.len())
        && m.code(start, &mut buf[..len]).is_some()
    {
        return Some(&buf[..len]);
    }
    let mut len = (offset + PATH_BYTES).min(buf.len());
    while len > offset + 16 {
        if m.code(start, &mut buf[..len]).is_some() {
            return Some(&buf[..len]);
        }
        len = (offset + 16).max(len / 2);
    }
    let len = (offset + 16).min(buf.len());
    m.code(start, &mut buf[..len])
}

/// The rule for one frame without CFI, and whether a zero frame pointer or return address may
/// mark the thread's root there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame {
    /// How to find the caller.
    pub rule: NoCfiRule,
    /// A zero frame pointer (frame-pointer rule) or return address ends the stack at its root.
    pub may_end: bool,
}

/// Decides the rule for a frame in code without CFI (see [`native`]).
pub(crate) fn frame<M: Binary>(
    region: &Region<M>,
    first: bool,
    lookup: u64,
    mem: &mut dyn Memory,
) -> Result<Frame, TruncateReason> {
    const WINDOW: usize = 4096;
    let mut at_ip_buf = [0u8; 16];
    let mut prev_buf = [0u8; 2];
    let mut function_buf = [0u8; WINDOW + 16];
    let mut path_buf = [0u8; WINDOW + PATH_BYTES];
    type Analysis<'c> = (&'c [u8], [Option<u8>; 2], Option<(&'c [u8], usize)>);
    // A zero frame pointer or return address may end the stack in a thread entry, or where no
    // symbol says which function this is.
    let mut may_end = false;
    let (at_ip, prev, function): Analysis<'_> = match &region.module {
        Some(m) => {
            let svma = region.svma(lookup);
            may_end = m.in_thread_entry(svma) || m.function_start(svma).is_none();
            // Code that cannot be read gives no rule (guessing could skip a frame).
            let at_ip = m
                .code(svma, &mut at_ip_buf)
                .ok_or(TruncateReason::NoUnwindInfo)?;
            let byte = |a: u64| m.code(a, &mut [0]).and_then(|b| b.first().copied());
            let prev = [byte(svma.wrapping_sub(2)), byte(svma.wrapping_sub(1))];
            let function = m.function_start(svma).and_then(|start| {
                let offset = usize::try_from(svma - start).ok().filter(|&o| o < WINDOW)?;
                let code = m.code(start, &mut function_buf[..offset + 16])?;
                Some((code, offset))
            });
            (at_ip, prev, function)
        }
        None => {
            // (A refusal is asked after the JIT lookup, which reads the runtime's newly loaded
            // images; an image the budget now has room for is loaded when asked, and its
            // method is then looked up again rather than guessed at.)
            let jit = match mem.jit_rule(lookup, first) {
                Some(rule) => Some(rule),
                None if mem.code_refused(lookup) => {
                    return Err(TruncateReason::ModuleMemoryLimit);
                }
                None => mem.jit_rule(lookup, first),
            };
            if let Some(rule) = jit {
                // JIT code is never a thread's root.
                let rule = rule.ok_or(TruncateReason::NoUnwindInfo)?;
                return Ok(Frame {
                    rule,
                    may_end: false,
                });
            }
            if mem.jit_code_unnamed(lookup) {
                // The runtime has not named this code yet: no guess (the caller waits for it).
                return Err(TruncateReason::NoUnwindInfo);
            }
            let at_ip: &[u8] = if mem.read_code(lookup, &mut at_ip_buf) {
                &at_ip_buf
            } else {
                &[]
            };
            let prev = if mem.read_code(lookup.wrapping_sub(2), &mut prev_buf) {
                [Some(prev_buf[0]), Some(prev_buf[1])]
            } else {
                [None; 2]
            };
            (at_ip, prev, None)
        }
    };
    // Code in a file without CFI whose prologue is not at its start (e.g. V8's embedded
    // builtins in node, which build their frames in deferred code, and are entered by jumps as
    // well as calls): the paths from the instruction to the return, else the prologue
    // simulation as for JIT code.
    let on_path = |path_buf: &mut [u8]| {
        let (_, offset) = function?;
        let m = region.module.as_ref()?;
        let start = m.function_start(region.svma(lookup))?;
        let path = read_path(m.as_ref(), start, offset, path_buf)?;
        if first {
            jit::leaf_rule_on_path(path, offset)
        } else {
            jit::caller_rule_on_path(path, offset + 1)
        }
    };
    let keeps_frame_pointer =
        function.is_some_and(|(code, _)| native::caller_rule(Some(code)).is_some());
    let rule = if first && function.is_some() && !keeps_frame_pointer {
        // Even at its first instruction: such code may be entered by a jump in its caller's
        // frame, or build its caller's frame (V8's BaselineOutOfLinePrologue).
        on_path(&mut path_buf).or_else(|| native::leaf_rule(at_ip, prev, function))
    } else if first {
        native::leaf_rule(at_ip, prev, function).or_else(|| on_path(&mut path_buf))
    } else {
        native::caller_rule(function.map(|(code, _)| code)).or_else(|| on_path(&mut path_buf))
    };
    let rule = match rule.ok_or(TruncateReason::NoUnwindInfo)? {
        NoCfiRule::FramePointer if region.module.is_none() && mem.jit_interpreter(lookup) => {
            NoCfiRule::InterpreterFrame
        }
        rule => rule,
    };
    Ok(Frame { rule, may_end })
}

/// Executes a no-CFI rule on `regs` (rip, rsp, rbp; every other register becomes unknown,
/// since code without CFI may have changed it). `Ok(None)`: the thread's root.
pub(crate) fn exec(
    frame: Frame,
    regs: &mut Registers,
    mem: &mut dyn Memory,
) -> Result<Option<u64>, TruncateReason> {
    let sp = regs.sp();
    let bp = regs.get(regs::RBP);
    let read =
        |mem: &mut dyn Memory, addr: u64| mem.read_stack_u64(addr).map_err(policy::reason_for_read);
    let (ra, new_sp, new_bp) = match frame.rule {
        NoCfiRule::ReturnAtSp => (read(mem, sp)?, sp.checked_add(8), bp),
        NoCfiRule::ReturnAtSpPlus8 => (read(mem, sp.wrapping_add(8))?, sp.checked_add(16), bp),
        NoCfiRule::FramePointer | NoCfiRule::InterpreterFrame => {
            let bp = bp.ok_or(TruncateReason::UnwindRuleMissing)?;
            if bp == 0 {
                return if frame.may_end {
                    Ok(None)
                } else {
                    Err(TruncateReason::BadFramePointer)
                };
            }
            if bp < sp || !bp.is_multiple_of(8) {
                return Err(TruncateReason::BadFramePointer);
            }
            let ra = read(mem, bp.wrapping_add(8))?;
            let new_sp = if frame.rule == NoCfiRule::InterpreterFrame {
                Some(sender_sp(mem, regs, sp, bp, ra)?)
            } else {
                bp.checked_add(16)
            };
            (ra, new_sp, Some(read(mem, bp)?))
        }
        NoCfiRule::Osr { slot } => {
            let slot_at = match slot {
                OsrSlot::Sp(o) => sp.checked_add(u64::from(o)),
                OsrSlot::Bp(o) => {
                    let bp = bp.ok_or(TruncateReason::UnwindRuleMissing)?;
                    if bp < sp || !bp.is_multiple_of(8) {
                        return Err(TruncateReason::BadFramePointer);
                    }
                    bp.checked_add(u64::from(o))
                }
            }
            .ok_or(TruncateReason::BadFramePointer)?;
            // The Tier-0 frame starts right above the slot; it holds the real return address.
            let tier0_ret = read(mem, slot_at)?;
            let (ra, saved_bp) = mem
                .osr_tier0_frame(tier0_ret)
                .ok_or(TruncateReason::NoUnwindInfo)?;
            let tier0_sp = slot_at.wrapping_add(8);
            let ra_at = tier0_sp.wrapping_add(u64::from(ra));
            let new_bp = read(mem, tier0_sp.wrapping_add(u64::from(saved_bp)))?;
            (read(mem, ra_at)?, ra_at.checked_add(8), Some(new_bp))
        }
        NoCfiRule::OutOfLinePrologue { ra } => {
            let ra_at = sp.wrapping_add(u64::from(ra));
            (read(mem, ra_at)?, ra_at.checked_add(8), bp)
        }
        NoCfiRule::ReturnInRegister { reg } => {
            let ra = regs.get(reg).ok_or(TruncateReason::UnwindRuleMissing)?;
            (ra, Some(sp), bp)
        }
        NoCfiRule::ReturnAt { ra, saved_bp } => return_at(mem, sp, ra, saved_bp, bp)?,
        NoCfiRule::ReturnAtSavedSp { slot, ra, saved_bp } => {
            let saved = read(mem, sp.wrapping_add(u64::from(slot)))?;
            // The stack pointer from before the alignment lies above the aligned one.
            if saved < sp || !saved.is_multiple_of(8) {
                return Err(TruncateReason::SpNotIncreasing);
            }
            return_at(mem, saved, ra, saved_bp, bp)?
        }
    };
    let new_sp = new_sp.ok_or(TruncateReason::BadFramePointer)?;
    if ra == 0 {
        return if frame.may_end {
            Ok(None)
        } else {
            Err(TruncateReason::NotAfterCall)
        };
    }
    let mut caller = Registers::new(ra, new_sp, 0);
    match new_bp {
        Some(v) => caller.set(regs::RBP, v),
        None => caller.forget(regs::RBP),
    }
    *regs = caller;
    Ok(Some(ra))
}

/// The stack pointer of the caller of a HotSpot interpreter frame at `bp` (see
/// [`NoCfiRule::InterpreterFrame`]) returning to `ra`: `[bp-8]`, or `r13` before that slot is
/// pushed. Where the slot cannot be read (past the copied stack, where the in-kernel walk read
/// only the frame-pointer chain), a caller found through its frame pointer alone (the
/// interpreter, the VM's stubs, methods compiled with frame pointers) gets `bp+16`; a compiled
/// caller whose frame is found from its stack pointer cannot do without it.
fn sender_sp(
    mem: &mut dyn Memory,
    regs: &Registers,
    sp: u64,
    bp: u64,
    ra: u64,
) -> Result<u64, TruncateReason> {
    let sender = if bp.wrapping_sub(8) >= sp {
        match mem.read_stack_u64(bp.wrapping_sub(8)) {
            Ok(v) => v,
            Err(e) => {
                let lookup = ra.wrapping_sub(1);
                let needs_sp = mem.jit_function(lookup).is_some()
                    && mem.jit_rule(lookup, false) != Some(Some(NoCfiRule::FramePointer));
                if needs_sp {
                    return Err(policy::reason_for_read(e));
                }
                return Ok(bp.wrapping_add(16));
            }
        }
    } else {
        regs.get(regs::R13)
            .ok_or(TruncateReason::UnwindRuleMissing)?
    };
    // The sender's frame lies above the return address; the adapter only ever lowers it.
    if sender < bp.wrapping_add(16) || !sender.is_multiple_of(8) {
        return Err(TruncateReason::BadFramePointer);
    }
    Ok(sender)
}

/// The return address at `[sp+ra]`, the caller's stack pointer above it, and its `rbp` read from
/// `[sp+saved_bp]` when given (else `bp`, unchanged).
fn return_at(
    mem: &mut dyn Memory,
    sp: u64,
    ra: u32,
    saved_bp: Option<u32>,
    bp: Option<u64>,
) -> Result<(u64, Option<u64>, Option<u64>), TruncateReason> {
    let read =
        |mem: &mut dyn Memory, addr: u64| mem.read_stack_u64(addr).map_err(policy::reason_for_read);
    let new_bp = match saved_bp {
        Some(o) => Some(read(mem, sp.wrapping_add(u64::from(o)))?),
        None => bp,
    };
    let ra_at = sp.wrapping_add(u64::from(ra));
    Ok((read(mem, ra_at)?, ra_at.checked_add(8), new_bp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::SyntheticBinary;
    use crate::x86_64::instruction_analysis::jit::leaf_rule_on_path;

    /// Stack words at fixed addresses.
    struct Words(&'static [(u64, u64)]);

    impl Memory for Words {
        fn read_stack_u64(&mut self, addr: u64) -> Result<u64, crate::policy::ReadFailure> {
            self.0
                .iter()
                .find(|w| w.0 == addr)
                .map(|w| w.1)
                .ok_or(crate::policy::ReadFailure::Unreadable)
        }
    }

    #[test]
    fn a_frame_is_found_through_the_stack_pointer_saved_before_an_alignment() {
        let frame = Frame {
            rule: NoCfiRule::ReturnAtSavedSp {
                slot: 8,
                ra: 0x100,
                saved_bp: Some(0x50),
            },
            may_end: false,
        };
        let mut regs = Registers::new(0x1234, 0x7000, 0);
        regs.set(regs::RBP, 0x1);
        let mut mem = Words(&[(0x7008, 0x7018), (0x7118, 0x5555), (0x7068, 0x9000)]);
        assert_eq!(exec(frame, &mut regs, &mut mem), Ok(Some(0x5555)));
        assert_eq!((regs.ip(), regs.sp()), (0x5555, 0x7120));
        assert_eq!(regs.get(regs::RBP), Some(0x9000));
        // A saved stack pointer below the current one is no frame of this stack.
        let mut regs = Registers::new(0x1234, 0x7000, 0);
        let mut mem = Words(&[(0x7008, 0x6000)]);
        assert_eq!(
            exec(frame, &mut regs, &mut mem),
            Err(TruncateReason::SpNotIncreasing)
        );
    }

    /// Stack words, with HotSpot's interpreter code at 0x4000..0x5000.
    struct InterpreterWords(&'static [(u64, u64)]);

    impl Memory for InterpreterWords {
        fn read_stack_u64(&mut self, addr: u64) -> Result<u64, crate::policy::ReadFailure> {
            Words(self.0).read_stack_u64(addr)
        }
        fn jit_interpreter(&mut self, addr: u64) -> bool {
            (0x4000..0x5000).contains(&addr)
        }
        // Compiled methods: 0x9000.. keeps no frame pointer, 0xa000.. does.
        fn jit_function(&mut self, addr: u64) -> Option<std::ops::Range<u64>> {
            [0x9000..0xa000, 0xa000..0xb000]
                .into_iter()
                .find(|r| r.contains(&addr))
        }
        fn jit_rule(&mut self, lookup: u64, _leaf: bool) -> Option<Option<NoCfiRule>> {
            self.jit_function(lookup).map(|r| {
                Some(if r.start == 0xa000 {
                    NoCfiRule::FramePointer
                } else {
                    NoCfiRule::ReturnAt {
                        ra: 0x18,
                        saved_bp: Some(0x10),
                    }
                })
            })
        }
    }

    const INTERPRETED: Frame = Frame {
        rule: NoCfiRule::InterpreterFrame,
        may_end: false,
    };

    #[test]
    fn an_interpreter_frames_caller_starts_at_the_sender_sp_it_kept() {
        // An interpreted frame at rbp 0x7040 called from compiled code (0x9000) through the
        // adapter, which lowered the stack by 0x20: the compiled caller's sp is 0x7070, not
        // rbp + 16.
        let mut regs = Registers::new(0x4100, 0x7000, 0);
        regs.set(regs::RBP, 0x7040);
        let mut mem = InterpreterWords(&[(0x7038, 0x7070), (0x7040, 0x7200), (0x7048, 0x9000)]);
        assert_eq!(exec(INTERPRETED, &mut regs, &mut mem), Ok(Some(0x9000)));
        assert_eq!((regs.sp(), regs.get(regs::RBP)), (0x7070, Some(0x7200)));
        // Right after `enter`, before the sender sp is pushed: it is still in r13.
        let mut regs = Registers::new(0x4100, 0x7040, 0);
        regs.set(regs::RBP, 0x7040);
        regs.set(regs::R13, 0x7070);
        let mut mem = InterpreterWords(&[(0x7040, 0x7200), (0x7048, 0x9000)]);
        assert_eq!(exec(INTERPRETED, &mut regs, &mut mem), Ok(Some(0x9000)));
        assert_eq!(regs.sp(), 0x7070);
        // A sender sp below the return address is no sender of this frame.
        let mut regs = Registers::new(0x4100, 0x7000, 0);
        regs.set(regs::RBP, 0x7040);
        let mut mem = InterpreterWords(&[(0x7038, 0x7040), (0x7040, 0x7200), (0x7048, 0x9000)]);
        assert_eq!(
            exec(INTERPRETED, &mut regs, &mut mem),
            Err(TruncateReason::BadFramePointer)
        );
    }

    #[test]
    fn an_unreadable_sender_sp_matters_only_to_a_caller_found_from_its_stack_pointer() {
        // Interpreted caller (0x4200): its frame pointer is all it needs.
        let mut regs = Registers::new(0x4100, 0x7000, 0);
        regs.set(regs::RBP, 0x7040);
        let mut mem = InterpreterWords(&[(0x7040, 0x7200), (0x7048, 0x4200)]);
        assert_eq!(exec(INTERPRETED, &mut regs, &mut mem), Ok(Some(0x4200)));
        assert_eq!(regs.sp(), 0x7050);
        // A caller compiled with frame pointers, or a VM stub (no single function): neither.
        for caller in [0xa100, 0x6100] {
            let mut regs = Registers::new(0x4100, 0x7000, 0);
            regs.set(regs::RBP, 0x7040);
            let mut mem = InterpreterWords(if caller == 0xa100 {
                &[(0x7040, 0x7200), (0x7048, 0xa100)]
            } else {
                &[(0x7040, 0x7200), (0x7048, 0x6100)]
            });
            assert_eq!(exec(INTERPRETED, &mut regs, &mut mem), Ok(Some(caller)));
            assert_eq!(regs.sp(), 0x7050);
        }
        // A caller found from its stack pointer: the stack ends there rather than start it from
        // a guessed one.
        let mut regs = Registers::new(0x4100, 0x7000, 0);
        regs.set(regs::RBP, 0x7040);
        let mut mem = InterpreterWords(&[(0x7040, 0x7200), (0x7048, 0x9100)]);
        assert_eq!(
            exec(INTERPRETED, &mut regs, &mut mem),
            Err(policy::reason_for_read(
                crate::policy::ReadFailure::Unreadable
            ))
        );
    }

    #[test]
    fn a_function_that_fits_is_read_whole_for_its_paths() {
        // A frame built at the start; from offset 4 the path jumps to the function's own
        // epilogue, past `PATH_BYTES`.
        let mut code = vec![0xcc; 1600];
        code[..4].copy_from_slice(&[0x55, 0x48, 0x89, 0xe5]); // push rbp; mov rbp,rsp
        code[4..9].copy_from_slice(&[0xe9, 0xf3, 0x05, 0x00, 0x00]); // jmp 1532
        code[1532..1534].copy_from_slice(&[0x5d, 0xc3]); // pop rbp; ret
        let text = 0x1000;
        let binary = SyntheticBinary::new(text, &code, 0, &[], &[(text, text + 1600, "f")]);
        let mut buf = [0u8; 4096 + PATH_BYTES];
        let whole = read_path(&binary, text, 4, &mut buf).expect("readable");
        assert_eq!(whole.len(), 1600);
        assert_eq!(
            leaf_rule_on_path(whole, 4),
            Some(NoCfiRule::ReturnAt {
                ra: 8,
                saved_bp: Some(0)
            })
        );
        // Cut at `PATH_BYTES` past the instruction, the jump reads as a tail call and the saved
        // `rbp` as the return address: what the whole read avoids.
        assert_eq!(
            leaf_rule_on_path(&whole[..4 + PATH_BYTES], 4),
            Some(NoCfiRule::ReturnAtSp)
        );
    }
}
