//! x86-64 instruction analysis for code without CFI: where the return address and the caller's
//! `rbp` are at an instruction, and whether a return address follows a call.
//!
//! - [`native`]: ahead-of-time code without CFI (frame-pointer builds): the handful of byte
//!   patterns that decide a frame's state (`endbr64`, `push %rbp`, `mov %rsp,%rbp`, `ret`).
//! - [`jit`]: JIT code, whose function bounds come from the runtime's perf map or jitdump: the
//!   instructions are decoded (iced-x86) and the frame is rebuilt by the [`prologue`] simulation
//!   and the [`epilogue`] scan; code whose frame is built off the path from its start (V8's
//!   builtins) also by the [`teardown`] scan along the path to its return, and a leaf that
//!   keeps its return address in a register by [`leaf_return`].
//! - [`is_after_call`]: the check every recovered return address passes.
//!
//! Both analyses answer with one [`NoCfiRule`], which `nocfi` executes.

mod decode;
pub mod epilogue;
pub mod jit;
pub mod leaf_return;
pub mod native;
pub mod prologue;
pub mod teardown;

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
    /// A frame of HotSpot's template interpreter: a frame-pointer frame that also keeps its
    /// caller's stack pointer ("sender sp") at `[rbp-8]`. The two differ when the caller is
    /// compiled code: the adapter that enters the interpreter from compiled code lowers the
    /// stack for the interpreter's arguments below the caller's frame, so `rbp+16` lies below
    /// the caller's stack pointer, and the compiled caller, whose frame is found from its stack
    /// pointer, must start from the sender sp. While the frame is being built (`[rbp-8]` not
    /// pushed yet, `rsp == rbp`) the sender sp is still in `r13`, where the adapter put it.
    InterpreterFrame,
    /// Return address at `[sp+ra]`; the caller's `rbp` at `[sp+saved_bp]` when given, else still
    /// in `rbp` (JIT code: see `jit::frame_state`).
    ReturnAt {
        /// Offset of the return address from `sp`.
        ra: u32,
        /// Offset of the saved caller's `rbp` from `sp`, once pushed.
        saved_bp: Option<u32>,
    },
    /// The leaf keeps the return address in a register (DWARF number `reg`) while it rearranges
    /// the stack (V8's `BaselineOutOfLinePrologue`, `BaselineLeaveFrame`: see
    /// [`leaf_return`]); `rbp` is still the caller's. The caller's stack pointer is taken as the
    /// leaf's (it is not known exactly; the frames above are found through `rbp`).
    ReturnInRegister {
        /// DWARF number of the register.
        reg: u16,
    },
    /// An out-of-line prologue its caller called first thing, before it built the caller's frame
    /// (V8's `BaselineOutOfLinePrologue` before its `mov rbp, rsp`; see [`leaf_return`]): the
    /// return address at `[sp+ra]`, `rbp` the caller's caller's, and the caller, stopped at that
    /// call, has pushed nothing (its frame rule there, which counts on the frame being built, is
    /// replaced by [`NoCfiRule::ReturnAtSp`]).
    OutOfLinePrologue {
        /// Offset of the return address from `sp`.
        ra: u32,
    },
    /// The stack pointer was aligned down for a C call (V8's `PrepareCallCFunction`: `mov r10,
    /// rsp; sub rsp, 8; and rsp, -16; mov [rsp], r10`), so the frame is found through the stack
    /// pointer from before, which the code saved at `[sp+slot]`: the return address is at
    /// `[saved+ra]`, the caller's `rbp` at `[saved+saved_bp]` when given, else still in `rbp`.
    ReturnAtSavedSp {
        /// Offset from `sp` of the slot holding the stack pointer from before the alignment.
        slot: u32,
        /// Offset of the return address from that stack pointer.
        ra: u32,
        /// Offset of the saved caller's `rbp` from that stack pointer, once pushed.
        saved_bp: Option<u32>,
    },
    /// A .NET On-Stack-Replacement method: its frame sits on the frame of the Tier-0 method it
    /// continues, which it leaves in place and returns through. Its own return-address slot holds
    /// the return address of the Tier-0 method's patchpoint call (the runtime enters the OSR
    /// method as if called from there); the Tier-0 method's prologue, read at that address, says
    /// where that frame keeps the real return address and the caller's `rbp`.
    Osr {
        /// Where the OSR method's own return-address slot is.
        slot: OsrSlot,
    },
}

/// Where an OSR method's own return-address slot is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OsrSlot {
    /// At `[sp + n]` (in the prologue, before `rbp` is set).
    Sp(u32),
    /// At `[rbp + n]` (once the frame pointer is set).
    Bp(u32),
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

/// Bytes [`is_deoptimization_handler`] reads at a return address.
pub const DEOPTIMIZATION_HANDLER_BYTES: usize = 13;

/// Whether `code`, read at `at`, is the deoptimization handler HotSpot places after a compiled
/// method's body. To deoptimize a compiled frame that is not the executing one, HotSpot
/// overwrites the return address its callee will return to with the address of that handler,
/// which pushes its own address (the frame's "return address" while it is unpacked) and jumps
/// to the deoptimization blob. So the return address follows no call, by HotSpot's design; the
/// frame is still the compiled method's fixed frame, unwound as at any of its call sites.
///
/// The two forms, each naming its own address (so nothing else matches by chance):
/// - C2: `call next; next: sub qword [rsp], 5; jmp blob` (`e8 00000000 48 832c24 05 e9 …`);
/// - C1: `mov r10, <at>; push r10; jmp blob` (`49 ba <at> 41 52 e9 …`).
pub fn is_deoptimization_handler(at: u64, code: &[u8]) -> bool {
    const C2: [u8; 11] = [0xe8, 0, 0, 0, 0, 0x48, 0x83, 0x2c, 0x24, 0x05, 0xe9];
    if code.starts_with(&C2) {
        return true;
    }
    code.len() >= DEOPTIMIZATION_HANDLER_BYTES
        && code[..2] == [0x49, 0xba]
        && code[2..10] == at.to_le_bytes()
        && code[10..13] == [0x41, 0x52, 0xe9]
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
