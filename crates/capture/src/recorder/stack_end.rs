//! How a sample's user stack ends: the one place that turns the unwinder's result, the proofs of
//! live reads and the thread's state into the stack's last frame.

use crate::unwind::{StackEnd, TruncateReason};

/// Where the unwind passed through the watched frame `B` of its thread (see
/// [`super::outer_cache`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Passed {
    /// `B`'s index among the unwound frames.
    pub index: usize,
    /// `B`'s stack pointer was reached as a signal-interrupted instruction, not through a call
    /// that wrote the watched slot: the proof does not apply to it.
    pub by_instruction: bool,
}

/// What is known about a sample's user stack once it has been unwound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StackFacts {
    /// How the unwinder stopped.
    pub unwound: StackEnd,
    /// Frames whose stack pointer lies inside the sample's copied stack.
    pub copy_frames: usize,
    /// The last frame came from live memory read past the copy.
    pub live_frames: bool,
    /// The first live frame that disagreed with the kernel's callchain at the same stack slot.
    pub callchain_mismatch: Option<usize>,
    /// Live memory was read and the thread had exited by then (the reads may be another
    /// thread's reused stack).
    pub thread_exited: bool,
    /// The unwind passed through its thread's watched frame.
    pub passed: Option<Passed>,
    /// Live reads are on and the sample copied some stack, so a stack that outgrew its copy
    /// could be proven later.
    pub provable: bool,
    /// Every word past the copy came from the in-kernel walk, read at the sample's instant:
    /// no frame was read live.
    pub from_kernel: bool,
}

/// How the stack ends, decided by [`stack_end`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ending {
    /// The end to record: a `[truncated: …]` frame, the root, or a stop at a cached outer part.
    pub end: StackEnd,
    /// Keep only this many innermost frames (the rest was read live and is not proven).
    pub keep: Option<usize>,
    /// The frame from which on the proven outer part may be cached (a whole stack read past
    /// its copy through `B`).
    pub cache_outer_from: Option<usize>,
    /// Arm a watch inside the copy so that later samples of the thread can be proven.
    pub arm_watch: bool,
}

impl StackFacts {
    /// The cut the live reads themselves force, before any proof is asked: a thread that exited
    /// keeps only its copy, a callchain mismatch keeps the frames before it.
    pub fn reads_cut(&self) -> Option<(TruncateReason, usize)> {
        if self.thread_exited {
            Some((TruncateReason::ThreadExited, self.copy_frames.max(1)))
        } else {
            self.callchain_mismatch
                .map(|i| (TruncateReason::StackChanged, i))
        }
    }

    /// How the unwinder's walk ended once [`StackFacts::reads_cut`] is applied (what a sample
    /// waiting for a binary's parse is judged by).
    pub fn end_after_reads(&self) -> StackEnd {
        match self.reads_cut() {
            Some((reason, _)) => StackEnd::Truncated(reason),
            None => self.unwound,
        }
    }
}

/// Decides how a sample's user stack ends.
///
/// In order: frames read live from a thread that exited, or disagreeing with the kernel's
/// callchain, are cut; frames past the copy count only when the unwind passed through the
/// thread's watched frame by a call (not as an interrupted instruction) and `watch_holds` (asked
/// only then, after the reads) says the watch is still untouched, else the stack keeps what its
/// copy proves and ends `live-unproven` or `stack-changed`; a stack that outgrew its copy
/// without a proof ends `live-unproven` (and arms a watch) when live reads are on; otherwise the
/// unwinder's own end stands.
pub(crate) fn stack_end(facts: &StackFacts, watch_holds: impl FnOnce() -> bool) -> Ending {
    let cut = |reason, keep| Ending {
        end: StackEnd::Truncated(reason),
        keep: Some(keep),
        cache_outer_from: None,
        arm_watch: false,
    };
    if let Some((reason, keep)) = facts.reads_cut() {
        return cut(reason, keep);
    }
    let beyond_copy = facts.live_frames || facts.unwound == StackEnd::Stopped;
    if let Some(passed) = facts.passed
        && beyond_copy
    {
        if passed.by_instruction {
            return cut(TruncateReason::LiveUnproven, facts.copy_frames.max(1));
        }
        if !watch_holds() {
            // The stack above `B` changed at some point since the watch was armed, perhaps
            // before the live reads.
            return cut(TruncateReason::StackChanged, facts.copy_frames.max(1));
        }
    }
    if facts.provable && facts.unwound == StackEnd::Truncated(TruncateReason::StackCopyExhausted) {
        return Ending {
            end: StackEnd::Truncated(TruncateReason::LiveUnproven),
            keep: None,
            cache_outer_from: None,
            arm_watch: true,
        };
    }
    Ending {
        end: facts.unwound,
        keep: None,
        cache_outer_from: facts
            .passed
            .map(|p| p.index)
            .filter(|_| facts.unwound == StackEnd::Root && facts.live_frames),
        arm_watch: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(unwound: StackEnd) -> StackFacts {
        StackFacts {
            unwound,
            copy_frames: 5,
            live_frames: false,
            callchain_mismatch: None,
            thread_exited: false,
            passed: None,
            provable: true,
            from_kernel: false,
        }
    }

    fn no_watch() -> bool {
        panic!("the watch is asked only for a proven read past the copy")
    }

    #[test]
    fn a_stack_inside_its_copy_keeps_the_unwinders_end() {
        let e = stack_end(&facts(StackEnd::Root), no_watch);
        assert_eq!(e.end, StackEnd::Root);
        assert_eq!(
            (e.keep, e.cache_outer_from, e.arm_watch),
            (None, None, false)
        );
        let f = facts(StackEnd::Truncated(TruncateReason::UnmappedAddress));
        assert_eq!(stack_end(&f, no_watch).end, f.unwound);
    }

    #[test]
    fn an_outgrown_copy_without_proof_is_live_unproven_and_arms_a_watch() {
        let f = facts(StackEnd::Truncated(TruncateReason::StackCopyExhausted));
        let e = stack_end(&f, no_watch);
        assert_eq!(e.end, StackEnd::Truncated(TruncateReason::LiveUnproven));
        assert!(e.arm_watch);
        let f = StackFacts {
            provable: false,
            ..f
        };
        assert_eq!(stack_end(&f, no_watch).end, f.unwound);
    }

    #[test]
    fn a_thread_that_exited_keeps_its_copy_even_after_a_mismatch() {
        let f = StackFacts {
            live_frames: true,
            callchain_mismatch: Some(7),
            thread_exited: true,
            ..facts(StackEnd::Root)
        };
        let e = stack_end(&f, no_watch);
        assert_eq!(e.end, StackEnd::Truncated(TruncateReason::ThreadExited));
        assert_eq!(e.keep, Some(5));
        let f = StackFacts {
            thread_exited: false,
            ..f
        };
        let e = stack_end(&f, no_watch);
        assert_eq!(e.end, StackEnd::Truncated(TruncateReason::StackChanged));
        assert_eq!(e.keep, Some(7));
    }

    #[test]
    fn live_frames_count_only_through_a_call_into_an_untouched_watch() {
        let passed = Passed {
            index: 3,
            by_instruction: false,
        };
        let f = StackFacts {
            live_frames: true,
            passed: Some(passed),
            ..facts(StackEnd::Root)
        };
        let e = stack_end(&f, || true);
        assert_eq!(
            (e.end, e.keep, e.cache_outer_from),
            (StackEnd::Root, None, Some(3))
        );
        let e = stack_end(&f, || false);
        assert_eq!(e.end, StackEnd::Truncated(TruncateReason::StackChanged));
        assert_eq!(e.keep, Some(5));
        let f = StackFacts {
            passed: Some(Passed {
                by_instruction: true,
                ..passed
            }),
            ..f
        };
        let e = stack_end(&f, no_watch);
        assert_eq!(e.end, StackEnd::Truncated(TruncateReason::LiveUnproven));
        assert_eq!(e.keep, Some(5));
    }

    #[test]
    fn an_empty_copy_still_keeps_its_leaf() {
        let f = StackFacts {
            copy_frames: 0,
            thread_exited: true,
            ..facts(StackEnd::Root)
        };
        assert_eq!(stack_end(&f, no_watch).keep, Some(1));
    }
}
