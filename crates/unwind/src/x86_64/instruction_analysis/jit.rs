//! The frame state of JIT code, which has no CFI: where the return address and the caller's
//! `rbp` are at an instruction, decided from the function's start (perf map / jitdump) and its
//! instructions (decoded with iced-x86).
//!
//! Two analyses, both exact on the code JITs emit (fixed frames: `rsp` moves only in the
//! prologue, the epilogues, and around calls):
//!
//! 1. **Epilogue scan** (leaf only), forwards from the instruction pointer along the fall-through
//!    path (over conditional branches and calls, whose net effect on `rsp` is nil): adding up
//!    `pop`s and `add rsp, N` until a `ret` tells exactly how far above `rsp` the return address
//!    is, and where a `pop rbp` took the caller's `rbp` from. This covers every point of a frame
//!    whose path to `ret` is straight: the body of a frameless method, and every epilogue
//!    instruction including those after `pop rbp` (HotSpot's return poll, `ret`). It gives up
//!    (and leaves the decision to the prologue) at anything that moves `rsp` downwards, sets
//!    `rsp` from `rbp` (`leave`, `mov rsp, rbp`: a frame-pointer frame), writes `rbp`, or jumps.
//! 2. **Prologue simulation**, forwards from the function's start up to the instruction
//!    pointer: `push`, `sub rsp, N`, `lea rsp, [rsp-N]` move the return address further above
//!    `rsp`; `push rbp` records where the caller's `rbp` is; `mov rbp, rsp` or
//!    `lea rbp, [rsp+N]` pointing `rbp` at its saved copy establishes a standard frame pointer
//!    (`[rbp]` caller's `rbp`, `[rbp+8]` return address). The prologue ends at the first call,
//!    jump, return or upward `rsp` move; from there on the frame is what the prologue built.
//!
//! Caller frames (stopped at a call) use the prologue simulation alone.

use super::NoCfiRule;
use super::decode::State;
use super::epilogue::epilogue_scan;
use super::leaf_return::leaf_return;
use super::prologue::{fixed_frame, prologue_state};
use super::teardown::frame_pointer_teardown;
use crate::Memory;

/// The leaf rule at offset `ip_offset` of a function whose code starts at `start` (bytes from
/// the function's first instruction), with `at_ip` the bytes from the instruction pointer on.
/// `start` may be shorter than the function: the prologue simulation needs only its beginning.
pub fn leaf_rule(start: &[u8], ip_offset: usize, at_ip: &[u8]) -> Option<NoCfiRule> {
    if let Some(s) = epilogue_scan(at_ip) {
        return Some(s.rule());
    }
    prologue_state(start, ip_offset).map(State::rule)
}

/// The rule for a caller frame stopped at a call whose return address is at `ra_offset`.
pub fn caller_rule(start: &[u8], ra_offset: usize) -> Option<NoCfiRule> {
    prologue_state(start, ra_offset).map(State::rule)
}

/// The leaf rule at offset `ip_offset` of code that may build its frame off the straight path
/// from its start (V8's embedded builtins, whose frames live in deferred code): the epilogue
/// scan, then the [frame-teardown scan](super::teardown), then the
/// [values returned to](super::leaf_return), then the prologue simulation. `code`
/// holds the function's bytes from its start to past `ip_offset` (the teardown scan follows the
/// path within them).
pub fn leaf_rule_on_path(code: &[u8], ip_offset: usize) -> Option<NoCfiRule> {
    if let Some(s) = epilogue_scan(code.get(ip_offset..)?) {
        return Some(s.rule());
    }
    if frame_pointer_teardown(code, ip_offset) {
        return Some(NoCfiRule::FramePointer);
    }
    // About to set the frame pointer (`mov rbp, rsp`): the frame the path tears down will have
    // its saved `rbp` at `[rsp]` and the return address above it.
    if code
        .get(ip_offset..ip_offset + 3)
        .is_some_and(|b| MOV_RBP_RSP.contains(&b))
        && frame_pointer_teardown(code, ip_offset + 3)
    {
        return Some(NoCfiRule::ReturnAtSpPlus8);
    }
    if let Some(rule) = leaf_return(code, ip_offset) {
        return rule;
    }
    prologue_state(code, ip_offset).map(State::rule)
}

/// The caller rule at a call returning to offset `ra_offset` of such code (see
/// [`leaf_rule_on_path`]): the frame-teardown scan from the return address, then the prologue
/// simulation.
pub fn caller_rule_on_path(code: &[u8], ra_offset: usize) -> Option<NoCfiRule> {
    if frame_pointer_teardown(code, ra_offset) {
        return Some(NoCfiRule::FramePointer);
    }
    caller_rule(code, ra_offset)
}

/// The Tier-0 frame under a .NET OSR method, from the return address `ret` of the Tier-0
/// method's patchpoint call (in the JIT function `function`): the offsets of the real return
/// address and of the saved caller's `rbp` above the Tier-0 frame's `rsp` (the OSR method's
/// return-address slot plus 8). None unless `ret` follows a call in a method with a fixed
/// frame-pointer frame.
pub fn tier0_frame_in_memory<M: Memory + ?Sized>(
    function: std::ops::Range<u64>,
    ret: u64,
    mem: &mut M,
) -> Option<(u32, u32)> {
    let before_len = ret.checked_sub(function.start)?.min(8) as usize;
    let mut before = [0u8; 8];
    if before_len == 0
        || !mem.read_code(ret - before_len as u64, &mut before[..before_len])
        || !super::is_after_call(&before[..before_len])
    {
        return None;
    }
    let mut start = vec![0u8; (function.end - function.start).min(PROLOGUE_BYTES) as usize];
    if !mem.read_code(function.start, &mut start) {
        return None;
    }
    fixed_frame(&start)
}

/// `mov rbp, rsp` (both encodings).
const MOV_RBP_RSP: [&[u8]; 2] = [&[0x48, 0x89, 0xe5], &[0x48, 0x8b, 0xec]];

/// Bytes of a function's start read for the prologue simulation.
const PROLOGUE_BYTES: u64 = 512;
/// Bytes from the instruction pointer read for the epilogue scan.
const EPILOGUE_BYTES: u64 = 384;

/// The rule for the frame at `lookup` (the instruction pointer for the leaf, the return
/// address minus one for callers) in the JIT function `function`, reading its code from `mem`.
pub fn rule_in_memory<M: Memory + ?Sized>(
    function: std::ops::Range<u64>,
    lookup: u64,
    leaf: bool,
    mem: &mut M,
) -> Option<NoCfiRule> {
    let target = if leaf { lookup } else { lookup.checked_add(1)? };
    let offset = usize::try_from(target.checked_sub(function.start)?).ok()?;
    let mut start = vec![0u8; (function.end - function.start).min(PROLOGUE_BYTES) as usize];
    if !mem.read_code(function.start, &mut start) {
        return None;
    }
    // Past the entry a method made not entrant still has the frame its prologue built.
    if offset >= PATCHED_ENTRY_BYTES {
        restore_patched_entry(&mut start, function.end - function.start);
    }
    // Code entered by a jump to its prologue: simulated from there (see `entry_after_jump`).
    let mut entry = Vec::new();
    let (prologue, offset) = match entry_after_jump(&start, function.end - function.start) {
        Some(at) if offset > 0 => {
            entry.resize(
                (function.end - function.start - at).min(PROLOGUE_BYTES) as usize,
                0,
            );
            if !mem.read_code(function.start + at, &mut entry) {
                return None;
            }
            match prologue_state(&entry, usize::MAX) {
                // The code before the prologue runs in the frame it builds.
                Some(built) if built.fp && offset < at as usize => {
                    if !leaf {
                        return Some(built.rule());
                    }
                    (&entry[..], usize::MAX)
                }
                Some(built) if built.fp => (&entry[..], offset - at as usize),
                _ => (&start[..], offset),
            }
        }
        _ => (&start[..], offset),
    };
    if !leaf {
        return caller_rule(prologue, offset);
    }
    let mut at_ip = vec![0u8; function.end.saturating_sub(target).min(EPILOGUE_BYTES) as usize];
    if !mem.read_code(target, &mut at_ip) {
        at_ip.clear();
    }
    leaf_rule(prologue, offset, &at_ip)
}

/// Bytes of the `jmp rel32` HotSpot writes over a method's entry (see [`restore_patched_entry`]).
const PATCHED_ENTRY_BYTES: usize = 5;

/// Puts back the first instruction of a HotSpot method "made not entrant" (replaced by a better
/// compiled version, or invalidated): HotSpot overwrites the first 5 bytes of its entry with a
/// `jmp` to a stub outside it, so new calls go elsewhere, while the frames already running in
/// it go on in the frame their prologue built before the patch. That first instruction is one
/// of two, each 7 bytes long, whose last two bytes stay after the jump:
/// - the stack bang, `mov [rsp-N], eax` (`89 84 24` and a negative 32-bit displacement: `?? ff`
///   stays), followed by `push rbp` or a REX.W instruction; it moves nothing;
/// - in C2 code without a stack bang, `sub rsp, imm32` (`48 81 ec` and a small size: `00 00`
///   stays), followed by the save of `rbp` at the frame's top, `mov [rsp+size-8], rbp`, which
///   tells the size.
///
/// Recognised only behind a jump out of the function (`len` bytes); the instruction is put back
/// in `start` for the prologue simulation. Whether it was.
fn restore_patched_entry(start: &mut [u8], len: u64) -> bool {
    let [0xe9, r0, r1, r2, r3, left0, left1, ref rest @ ..] = *start else {
        return false;
    };
    let target = PATCHED_ENTRY_BYTES as i64 + i64::from(i32::from_le_bytes([r0, r1, r2, r3]));
    if (0..len as i64).contains(&target) {
        return false;
    }
    let original: [u8; PATCHED_ENTRY_BYTES] = match (left0, left1, rest) {
        (_, 0xff, [0x55 | 0x48, ..]) => [0x89, 0x84, 0x24, 0x00, 0x00],
        (0, 0, [0x48, 0x89, 0x6c, 0x24, d, ..]) => sub_rsp(u32::from(*d) + 8),
        (0, 0, [0x48, 0x89, 0xac, 0x24, d0, d1, d2, d3, ..]) => {
            match u32::from_le_bytes([*d0, *d1, *d2, *d3]).checked_add(8) {
                Some(size) if size < 0x1_0000 => sub_rsp(size),
                _ => return false,
            }
        }
        _ => return false,
    };
    start[..PATCHED_ENTRY_BYTES].copy_from_slice(&original);
    true
}

/// The first 5 bytes of `sub rsp, imm32` for a size below 64 KiB.
fn sub_rsp(size: u32) -> [u8; PATCHED_ENTRY_BYTES] {
    let [s0, s1, ..] = size.to_le_bytes();
    [0x48, 0x81, 0xec, s0, s1]
}

/// When a function's first instruction jumps forward within it (`len` bytes), the offset it
/// lands on. V8's regular-expression code starts so: its prologue (`push rbp; mov rbp, rsp`,
/// the saved registers) comes after the matching code, which it jumps back into, so everything
/// between the first instruction and the prologue runs in the frame the prologue builds.
fn entry_after_jump(start: &[u8], len: u64) -> Option<u64> {
    let mut decoder = iced_x86::Decoder::with_ip(64, start, 0, iced_x86::DecoderOptions::NONE);
    let jump = decoder.decode();
    super::decode::jump_within(&jump, usize::try_from(len).ok()?)
        .filter(|&at| at > jump.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Code at address 0x1000 and nothing else.
    struct CodeAt(&'static [u8]);

    impl Memory for CodeAt {
        fn read_stack_u64(&mut self, _addr: u64) -> Result<u64, crate::policy::ReadFailure> {
            Err(crate::policy::ReadFailure::Unreadable)
        }
        fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> bool {
            let Some(at) = addr.checked_sub(0x1000).map(|a| a as usize) else {
                return false;
            };
            match self.0.get(at..at + buf.len()) {
                Some(bytes) => {
                    buf.copy_from_slice(bytes);
                    true
                }
                None => false,
            }
        }
    }

    /// The shape of V8's regular-expression code: a jump to the prologue at the end, which
    /// builds a frame-pointer frame and jumps back into the matching code.
    const ENTRY_AFTER_BODY: &[u8] = &[
        0xe9, 0x0c, 0x00, 0x00, 0x00, // 0 jmp 17
        0x48, 0x83, 0xc7, 0x07, // 5 add rdi,7
        0x85, 0xc0, // 9 test eax,eax
        0x75, 0xf8, // 11 jnz 5
        0xeb, 0xf6, // 13 jmp 5
        0xcc, 0xcc, // 15 int3 (padding)
        0x55, // 17 push rbp
        0x48, 0x89, 0xe5, // 18 mov rbp,rsp
        0x53, // 21 push rbx
        0x6a, 0x00, // 22 push 0
        0xeb, 0xe7, // 24 jmp 5
    ];

    #[test]
    fn code_entered_by_a_jump_to_its_prologue_runs_in_its_frame() {
        let function = 0x1000..0x1000 + ENTRY_AFTER_BODY.len() as u64;
        let mut mem = CodeAt(ENTRY_AFTER_BODY);
        let mut rule =
            |off: u64, leaf: bool| rule_in_memory(function.clone(), 0x1000 + off, leaf, &mut mem);
        // At the first instruction nothing is pushed yet; in the prologue, what it pushed.
        assert_eq!(rule(0, true), Some(NoCfiRule::ReturnAtSp));
        assert_eq!(rule(17, true), Some(NoCfiRule::ReturnAtSp));
        assert_eq!(
            rule(18, true),
            Some(NoCfiRule::ReturnAt {
                ra: 8,
                saved_bp: Some(0)
            })
        );
        // The matching code before the prologue: the frame it built (it was read as nothing
        // pushed, from the jump that begins the code).
        for off in [5, 9, 11, 13] {
            assert_eq!(rule(off, true), Some(NoCfiRule::FramePointer), "at {off}");
        }
        assert_eq!(rule(8, false), Some(NoCfiRule::FramePointer));
        // Without the frame pointer set by what the jump lands on, the code is read as before.
        let mut plain = ENTRY_AFTER_BODY.to_vec();
        plain[18..21].copy_from_slice(&[0x90, 0x90, 0x90]);
        let plain: &'static [u8] = plain.leak();
        let mut mem = CodeAt(plain);
        assert_eq!(
            rule_in_memory(function.clone(), 0x1000 + 9, true, &mut mem),
            leaf_rule(plain, 9, &plain[9..])
        );
    }

    /// `push rbp; mov rbp,rsp; push rbx; sub rsp,0x18; mov eax,[rdi]; test eax,eax; jz +2;
    ///  call rax; add rsp,0x18; pop rbx; pop rbp; ret`
    const FP_FUNC: &[u8] = &[
        0x55, // 0 push rbp
        0x48, 0x89, 0xe5, // 1 mov rbp,rsp
        0x53, // 4 push rbx
        0x48, 0x83, 0xec, 0x18, // 5 sub rsp,0x18
        0x8b, 0x07, // 9 mov eax,[rdi]
        0x85, 0xc0, // 11 test eax,eax
        0x74, 0x02, // 13 jz +2
        0xff, 0xd0, // 15 call rax
        0x48, 0x83, 0xc4, 0x18, // 17 add rsp,0x18
        0x5b, // 21 pop rbx
        0x5d, // 22 pop rbp
        0xc3, // 23 ret
    ];

    fn leaf(code: &[u8], off: usize) -> Option<NoCfiRule> {
        leaf_rule(code, off, &code[off..])
    }

    #[test]
    fn frame_pointer_function_at_every_instruction() {
        use NoCfiRule::*;
        assert_eq!(leaf(FP_FUNC, 0), Some(ReturnAtSp));
        let pushed_bp = ReturnAt {
            ra: 8,
            saved_bp: Some(0),
        };
        assert_eq!(leaf(FP_FUNC, 1), Some(pushed_bp));
        assert_eq!(leaf(FP_FUNC, 4), Some(FramePointer));
        assert_eq!(leaf(FP_FUNC, 5), Some(FramePointer));
        // In the body the path to `ret` is straight (over the branch and the call).
        let body = ReturnAt {
            ra: 0x28,
            saved_bp: Some(0x20),
        };
        assert_eq!(leaf(FP_FUNC, 9), Some(body));
        assert_eq!(leaf(FP_FUNC, 15), Some(body));
        // From the epilogue on, the scan to `ret` is exact.
        assert_eq!(
            leaf(FP_FUNC, 17),
            Some(ReturnAt {
                ra: 0x18 + 16,
                saved_bp: Some(0x18 + 8)
            })
        );
        assert_eq!(
            leaf(FP_FUNC, 21),
            Some(ReturnAt {
                ra: 16,
                saved_bp: Some(8)
            })
        );
        assert_eq!(leaf(FP_FUNC, 22), Some(pushed_bp));
        assert_eq!(leaf(FP_FUNC, 23), Some(ReturnAtSp));
        // A caller stopped after `call rax`.
        assert_eq!(caller_rule(FP_FUNC, 17), Some(FramePointer));
    }

    /// A frameless function (CoreCLR style): `push rbx; sub rsp,0x20; loop: dec ecx; jnz loop;
    /// call [rip+0]; add rsp,0x20; pop rbx; ret`.
    const FRAMELESS: &[u8] = &[
        0x53, // 0 push rbx
        0x48, 0x83, 0xec, 0x20, // 1 sub rsp,0x20
        0xff, 0xc9, // 5 dec ecx
        0x75, 0xfc, // 7 jnz 5
        0xff, 0x15, 0, 0, 0, 0, // 9 call [rip]
        0x48, 0x83, 0xc4, 0x20, // 15 add rsp,0x20
        0x5b, // 19 pop rbx
        0xc3, // 20 ret
    ];

    #[test]
    fn frameless_function_at_every_instruction() {
        use NoCfiRule::*;
        assert_eq!(leaf(FRAMELESS, 0), Some(ReturnAtSp));
        assert_eq!(
            leaf(FRAMELESS, 1),
            Some(ReturnAt {
                ra: 8,
                saved_bp: None
            })
        );
        let body = ReturnAt {
            ra: 0x28,
            saved_bp: None,
        };
        assert_eq!(leaf(FRAMELESS, 5), Some(body));
        assert_eq!(leaf(FRAMELESS, 7), Some(body));
        assert_eq!(leaf(FRAMELESS, 9), Some(body));
        assert_eq!(leaf(FRAMELESS, 15), Some(body));
        assert_eq!(
            leaf(FRAMELESS, 19),
            Some(ReturnAt {
                ra: 8,
                saved_bp: None
            })
        );
        assert_eq!(leaf(FRAMELESS, 20), Some(ReturnAtSp));
        assert_eq!(caller_rule(FRAMELESS, 15), Some(body));
    }

    /// HotSpot with -XX:+PreserveFramePointer: stack bang, `push rbp; mov rbp,rsp; sub rsp,0x10`,
    /// and an epilogue whose return poll sits between `pop rbp` and `ret`.
    const HOTSPOT: &[u8] = &[
        0x89, 0x84, 0x24, 0x00, 0xc0, 0xfe, 0xff, // 0 mov [rsp-0x14000],eax
        0x55, // 7 push rbp
        0x48, 0x89, 0xe5, // 8 mov rbp,rsp
        0x48, 0x83, 0xec, 0x10, // 11 sub rsp,0x10
        0x01, 0xf7, // 15 add edi,esi
        0x48, 0x83, 0xc4, 0x10, // 17 add rsp,0x10
        0x5d, // 21 pop rbp
        0x49, 0x3b, 0xa7, 0x20, 0x03, 0x00, 0x00, // 22 cmp rsp,[r15+0x320]
        0x0f, 0x87, 0x10, 0x00, 0x00, 0x00, // 29 ja +0x10
        0xc3, // 35 ret
    ];

    #[test]
    fn hotspot_entry_and_return_poll() {
        use NoCfiRule::*;
        assert_eq!(leaf(HOTSPOT, 0), Some(ReturnAtSp));
        assert_eq!(leaf(HOTSPOT, 7), Some(ReturnAtSp));
        assert_eq!(
            leaf(HOTSPOT, 8),
            Some(ReturnAt {
                ra: 8,
                saved_bp: Some(0)
            })
        );
        assert_eq!(leaf(HOTSPOT, 11), Some(FramePointer));
        assert_eq!(
            leaf(HOTSPOT, 15),
            Some(ReturnAt {
                ra: 0x18,
                saved_bp: Some(0x10)
            })
        );
        assert_eq!(leaf(HOTSPOT, 22), Some(ReturnAtSp));
        assert_eq!(leaf(HOTSPOT, 29), Some(ReturnAtSp));
    }

    /// Mono without a frame pointer: `sub rsp,0x18; mov [rsp],rbx; mov [rsp+8],rbp;
    /// call rax; lea rbp,[rbp+0]; mov rbx,[rsp]; mov rbp,[rsp+8]; add rsp,0x18; ret`.
    const MONO: &[u8] = &[
        0x48, 0x83, 0xec, 0x18, // 0 sub rsp,0x18
        0x48, 0x89, 0x1c, 0x24, // 4 mov [rsp],rbx
        0x48, 0x89, 0x6c, 0x24, 0x08, // 8 mov [rsp+8],rbp
        0xff, 0xd0, // 13 call rax
        0x48, 0x8d, 0x6d, 0x00, // 15 lea rbp,[rbp+0]
        0x48, 0x8b, 0x1c, 0x24, // 19 mov rbx,[rsp]
        0x48, 0x8b, 0x6c, 0x24, 0x08, // 23 mov rbp,[rsp+8]
        0x48, 0x83, 0xc4, 0x18, // 28 add rsp,0x18
        0xc3, // 32 ret
    ];

    #[test]
    fn mono_saves_rbp_with_a_mov() {
        use NoCfiRule::*;
        let framed = ReturnAt {
            ra: 0x18,
            saved_bp: Some(8),
        };
        assert_eq!(caller_rule(MONO, 15), Some(framed));
        assert_eq!(leaf(MONO, 13), Some(framed));
        assert_eq!(leaf(MONO, 19), Some(framed));
        // After the restore, `rbp` holds the caller's value again.
        assert_eq!(
            leaf(MONO, 28),
            Some(ReturnAt {
                ra: 0x18,
                saved_bp: None
            })
        );
        assert_eq!(
            leaf(MONO, 4),
            Some(ReturnAt {
                ra: 0x18,
                saved_bp: None
            })
        );
    }

    #[test]
    fn hotspot_code_made_not_entrant_keeps_its_frame() {
        use NoCfiRule::*;
        let code = DOWN_C1_NOT_ENTRANT;
        let function = 0x1000..0x1000 + code.len() as u64;
        let framed = Some(ReturnAt {
            ra: 0x38,
            saved_bp: Some(0x30),
        });
        // Its calls to spin and to itself return to 0xbc and 0xf4; a sample in its body.
        for ret in [0xbc, 0xf4] {
            let rule = rule_in_memory(function.clone(), 0x1000 + ret - 1, false, &mut CodeAt(code));
            assert_eq!(rule, framed, "returning to {ret:#x}");
        }
        assert_eq!(
            rule_in_memory(function.clone(), 0x1000 + 0x20, true, &mut CodeAt(code)),
            framed
        );
        // At the patched jump nothing is pushed: the call goes to the stub.
        assert_eq!(
            rule_in_memory(function.clone(), 0x1000, true, &mut CodeAt(code)),
            Some(ReturnAtSp)
        );
        // Only a jump out of the function, over the remains of a stack bang, is such a patch.
        let mut within = code.to_vec();
        within[1..5].copy_from_slice(&0x40i32.to_le_bytes());
        assert!(!restore_patched_entry(&mut within, code.len() as u64));
        let mut other = code.to_vec();
        other[6] = 0x00;
        assert!(!restore_patched_entry(&mut other, code.len() as u64));
        assert!(restore_patched_entry(&mut code.to_vec(), code.len() as u64));

        // C2 code without a stack bang: `sub rsp, 0x38` overwritten, `00 00` left, then
        // `mov [rsp+0x30], rbp`; a sample in its loop.
        let code = LAMBDA_FORM_C2_NOT_ENTRANT;
        let function = 0x1000..0x1000 + code.len() as u64;
        assert_eq!(
            rule_in_memory(function, 0x1000 + 0x3f, true, &mut CodeAt(code)),
            Some(ReturnAt {
                ra: 0x38,
                saved_bp: Some(0x30)
            })
        );
    }

    /// The start of a `LambdaForm$MH.invoke` C2 compiled (OpenJDK 17), its call site's target
    /// inlined, after it was made not entrant (the call site retargeted).
    const LAMBDA_FORM_C2_NOT_ENTRANT: &[u8] = &[
        0xe9, 0x7b, 0x8c, 0xaa, 0xff, 0x00, 0x00, 0x48, 0x89, 0x6c, 0x24, 0x30, 0x85, 0xd2, 0x0f,
        0x8e, 0x95, 0x02, 0x00, 0x00, 0x4c, 0x63, 0xd2, 0x49, 0x83, 0xc2, 0xf1, 0x41, 0xbb, 0x1f,
        0x00, 0x00, 0x00, 0x49, 0xc7, 0xc0, 0x00, 0x00, 0x00, 0x80, 0x49, 0x81, 0xfa, 0x00, 0x00,
        0x00, 0x80, 0x4d, 0x0f, 0x4c, 0xd0, 0x41, 0x8b, 0xfa, 0x83, 0xff, 0x01, 0x0f, 0x8e, 0x6e,
        0x02, 0x00, 0x00, 0x33, 0xc0, 0xb9, 0x1f, 0x00, 0x00, 0x00, 0x41, 0xba, 0x01, 0x00, 0x00,
        0x00, 0xbb, 0x20, 0x00, 0x00, 0x00, 0xe9, 0xc8, 0x01, 0x00, 0x00, 0x66, 0x66, 0x0f, 0x1f,
        0x84, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    /// `int Rec.down(int, int)` compiled by C1 (OpenJDK 17, `tests/jit/Rec.java`) after C2's
    /// version replaced it: its entry `mov [rsp-0x14000], eax` overwritten by `jmp` (`e9 …`,
    /// then `fe ff` left), `push rbp; sub rsp, 0x30`, calls returning to 0xbc and 0xf4.
    const DOWN_C1_NOT_ENTRANT: &[u8] = &[
        0xe9, 0x9b, 0x28, 0x57, 0x07, 0xfe, 0xff, 0x55, 0x48, 0x83, 0xec, 0x30, 0x4c, 0x8b, 0xc6,
        0x48, 0xbe, 0xa0, 0x37, 0x40, 0x5f, 0x0d, 0x7f, 0x00, 0x00, 0x8b, 0xbe, 0xf4, 0x00, 0x00,
        0x00, 0x83, 0xc7, 0x02, 0x89, 0xbe, 0xf4, 0x00, 0x00, 0x00, 0x81, 0xe7, 0xfe, 0x07, 0x00,
        0x00, 0x83, 0xff, 0x00, 0x0f, 0x84, 0xb4, 0x03, 0x00, 0x00, 0x41, 0x81, 0xf8, 0x00, 0x00,
        0x00, 0x80, 0x48, 0xbe, 0xa0, 0x37, 0x40, 0x5f, 0x0d, 0x7f, 0x00, 0x00, 0x48, 0xc7, 0xc7,
        0x48, 0x01, 0x00, 0x00, 0x0f, 0x84, 0x07, 0x00, 0x00, 0x00, 0x48, 0xc7, 0xc7, 0x38, 0x01,
        0x00, 0x00, 0x48, 0x8b, 0x1c, 0x3e, 0x48, 0x8d, 0x5b, 0x01, 0x48, 0x89, 0x1c, 0x3e, 0x0f,
        0x84, 0x9b, 0x00, 0x00, 0x00, 0x41, 0x83, 0xf8, 0x00, 0x48, 0xbe, 0xa0, 0x37, 0x40, 0x5f,
        0x0d, 0x7f, 0x00, 0x00, 0x48, 0xc7, 0xc7, 0x58, 0x01, 0x00, 0x00, 0x0f, 0x85, 0x07, 0x00,
        0x00, 0x00, 0x48, 0xc7, 0xc7, 0x68, 0x01, 0x00, 0x00, 0x48, 0x8b, 0x1c, 0x3e, 0x48, 0x8d,
        0x5b, 0x01, 0x48, 0x89, 0x1c, 0x3e, 0x0f, 0x85, 0x2f, 0x00, 0x00, 0x00, 0x48, 0xbe, 0xa0,
        0x37, 0x40, 0x5f, 0x0d, 0x7f, 0x00, 0x00, 0x48, 0x83, 0x86, 0x78, 0x01, 0x00, 0x00, 0x01,
        0x48, 0x8b, 0xf2, 0xe8, 0x04, 0xc9, 0xab, 0x07, 0xff, 0xc0, 0x48, 0x83, 0xc4, 0x30, 0x5d,
        0x49, 0x3b, 0xa7, 0x40, 0x03, 0x00, 0x00, 0x0f, 0x87, 0x3c, 0x03, 0x00, 0x00, 0xc3, 0x48,
        0xbe, 0xa0, 0x37, 0x40, 0x5f, 0x0d, 0x7f, 0x00, 0x00, 0x48, 0x83, 0x86, 0x88, 0x01, 0x00,
        0x00, 0x01, 0x41, 0xff, 0xc8, 0x49, 0x8b, 0xf0, 0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0xe8,
        0x0c, 0xff, 0xff, 0xff, 0xff, 0xc0, 0x48, 0x83, 0xc4, 0x30, 0x5d, 0x49, 0x3b, 0xa7, 0x40,
        0x03, 0x00, 0x00, 0x0f, 0x87, 0x1a, 0x03, 0x00, 0x00, 0xc3,
    ];

    #[test]
    fn hotspot_osr_code_enters_after_its_padding() {
        use NoCfiRule::*;
        // C2 on-stack-replacement code: call <stub>; nopw (padding); mov [rsp-0x14000],eax;
        // push rbp; sub rsp,0x30; mov r13,[rsi]; call r10; movabs rbp,imm (rbp reused).
        let code = [
            0xe8, 0xbb, 0xd1, 0x35, 0x16, // 0 call
            0x66, 0x66, 0x66, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0, // 5 nopw
            0x89, 0x84, 0x24, 0x00, 0xc0, 0xfe, 0xff, // 0x10 stack bang
            0x55, // 0x17 push rbp
            0x48, 0x83, 0xec, 0x30, // 0x18 sub rsp,0x30
            0x4c, 0x8b, 0x2e, // 0x1c mov r13,[rsi]
            0x41, 0xff, 0xd2, // 0x1f call r10
            0x48, 0xbd, 0xd8, 0x8a, 0xc1, 0x9e, 0x06, 0, 0, 0, // 0x22 movabs rbp
            0x41, 0xff, 0xd2, // 0x2c call r10
        ];
        let framed = ReturnAt {
            ra: 0x38,
            saved_bp: Some(0x30),
        };
        assert_eq!(leaf_rule(&code, 0x10, &code[0x10..]), Some(ReturnAtSp));
        assert_eq!(
            leaf_rule(&code, 0x18, &code[0x18..]),
            Some(ReturnAt {
                ra: 8,
                saved_bp: Some(0)
            })
        );
        assert_eq!(leaf_rule(&code, 0x1c, &code[0x1c..]), Some(framed));
        assert_eq!(caller_rule(&code, 0x22), Some(framed));
        assert_eq!(caller_rule(&code, 0x2f), Some(framed));
    }

    #[test]
    fn v8_baseline_code_calls_its_prologue() {
        // mov ebx,0x40; call +0 (the out-of-line prologue); push rax; call +0
        let code = [
            0xbb, 0x40, 0, 0, 0, 0xe8, 0, 0, 0, 0, 0x50, 0xe8, 0, 0, 0, 0,
        ];
        assert_eq!(leaf_rule(&code, 5, &code[5..]), Some(NoCfiRule::ReturnAtSp));
        assert_eq!(
            leaf_rule(&code, 10, &code[10..]),
            Some(NoCfiRule::FramePointer)
        );
        assert_eq!(caller_rule(&code, 16), Some(NoCfiRule::FramePointer));
    }

    #[test]
    fn a_lea_frame_pointer_and_an_undecodable_function() {
        // CoreCLR: push rbp; push rbx; sub rsp,8; lea rbp,[rsp+0x10]; nop; call [rax]
        let code = [
            0x55, 0x53, 0x48, 0x83, 0xec, 0x08, 0x48, 0x8d, 0x6c, 0x24, 0x10, 0x90, 0xff, 0x10,
        ];
        assert_eq!(
            leaf_rule(&code, 6, &code[6..]),
            Some(NoCfiRule::ReturnAt {
                ra: 0x18,
                saved_bp: Some(0x10)
            })
        );
        assert_eq!(caller_rule(&code, 14), Some(NoCfiRule::FramePointer));
        // `and rsp,-16` is not modelled: no guess.
        let odd = [0x48, 0x83, 0xe4, 0xf0, 0x90, 0xe9, 0, 0, 0, 0];
        assert_eq!(leaf_rule(&odd, 4, &odd[4..]), None);
    }
}
