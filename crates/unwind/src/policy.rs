//! Truncation policy: every way a stack can end early, its name, and how each unwinder failure
//! maps to one. This is the one place that decides what a `[truncated: reason]` frame says.

pub use rootline_profile::TruncateReason;

/// The reason for a failed stack read of the given kind.
pub(crate) fn reason_for_read(read_failure: ReadFailure) -> TruncateReason {
    match read_failure {
        ReadFailure::BeyondCopy => TruncateReason::StackCopyExhausted,
        ReadFailure::Unreadable => TruncateReason::UnreadableStack,
        ReadFailure::Budget => TruncateReason::Budget,
        ReadFailure::ThreadExited => TruncateReason::ThreadExited,
        ReadFailure::StackChanged => TruncateReason::StackChanged,
    }
}

/// Whether a function is where threads begin (`clone3`/`clone`, and the program's `_start`): a
/// sample whose leaf is in one and cannot be unwound is a new thread's first instructions after
/// the system call (its stack holds nothing above; the function's CFI describes the parent), so
/// the stack ends at its root there instead of being marked truncated. In code without CFI, a
/// zero frame pointer or return address in one of them is the outermost frame.
pub fn is_thread_entry(symbol: &str) -> bool {
    THREAD_ENTRIES.contains(&symbol)
}

/// The symbols of the functions that start threads (see [`is_thread_entry`]).
pub const THREAD_ENTRIES: [&str; 7] = [
    "__clone3",
    "__GI___clone3",
    "clone3",
    "__clone",
    "__GI___clone",
    "clone",
    "_start",
];

/// Whether a function is one V8's deoptimizer makes frames return into: it writes the entry of
/// one of these builtins as the return address of the frame above an interpreter frame it
/// materialized, so that the callee's return re-enters the interpreter at that frame's bytecode.
/// Such a return address does not follow a call, by V8's design; it is accepted at exactly the
/// builtin's first instruction, and the frame it returns into is an interpreter frame (caller at
/// `[rbp+8]`, its `rbp` at `[rbp]`).
pub fn is_interpreter_reentry(symbol: &str) -> bool {
    INTERPRETER_REENTRIES.contains(&symbol)
}

/// The V8 builtins of [`is_interpreter_reentry`], as node's symbol table names them.
pub const INTERPRETER_REENTRIES: [&str; 4] = [
    "Builtins_InterpreterEnterAtBytecode",
    "Builtins_InterpreterEnterAtNextBytecode",
    "Builtins_BaselineOrInterpreterEnterAtBytecode",
    "Builtins_BaselineOrInterpreterEnterAtNextBytecode",
];

/// Why a stack read failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFailure {
    /// Past the end of the copied stack, with no fallback able to read it.
    BeyondCopy,
    /// Below the copy, or refused by the fallback reader.
    Unreadable,
    /// The live reader's per-sample byte budget is spent.
    Budget,
    /// The live reader found the thread gone.
    ThreadExited,
    /// The live reader found the stack changed since the sample's copy.
    StackChanged,
}

/// How an unwound stack ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StackEnd {
    /// The unwinder reached the thread's root: CFI marks the return address undefined, the leaf
    /// is a thread entry, or (code without CFI) the frame-pointer chain or return address ends
    /// in zero in a thread entry or in code whose function start is unknown.
    Root,
    /// The stack ends early, for this reason.
    Truncated(TruncateReason),
    /// The memory's frame observer stopped the unwind at the last frame added
    /// ([`crate::FrameObserver::on_frame`]): the caller knows the stack from there on.
    Stopped,
}
