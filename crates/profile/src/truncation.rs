//! Truncation reasons: the one vocabulary of `[truncated: reason]` frames.
//!
//! Every way a stack can end before its thread root has one [`TruncateReason`]; a profile records
//! it as one frame of kind [`crate::FrameKind::Truncated`], written only by
//! [`crate::Profile::intern_truncated`] and read back as a type by
//! [`crate::Profile::truncate_reason`] (or [`TruncateReason::parse_frame_name`] for a name alone).
//! Writers spell the frame `[truncated: <reason>]`; readers of text formats turn that spelling back
//! into the reason, so no crate matches the text itself.

use std::fmt;

/// Why a stack ends before its thread root. Each stack that ends this way gets one explicit
/// `[truncated: <reason>]` frame at its root end; nothing is dropped silently.
///
/// The first group is the unwinder's ([`TruncateReason::UNWIND`]); the rest describe input from
/// other producers (a depth cap, a sample without a stack).
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
    /// The producer keeps only this many frames (EventPipe 100, perf 127) and the stack reached
    /// the cap without a base frame repair could find.
    DepthCap(u32),
    /// The input sample came with no stack at all (a pprof sample without locations, a legacy
    /// profile's sample without addresses, an empty stack handed to the agent).
    NoStackInInput,
    /// The input sample names a stack the input never defines (a Chromium `sf` id with no
    /// `stackFrames` entry, a stack id the agent's cache no longer holds).
    StackDefinitionMissing,
    /// A .NET sample whose stack has no managed frame to show (EventPipe gave none).
    NoManagedFrames,
}

impl TruncateReason {
    /// Every reason the unwinder gives, for reporting its counts.
    pub const UNWIND: [TruncateReason; 16] = [
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

    /// The reasons of other producers' input that carry no value.
    const INPUT: [TruncateReason; 3] = [
        TruncateReason::NoStackInInput,
        TruncateReason::StackDefinitionMissing,
        TruncateReason::NoManagedFrames,
    ];

    /// Reasons without a value, named by a fixed word (every reason but [`TruncateReason::DepthCap`]).
    fn named() -> impl Iterator<Item = TruncateReason> {
        TruncateReason::UNWIND
            .into_iter()
            .chain(TruncateReason::INPUT)
    }

    /// The fixed name of a reason without a value; None for [`TruncateReason::DepthCap`].
    fn word(self) -> Option<&'static str> {
        Some(match self {
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
            TruncateReason::NoStackInInput => "no stack in input",
            TruncateReason::StackDefinitionMissing => "stack definition missing",
            TruncateReason::NoManagedFrames => "no managed frames",
            TruncateReason::DepthCap(_) => return None,
        })
    }

    /// The display name of the truncation frame: `[truncated: <reason>]`.
    pub fn frame_name(self) -> String {
        format!("[truncated: {self}]")
    }

    /// Whether `name` is spelled as a truncation frame (`[truncated…`), whether or not its text
    /// is one of these reasons: how readers of formats without frame kinds recognise such frames.
    pub fn is_frame_name(name: &str) -> bool {
        name.starts_with("[truncated")
    }

    /// The reason a `[truncated: <reason>]` frame name spells; None for any other name
    /// (including a `[truncated: …]` text no reason spells).
    pub fn parse_frame_name(name: &str) -> Option<TruncateReason> {
        TruncateReason::parse(name.strip_prefix("[truncated: ")?.strip_suffix(']')?)
    }

    /// The reason whose name (as [`fmt::Display`] writes it) is `text`.
    pub fn parse(text: &str) -> Option<TruncateReason> {
        if let Some(cap) = text.strip_prefix("depth cap ") {
            return cap.parse().ok().map(TruncateReason::DepthCap);
        }
        TruncateReason::named().find(|r| r.word() == Some(text))
    }
}

/// The short name used in the frame (`[truncated: <name>]`) and in `truncated.<name>` counts.
impl fmt::Display for TruncateReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self, self.word()) {
            (_, Some(word)) => f.write_str(word),
            (TruncateReason::DepthCap(cap), None) => write!(f, "depth cap {cap}"),
            (_, None) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_reads_back_from_its_frame_name() {
        let all = TruncateReason::named()
            .chain([TruncateReason::DepthCap(0), TruncateReason::DepthCap(100)]);
        for reason in all {
            assert_eq!(
                TruncateReason::parse_frame_name(&reason.frame_name()),
                Some(reason)
            );
        }
        assert_eq!(
            TruncateReason::named().count(),
            19,
            "every reason without a value"
        );
    }

    #[test]
    fn other_names_are_no_reason() {
        for name in [
            "main",
            "[truncated: something else]",
            "[truncated: depth cap x]",
            "[truncated: live-unproven",
            "truncated: live-unproven]",
        ] {
            assert_eq!(TruncateReason::parse_frame_name(name), None, "{name}");
        }
    }
}
