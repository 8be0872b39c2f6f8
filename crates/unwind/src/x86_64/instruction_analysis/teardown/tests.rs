use super::*;
use crate::x86_64::instruction_analysis::NoCfiRule;
use crate::x86_64::instruction_analysis::jit::{
    caller_rule, caller_rule_on_path, leaf_rule_on_path,
};

/// The shape of V8's `ReturnHandler`: a frameless fast path that returns, and a deferred frame
/// around a runtime call that jumps back to that `ret` after popping the frame.
const DEFERRED_FRAME: &[u8] = &[
    0x48, 0x89, 0xea, // 0 mov rdx,rbp
    0x45, 0x85, 0xc0, // 3 test r8d,r8d
    0x7c, 0x01, // 6 jl 9
    0xc3, // 8 ret
    0x55, // 9 push rbp
    0x48, 0x89, 0xe5, // 10 mov rbp,rsp
    0x6a, 0x22, // 13 push 0x22
    0x48, 0x83, 0xec, 0x08, // 15 sub rsp,8
    0xe8, 0, 0, 0, 0, // 19 call
    0x48, 0x8b, 0x45, 0xf0, // 24 mov rax,[rbp-0x10]
    0x48, 0x89, 0xec, // 28 mov rsp,rbp
    0x5d, // 31 pop rbp
    0xeb, 0xe6, // 32 jmp 8
];

#[test]
fn deferred_frame_is_found_on_the_path_to_ret() {
    assert!(frame_pointer_teardown(DEFERRED_FRAME, 24));
    assert_eq!(
        caller_rule_on_path(DEFERRED_FRAME, 24),
        Some(NoCfiRule::FramePointer)
    );
    // The prologue simulation stops at the first `ret` and misses the frame.
    assert_eq!(caller_rule(DEFERRED_FRAME, 24), Some(NoCfiRule::ReturnAtSp));
    // On the frameless path no frame is torn down: the epilogue scan decides.
    assert!(!frame_pointer_teardown(DEFERRED_FRAME, 3));
    assert_eq!(
        leaf_rule_on_path(DEFERRED_FRAME, 3),
        Some(NoCfiRule::ReturnAtSp)
    );
    // At the deferred frame's `mov rbp,rsp`: the frame the path tears down is half built.
    assert_eq!(
        leaf_rule_on_path(DEFERRED_FRAME, 10),
        Some(NoCfiRule::ReturnAtSpPlus8)
    );
    // Inside the deferred frame, before and after the call.
    assert_eq!(
        leaf_rule_on_path(DEFERRED_FRAME, 19),
        Some(NoCfiRule::FramePointer)
    );
}

/// The shape of V8's `BaselineOutOfLinePrologue`: the return address popped into `r15`, a frame
/// built for the caller, then either returned through `push r15; ret` or, for the stack guard,
/// pushed back under a frame of the builtin's own around a runtime call.
const OUT_OF_LINE_PROLOGUE: &[u8] = &[
    0x41, 0x5f, // 0 pop r15
    0x55, // 2 push rbp
    0x48, 0x89, 0xe5, // 3 mov rbp,rsp
    0x56, // 6 push rsi
    0x57, // 7 push rdi
    0x4d, 0x3b, 0x55, 0xa0, // 8 cmp r10,[r13-0x60]
    0x72, 0x04, // 12 jb 18
    0x41, 0x57, // 14 push r15
    0xc3, // 16 ret
    0xcc, // 17 int3
    0x41, 0x57, // 18 push r15
    0x55, // 20 push rbp
    0x48, 0x89, 0xe5, // 21 mov rbp,rsp
    0x52, // 24 push rdx
    0xe8, 0, 0, 0, 0,    // 25 call
    0x5a, // 30 pop rdx
    0x48, 0x89, 0xec, // 31 mov rsp,rbp
    0x5d, // 34 pop rbp
    0xc3, // 35 ret
];

#[test]
fn return_address_pushed_back_under_a_frame() {
    assert!(frame_pointer_teardown(OUT_OF_LINE_PROLOGUE, 30));
    assert_eq!(
        caller_rule_on_path(OUT_OF_LINE_PROLOGUE, 30),
        Some(NoCfiRule::FramePointer)
    );
    // While the return address is in `r15`, `rbp` frames the caller's caller: the frame-pointer
    // rule would skip the caller, and the scan must not claim it.
    assert!(!frame_pointer_teardown(OUT_OF_LINE_PROLOGUE, 6));
    assert_ne!(
        leaf_rule_on_path(OUT_OF_LINE_PROLOGUE, 6),
        Some(NoCfiRule::FramePointer)
    );
}

/// A frame torn down, then a tail call with stack arguments slid under the return address
/// (V8's `LoadIC` into `CEntry`): `push rcx; push rax; push rbx; push [rsp+0x18];
/// mov [rsp+0x20],rdx; jmp`.
fn tail_call(copy_return_address: bool) -> Vec<u8> {
    let mut code = vec![
        0x55, // 0 push rbp
        0x48, 0x89, 0xe5, // 1 mov rbp,rsp
        0x48, 0x83, 0xec, 0x40, // 4 sub rsp,0x40
        0x48, 0x89, 0x55, 0xf0, // 8 mov [rbp-0x10],rdx
        0x48, 0x89, 0xec, // 12 mov rsp,rbp
        0x5d, // 15 pop rbp
        0x51, // push rcx
        0x50, // push rax
        0x53, // push rbx
    ];
    if copy_return_address {
        code.extend([0xff, 0x74, 0x24, 0x18]); // push [rsp+0x18]
        code.extend([0x48, 0x89, 0x54, 0x24, 0x20]); // mov [rsp+0x20],rdx
    }
    code.extend([0xe9, 0, 1, 0, 0]); // jmp out of the function
    code
}

#[test]
fn tail_call_returns_to_the_copied_return_address() {
    assert!(frame_pointer_teardown(&tail_call(true), 8));
    // Arguments pushed over the return address: the callee would return into them.
    assert!(!frame_pointer_teardown(&tail_call(false), 8));
}

/// `mov rsp,rbp; pop rbp; pop r8; lea rsp,[rsp+rbx*8]; push R; ret` (V8's `DropArguments`).
fn drop_arguments(push: [u8; 2]) -> Vec<u8> {
    let mut code = vec![
        0x48, 0x8b, 0x45, 0xe8, // 0 mov rax,[rbp-0x18]
        0x48, 0x89, 0xec, // 4 mov rsp,rbp
        0x5d, // 7 pop rbp
        0x41, 0x58, // 8 pop r8
        0x48, 0x8d, 0x24, 0xdc, // 10 lea rsp,[rsp+rbx*8]
    ];
    code.extend(push);
    code.push(0xc3);
    code
}

#[test]
fn arguments_dropped_above_the_return_address() {
    assert!(frame_pointer_teardown(&drop_arguments([0x41, 0x50]), 0)); // push r8
    assert!(!frame_pointer_teardown(&drop_arguments([0x41, 0x51]), 0)); // push r9
}

#[test]
fn frame_slots_and_rbp_must_survive_until_the_teardown() {
    let teardown = [0x48, 0x89, 0xec, 0x5d, 0xc3]; // mov rsp,rbp; pop rbp; ret
    let with = |first: &[u8]| [first, &teardown[..]].concat();
    assert!(frame_pointer_teardown(&with(&[0x48, 0x89, 0x45, 0xf0]), 0)); // mov [rbp-0x10],rax
    assert!(!frame_pointer_teardown(&with(&[0x48, 0x89, 0x45, 0x08]), 0)); // mov [rbp+8],rax
    assert!(!frame_pointer_teardown(&with(&[0x48, 0x89, 0xc5]), 0)); // mov rbp,rax
    assert!(!frame_pointer_teardown(&with(&[0x5d]), 0)); // pop rbp
    // `leave` is the same teardown.
    assert!(frame_pointer_teardown(&[0x90, 0xc9, 0xc3], 0));
    // Without a teardown there is no frame to claim.
    assert!(!frame_pointer_teardown(&[0x90, 0xc3], 0));
    assert!(!frame_pointer_teardown(&[0x90], 0));
    assert!(!frame_pointer_teardown(&[0x90], 5));
}

/// A C call from inside a frame (`and rsp,-16` to align, `mov rsp,[rsp]` after), a loop, and a
/// branch to each side: every path is followed.
const ALIGNED_C_CALL: &[u8] = &[
    0x49, 0x89, 0xe2, // 0 mov r10,rsp
    0x48, 0x83, 0xe4, 0xf0, // 3 and rsp,-16
    0x4c, 0x89, 0x14, 0x24, // 7 mov [rsp],r10
    0xe8, 0, 0, 0, 0, // 11 call
    0x48, 0x8b, 0x24, 0x24, // 16 mov rsp,[rsp]
    0xff, 0xc9, // 20 dec ecx
    0x75, 0xfc, // 22 jnz 20
    0x85, 0xc0, // 24 test eax,eax
    0x74, 0x01, // 26 jz 29
    0xcc, // 28 int3
    0x48, 0x89, 0xec, // 29 mov rsp,rbp
    0x5d, // 32 pop rbp
    0xc3, // 33 ret
];

#[test]
fn every_path_is_followed() {
    assert!(frame_pointer_teardown(ALIGNED_C_CALL, 0));
    // A path that returns with `rbp` untouched shows there is no frame, whatever other paths
    // do: `jz 3; ret; mov rsp,rbp; pop rbp; ret`.
    let mixed = [0x74, 0x01, 0xc3, 0x48, 0x89, 0xec, 0x5d, 0xc3];
    assert!(!frame_pointer_teardown(&mixed, 0));
    assert!(frame_pointer_teardown(&mixed, 3));
}
