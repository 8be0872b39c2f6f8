//! Truncation policy: every way a stack can end early, its name, and how each unwinder failure
//! maps to one. This is the one place that decides what a `[truncated: reason]` frame says.

/// Why a stack ends before its thread root. Each stack that ends this way gets one explicit
/// `[truncated: <reason>]` frame at its root end; nothing is dropped silently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TruncateReason {
    /// The next read lies past the end of the stack bytes the kernel copied with the sample
    /// (and no live fallback reader could supply it).
    StackCopyExhausted,
    /// The kernel copied no stack bytes at all: the page at the stack pointer was not resident
    /// when the sample was taken (a new thread's first instruction, a stack page being faulted
    /// in), and the interrupt-time copy cannot fault it in.
    StackNotCopied,
    /// A stack read inside the copied range's address space failed (below the sampled SP, or the
    /// fallback reader refused).
    UnreadableStack,
    /// The instruction pointer or a return address lies in no executable mapping.
    UnmappedAddress,
    /// Code without CFI whose frame state cannot be decided from its instructions.
    NoUnwindInfo,
    /// An unwind step did not move the stack pointer strictly upwards.
    SpNotIncreasing,
    /// The frame pointer does not point into the stack above the stack pointer.
    BadFramePointer,
    /// A recovered return address does not follow a call instruction.
    NotAfterCall,
    /// The CFI could not be evaluated (malformed or unsupported expression).
    CfiError,
    /// The CFI needs a register whose value in this frame is unknown (e.g. rbx, after a frame
    /// without CFI that may have changed it), so the caller cannot be found.
    UnwindRuleMissing,
    /// The sample carried no user registers (a kernel thread, or user state unavailable).
    NoUserRegisters,
    /// Reading past the copied stack from the live process would exceed the per-sample byte
    /// budget.
    Budget,
    /// The thread (or its process) exited before its stack could be read past the copy.
    ThreadExited,
    /// The live stack no longer matches the sample's copy at the splice point: the thread moved
    /// on between the copy and the read, so frames beyond the copy cannot be trusted.
    StackChanged,
    /// Frames past the copy would have to come from live memory, but nothing proves that memory
    /// still holds the sampled stack: no write watchpoint on the thread's stack was in place
    /// from before the sample (its first deep sample, or the first after its stack changed).
    LiveUnproven,
    /// The frame lies in a binary the profiler did not load because its memory budget for
    /// binaries (unwind tables and symbols) was full: without its CFI the caller cannot be found.
    ModuleMemoryLimit,
}

impl TruncateReason {
    /// Every reason, for reporting.
    pub const ALL: [TruncateReason; 16] = [
        TruncateReason::StackCopyExhausted,
        TruncateReason::StackNotCopied,
        TruncateReason::UnreadableStack,
        TruncateReason::UnmappedAddress,
        TruncateReason::NoUnwindInfo,
        TruncateReason::SpNotIncreasing,
        TruncateReason::BadFramePointer,
        TruncateReason::NotAfterCall,
        TruncateReason::CfiError,
        TruncateReason::UnwindRuleMissing,
        TruncateReason::NoUserRegisters,
        TruncateReason::Budget,
        TruncateReason::ThreadExited,
        TruncateReason::StackChanged,
        TruncateReason::LiveUnproven,
        TruncateReason::ModuleMemoryLimit,
    ];

    /// The short name used in the frame (`[truncated: <name>]`) and in `truncated.<name>` counts.
    pub fn as_str(self) -> &'static str {
        match self {
            TruncateReason::StackCopyExhausted => "stack-copy-exhausted",
            TruncateReason::StackNotCopied => "stack-not-copied",
            TruncateReason::UnreadableStack => "unreadable-stack",
            TruncateReason::UnmappedAddress => "unmapped-address",
            TruncateReason::NoUnwindInfo => "no-unwind-info",
            TruncateReason::SpNotIncreasing => "sp-not-increasing",
            TruncateReason::BadFramePointer => "bad-frame-pointer",
            TruncateReason::NotAfterCall => "not-after-call",
            TruncateReason::CfiError => "cfi-error",
            TruncateReason::UnwindRuleMissing => "unwind-rule-missing",
            TruncateReason::NoUserRegisters => "no-user-registers",
            TruncateReason::Budget => "budget",
            TruncateReason::ThreadExited => "thread-exited",
            TruncateReason::StackChanged => "stack-changed",
            TruncateReason::LiveUnproven => "live-unproven",
            TruncateReason::ModuleMemoryLimit => "module-memory-limit",
        }
    }

    /// The display name of the truncation frame.
    pub fn frame_name(self) -> String {
        format!("[truncated: {}]", self.as_str())
    }

    /// Maps a framehop failure to a reason. `read_failure` is the last failed stack read's kind,
    /// when the failure was a read.
    pub(crate) fn from_framehop(err: framehop::Error, read_failure: Option<ReadFailure>) -> Self {
        match err {
            framehop::Error::CouldNotReadStack(_) => match read_failure {
                Some(f) => TruncateReason::from_read(f),
                None => TruncateReason::UnreadableStack,
            },
            framehop::Error::FramepointerUnwindingMovedBackwards
            | framehop::Error::DidNotAdvance => TruncateReason::SpNotIncreasing,
            framehop::Error::IntegerOverflow | framehop::Error::ReturnAddressIsNull => {
                TruncateReason::CfiError
            }
        }
    }

    /// The reason for a failed stack read of the given kind.
    pub(crate) fn from_read(read_failure: ReadFailure) -> Self {
        match read_failure {
            ReadFailure::BeyondCopy => TruncateReason::StackCopyExhausted,
            ReadFailure::Unreadable => TruncateReason::UnreadableStack,
            ReadFailure::Budget => TruncateReason::Budget,
            ReadFailure::ThreadExited => TruncateReason::ThreadExited,
            ReadFailure::StackChanged => TruncateReason::StackChanged,
        }
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
    /// ([`super::Memory::on_frame`]): the caller knows the stack from there on.
    Stopped,
}
