use super::*;

fn rule(r: NoCfiRule) -> Option<Option<NoCfiRule>> {
    Some(Some(r))
}

/// The shape of V8's `BaselineOutOfLinePrologue`: `pop r15`, a frame built for the caller, a
/// stack check, `push r15; ret` (and, on the slow path, a runtime call).
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
    0xe8, 0, 0, 0, 0,    // 24 call
    0x5d, // 29 pop rbp
    0xc3, // 30 ret
];

#[test]
fn return_address_in_a_register() {
    // Until `rbp` points at the frame built for the caller, the caller's `rbp` at the `ret` is
    // none of the leaf's values: no answer (the caller's frame rule would skip a frame).
    assert_eq!(
        leaf_return(OUT_OF_LINE_PROLOGUE, 0),
        rule(NoCfiRule::OutOfLinePrologue { ra: 0 })
    );
    for at in [2, 3] {
        assert_eq!(leaf_return(OUT_OF_LINE_PROLOGUE, at), Some(None), "at {at}");
    }
    // Popped into r15, for the rest of the frame's building.
    for at in [6, 7, 8, 12, 14] {
        assert_eq!(
            leaf_return(OUT_OF_LINE_PROLOGUE, at),
            rule(NoCfiRule::ReturnInRegister { reg: 15 }),
            "at {at}"
        );
    }
    // Pushed back: at [rsp] again.
    assert_eq!(
        leaf_return(OUT_OF_LINE_PROLOGUE, 16),
        rule(NoCfiRule::ReturnAtSp)
    );
}

/// V8's `BaselineLeaveFrame` tail: `pop rbp; pop r8; lea rsp,[rsp+rbx*8]; push r8; ret`.
const LEAVE_FRAME: &[u8] = &[
    0x5d, // 0 pop rbp
    0x41, 0x58, // 1 pop r8
    0x48, 0x8d, 0x24, 0xdc, // 3 lea rsp,[rsp+rbx*8]
    0x41, 0x50, // 7 push r8
    0xc3, // 9 ret
];

#[test]
fn arguments_dropped_under_a_return_address_in_a_register() {
    assert_eq!(
        leaf_return(LEAVE_FRAME, 0),
        rule(NoCfiRule::ReturnAt {
            ra: 8,
            saved_bp: Some(0)
        })
    );
    assert_eq!(leaf_return(LEAVE_FRAME, 1), rule(NoCfiRule::ReturnAtSp));
    assert_eq!(
        leaf_return(LEAVE_FRAME, 3),
        rule(NoCfiRule::ReturnInRegister { reg: 8 })
    );
    assert_eq!(
        leaf_return(LEAVE_FRAME, 7),
        rule(NoCfiRule::ReturnInRegister { reg: 8 })
    );
}

#[test]
fn no_answer_without_a_known_value() {
    // `mov rcx,[rcx+0x27]; push rcx; ret`: a tail call into a computed address.
    assert_eq!(leaf_return(&[0x48, 0x8b, 0x49, 0x27, 0x51, 0xc3], 0), None);
    // Paths that disagree: `jz 3; push r8; ret; push r9; ret`.
    assert_eq!(
        leaf_return(&[0x74, 0x03, 0x41, 0x50, 0xc3, 0x41, 0x51, 0xc3], 0),
        None
    );
    // A call on the way ends the path.
    assert_eq!(leaf_return(&[0xe8, 0, 0, 0, 0, 0xc3], 0), None);
}

#[test]
fn tail_call_through_a_register() {
    // V8's `CallFunction`: `mov rcx,[rdi+0x2f]; mov rcx,[rcx+0x27]; jmp rcx` with the caller's
    // return address at [rsp] for the callee.
    let code = [0x48, 0x8b, 0x4f, 0x2f, 0x48, 0x8b, 0x49, 0x27, 0xff, 0xe1];
    assert_eq!(leaf_return(&code, 0), rule(NoCfiRule::ReturnAtSp));
    // Arguments pushed over it first: the callee would return into them.
    let pushed = [0x51, 0xff, 0xe1];
    assert_eq!(leaf_return(&pushed, 0), None);
}

/// The shape of V8's `Call_*_Baseline_Compact` slow paths: a frame built (`push rbp; mov rbp,
/// rsp; push 0x22`), then dropped by loading the saved `rbp` back through the frame pointer and
/// moving `rsp` over it, and a tail call to the generic `Call`.
const FRAME_DROPPED_BEFORE_TAIL_CALL: &[u8] = &[
    0x55, // 0 push rbp
    0x48, 0x89, 0xe5, // 1 mov rbp,rsp
    0x6a, 0x22, // 4 push 0x22
    0x48, 0x8b, 0x6d, 0x00, // 6 mov rbp,[rbp+0x0]
    0x48, 0x83, 0xc4, 0x10, // 10 add rsp,0x10
    0xe9, 0x00, 0x01, 0x00, 0x00, // 14 jmp (out of the function)
];

#[test]
fn a_frame_dropped_before_a_tail_call_is_no_out_of_line_prologue() {
    // From the entry: the saved `rbp` read back through the frame pointer is the leaf's.
    assert_eq!(
        leaf_return(FRAME_DROPPED_BEFORE_TAIL_CALL, 0),
        rule(NoCfiRule::ReturnAtSp)
    );
    // After the push: the caller's `rbp` at [rsp], its return address above.
    assert_eq!(
        leaf_return(FRAME_DROPPED_BEFORE_TAIL_CALL, 1),
        rule(NoCfiRule::ReturnAt {
            ra: 8,
            saved_bp: Some(0)
        })
    );
    // With the frame pointer set before the sample, the word it reloads is not one the path
    // can place: no rule (the caller is not taken to be at its entry, which would skip it).
    for at in [4, 6] {
        assert_eq!(
            leaf_return(FRAME_DROPPED_BEFORE_TAIL_CALL, at),
            Some(None),
            "at {at}"
        );
    }
}
